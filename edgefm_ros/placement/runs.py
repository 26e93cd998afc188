"""One placement's run for a request: what the VLA placement returns and shadow mode logs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PLACEMENTS = ("edge", "cloud")


@dataclass(frozen=True)
class PlacementRun:
    """One placement's run for a request."""

    placement: str  # "edge" | "cloud"
    actions: np.ndarray | None  # float32 (chunk, action_dim); None when the run failed
    latency_s: float  # measured: request start -> chunk (seconds)
    upload_bytes: int = 0  # the images sent (cloud)

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"PlacementRun.placement must be one of {PLACEMENTS}, got {self.placement!r}")

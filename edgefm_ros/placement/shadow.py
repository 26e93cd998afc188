"""Shadow mode of the VLA placement: which requests are shadowed, the noise both placements share, and the
pair of results scored (routing/chunk_quality.py: the router's calibration label) and logged
(shadow_log.py). ``ShadowSink`` is what placement/vla.py needs of it; ``Shadow`` is the one vla_node uses
(vla_build.py makes it from the node's parameters).

For a shadowed request vla_node draws the flow-matching noise itself, serves the chunk as routed (edge
or cloud), publishes it, and only then runs the other placement on the same observation and noise, so
the shadow never delays the served chunk. The cloud's chunk is the reference (the configuration
trusted most): quality(cloud) = 1 and quality(edge) = ``routing.chunk_quality.chunk_quality(edge, cloud,
scale=the checkpoint's action std, tolerance)``. Both results go to the JSONL log that ``edgefm-router
calibrate --log`` reads, with the router decision's features and link state. A request whose cloud run
failed has no reference and is not logged (counted in ``skipped``).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgefm_ros.placement.runs import PLACEMENTS, PlacementRun
from edgefm_ros.placement.shadow_log import ShadowLogger, ShadowResult
from edgefm_ros.routing.chunk_quality import chunk_quality
from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.types import RouteDecision


class ShadowSink(Protocol):
    """What shadow mode needs (``Shadow`` below is one)."""

    skipped: dict  # Counter of requests not logged, by reason

    def wants(self, decision: RouteDecision | None) -> bool: ...

    def noise(self, shape: tuple[int, int]) -> np.ndarray: ...

    def record(self, request_id: str, decision: RouteDecision, served: PlacementRun, other: PlacementRun) -> bool: ...

    def stats(self) -> dict[str, object]: ...  # diagnostics values

    def close(self) -> None: ...


@dataclass(frozen=True)
class ShadowConfig:
    fraction: float  # share of routed requests also run on the other placement, [0, 1]
    log: str  # JSONL path
    tolerance: float = 0.5  # RMS error (in action std units) scoring exp(-1)
    edge_candidate: str = "edge-bf16-512"  # router candidate the edge result is logged as when shadowing
    cloud_candidate: str = "cloud-fp32-512"  # likewise for the cloud

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fraction) and 0.0 <= self.fraction <= 1.0):
            raise ValueError(f"shadow fraction must be in [0, 1], got {self.fraction!r}")
        if self.fraction > 0 and not self.log:
            raise ValueError("shadow mode is on (fraction > 0) but no log path is set")
        if not (math.isfinite(self.tolerance) and self.tolerance > 0):
            raise ValueError(f"shadow tolerance must be > 0, got {self.tolerance!r}")
        for name in ("edge_candidate", "cloud_candidate"):
            if not getattr(self, name):
                raise ValueError(f"shadow {name} is empty: name the router candidate it is logged as")


class Shadow:
    """Samples requests, supplies their shared noise, scores and logs the pair (module docstring)."""

    def __init__(self, cfg: ShadowConfig, scale: np.ndarray, n_cameras: int, seed: int | None = None):
        self.cfg = cfg
        self.scale = np.maximum(np.asarray(scale, dtype=np.float64), 1e-6)  # (action_dim,)
        self.n_cameras = n_cameras
        self.rng = np.random.default_rng(seed)
        self.logger = ShadowLogger(cfg.log)
        self.logged = 0  # requests logged (two lines each)
        self.skipped: Counter[str] = Counter()
        self.last_edge_quality = math.nan

    def wants(self, decision: RouteDecision | None) -> bool:
        """Shadow this request? Only routed ones (the log needs the router's features)."""
        if decision is None or self.cfg.fraction <= 0:
            return False
        if not set(FEATURE_NAMES) <= set(decision.feature_names):
            self.skipped["no_features"] += 1
            return False
        return bool(self.rng.random() < self.cfg.fraction)

    def noise(self, shape: tuple[int, int]) -> np.ndarray:
        """float32 (chunk_size, max_action_dim) standard normal: the same for both placements."""
        return self.rng.standard_normal(shape).astype(np.float32)

    def candidate(self, placement: str, decision: RouteDecision) -> str:
        """The routed candidate for the placement the router chose, else the configured one."""
        if placement == decision.target:
            return decision.candidate
        return self.cfg.edge_candidate if placement == "edge" else self.cfg.cloud_candidate

    def record(self, request_id: str, decision: RouteDecision, served: PlacementRun, other: PlacementRun) -> bool:
        """Score the pair and log two lines; False (and counted) when there is no pair to score."""
        runs = {served.placement: served, other.placement: other}
        if set(runs) != set(PLACEMENTS):
            raise ValueError(f"a shadow pair needs one edge and one cloud run, got {served.placement} and "
                             f"{other.placement}")
        edge, cloud = runs["edge"], runs["cloud"]
        if cloud.actions is None:
            self.skipped["cloud_failed"] += 1
            return False
        if edge.actions is None:
            self.skipped["edge_failed"] += 1
            return False
        q_edge = chunk_quality(edge.actions, cloud.actions, self.scale, self.cfg.tolerance)
        quality = {"edge": q_edge, "cloud": 1.0}
        results = [ShadowResult(self.candidate(r.placement, decision), r.placement, quality[r.placement],
                                r.latency_s, upload_bytes=r.upload_bytes, served=r is served)
                   for r in (served, other)]
        self.logger.log(request_id, decision, results, self.n_cameras)
        self.logged += 1
        self.last_edge_quality = q_edge
        return True

    def stats(self) -> dict[str, object]:
        out: dict[str, object] = {"shadow_logged": self.logged, "shadow_edge_quality_last": self.last_edge_quality}
        out.update({f"shadow_skipped_{k}": n for k, n in sorted(self.skipped.items())})
        return out

    def close(self) -> None:
        self.logger.close()


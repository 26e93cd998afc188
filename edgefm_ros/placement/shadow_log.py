"""Shadow mode's log: both results of a shadowed request appended as JSONL lines in the format that
``edgefm-router calibrate --log`` reads (routing/log.py), with the request's features and link state, so a
robot collects its own calibration data. The quality of each result is routing/chunk_quality.py's."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.routing.log import LogRecord
from edgefm_ros.types import RouteDecision


@dataclass(frozen=True)
class ShadowResult:
    """One configuration's run for a request."""

    candidate: str
    placement: str
    quality: float
    latency_s: float
    energy_j: float = math.nan
    upload_bytes: int = 0
    served: bool = False  # True for the result that went to the robot


class ShadowLogger:
    """Appends both results of shadowed requests to a JSONL log (routing/log.py format)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", buffering=1)  # line buffered: a crash loses at most a line

    def log(self, request_id: str, decision: RouteDecision, results: Sequence[ShadowResult],
            n_cameras: int = 1) -> list[LogRecord]:
        """Write one line per result, with the features and link state of ``decision``."""
        if not results:
            raise ValueError(f"request {request_id!r}: no results to log")
        by_name = dict(zip(decision.feature_names, decision.features))
        missing = [n for n in FEATURE_NAMES if n not in by_name]
        if missing:
            raise ValueError(f"request {request_id!r}: decision lacks features {missing}")
        params = dict(decision.params)
        records = [LogRecord(request_id=str(request_id), candidate=r.candidate,
                             features=tuple(float(by_name[n]) for n in FEATURE_NAMES), quality=float(r.quality),
                             latency_s=float(r.latency_s), energy_j=float(r.energy_j), placement=r.placement,
                             stamp=float(decision.stamp), n_cameras=int(n_cameras),
                             upload_bytes=int(r.upload_bytes), bandwidth_mbps=float(decision.bandwidth_mbps),
                             rtt_s=float(decision.rtt_s), breaker_open=bool(params.get("breaker_open", False)),
                             deadline_s=float(params.get("deadline_s", math.nan)), served=bool(r.served),
                             source="shadow")
                   for r in results]
        for rec in records:
            self._f.write(rec.to_json() + "\n")
        return records

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ShadowLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

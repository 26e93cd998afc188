"""Shadow mode, the library half: the quality of an action chunk and the log of both results.

In shadow mode (vla_node, off by default) a configured fraction of requests also runs on the other
placement; both results are logged with the request's features, in the format ``edgefm-router
calibrate`` reads (routing/log.py), so a robot collects its own calibration data.

Quality of an action chunk. There is no success label at inference time, so quality is agreement
with the chunk of the *reference configuration* (``policy.cloud_only``, by default the first cloud
candidate; pick the configuration you trust most) for the same observation and noise:

    e = sqrt( mean over the first H rows t and joints j of ((a[t, j] - r[t, j]) / s[j])^2 )
    quality = exp(-(e / tolerance)^2)

``s`` is a per-joint scale (use the dataset's action standard deviation, e.g. the unnormaliser's
``std``; default 1, for actions already in comparable units); ``H`` is the horizon actually executed
before the next chunk replaces this one (default: the whole chunk). Identical chunks score 1, an
RMS error of one ``tolerance`` (default 0.5 standard deviations) scores exp(-1) = 0.37, two score
0.02. The reference itself scores 1 by definition. Both chunks must come from the same
observation and the same flow-matching noise, otherwise noise is scored as disagreement.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.routing.log import LogRecord
from edgefm_ros.types import RouteDecision


def chunk_error(actions: np.ndarray, reference: np.ndarray, scale: float | np.ndarray = 1.0,
                horizon: int | None = None) -> float:
    """Normalised RMS error e of the module docstring. actions, reference: (chunk, action_dim)."""
    a, r = np.asarray(actions, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.ndim != 2 or a.shape != r.shape:
        raise ValueError(f"chunk shapes must be equal (chunk, action_dim), got {a.shape} and {r.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(r))):
        raise ValueError("chunks hold non-finite values")
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), (a.shape[1],))
    if not np.all(s > 0):
        raise ValueError(f"scale must be > 0 per joint, got {np.asarray(scale).tolist()}")
    h = a.shape[0] if horizon is None else horizon
    if not 1 <= h <= a.shape[0]:
        raise ValueError(f"horizon must be in [1, {a.shape[0]}], got {horizon}")
    return float(np.sqrt(np.mean(((a[:h] - r[:h]) / s) ** 2)))


def chunk_quality(actions: np.ndarray, reference: np.ndarray, scale: float | np.ndarray = 1.0,
                  tolerance: float = 0.5, horizon: int | None = None) -> float:
    """exp(-(e / tolerance)^2) in (0, 1]: 1 for identical chunks (module docstring)."""
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    return math.exp(-(chunk_error(actions, reference, scale, horizon) / tolerance) ** 2)


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

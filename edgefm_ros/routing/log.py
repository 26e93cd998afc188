"""The request log that calibration and evaluation read (JSON Lines, one candidate result a line).

Each line is one candidate's result for one request; the lines of one request share ``request_id``
(shadow mode writes two: the served placement and the other one)::

    {"request_id": "r42", "stamp": 12.5, "candidate": "edge-bf16-512", "placement": "edge",
     "features": {"blur": 0.21, "exposure": -0.1, ...},     # all 10 FEATURE_NAMES
     "quality": 0.87,          # observed quality in [0, 1]: success (0/1) or a score (shadow.py)
     "latency_s": 0.41, "energy_j": 5.9,                   # measured (energy may be predicted)
     "n_cameras": 1, "upload_bytes": 0,                     # bytes the images took (cloud)
     "bandwidth_mbps": 38.0, "rtt_s": 0.04,                  # link estimate when the request was routed
     "breaker_open": false, "deadline_s": 1.0,
     "served": true, "source": "shadow"}                    # optional provenance

Unknown keys are kept out of the way (ignored); a missing required key or a bad value is a
ValueError naming the line.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Iterable, Sequence

import numpy as np

from edgefm_ros.routing.features import FEATURE_NAMES


@dataclass(frozen=True)
class LogRecord:
    request_id: str
    candidate: str
    features: tuple[float, ...]  # FEATURE_NAMES order
    quality: float
    latency_s: float
    energy_j: float = math.nan
    placement: str = ""
    stamp: float = 0.0
    n_cameras: int = 1
    upload_bytes: int = 0
    bandwidth_mbps: float = math.nan
    rtt_s: float = math.nan
    breaker_open: bool = False
    deadline_s: float = math.nan
    served: bool = True
    source: str = ""
    feature_names: tuple[str, ...] = FEATURE_NAMES  # FEATURE_NAMES, then any extensions (features.feature_names)

    def __post_init__(self) -> None:
        if (len(self.features) != len(self.feature_names) or self.feature_names[:len(FEATURE_NAMES)] != FEATURE_NAMES
                or len(set(self.feature_names)) != len(self.feature_names)):
            raise ValueError(f"LogRecord {self.request_id!r}: {len(self.features)} features named "
                             f"{list(self.feature_names)}, expected {list(FEATURE_NAMES)} and distinct extensions")
        if not all(math.isfinite(x) for x in self.features):
            raise ValueError(f"LogRecord {self.request_id!r}: non-finite features {self.features}")
        if not (math.isfinite(self.quality) and 0.0 <= self.quality <= 1.0):
            raise ValueError(f"LogRecord {self.request_id!r}: quality must be in [0, 1], got {self.quality!r}")
        if not (self.latency_s >= 0):
            raise ValueError(f"LogRecord {self.request_id!r}: latency_s must be >= 0, got {self.latency_s!r}")

    def to_json(self) -> str:
        d = asdict(self)
        del d["feature_names"]
        d["features"] = {n: round(float(v), 6) for n, v in zip(self.feature_names, self.features)}
        return json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()})


def record_from_dict(d: dict, where: str = "") -> LogRecord:
    try:
        feats = d["features"]
        if isinstance(feats, dict):
            missing = [n for n in FEATURE_NAMES if n not in feats]
            if missing:
                raise ValueError(f"features miss {missing}")
            names = FEATURE_NAMES + tuple(str(n) for n in feats if n not in FEATURE_NAMES)
            values = tuple(float(feats[n]) for n in names)
        else:
            given = d.get("feature_names", FEATURE_NAMES)
            by_name = dict(zip(given, feats))
            names = FEATURE_NAMES + tuple(str(n) for n in given if n not in FEATURE_NAMES)
            values = tuple(float(by_name[n]) for n in names)
        kw = {k: d[k] for k in ("stamp", "n_cameras", "upload_bytes", "bandwidth_mbps", "rtt_s", "breaker_open",
                                "deadline_s", "served", "source", "placement", "energy_j") if d.get(k) is not None}
        return LogRecord(request_id=str(d["request_id"]), candidate=str(d["candidate"]), features=values,
                         feature_names=names,
                         quality=float(d["quality"]), latency_s=float(d["latency_s"]), **kw)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"bad log record{' at ' + where if where else ''}: {type(e).__name__}: {e}") from None


def read_log(path: str | Path) -> list[LogRecord]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"log {str(p)!r} does not exist")
    out = []
    with p.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode()
                d = json.loads(line) if line.strip() else None
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
                raise ValueError(f"{p}:{n}: not a JSON line: {e}") from None
            if d is not None:
                out.append(record_from_dict(d, f"{p}:{n}"))
    return out


def write_records(records: Iterable[LogRecord], out: IO[str]) -> int:
    n = 0
    for r in records:
        out.write(r.to_json() + "\n")
        n += 1
    return n


def feature_matrix(records: Sequence[LogRecord], names: Sequence[str] = FEATURE_NAMES) -> np.ndarray:
    """float64 (n, len(names)): each record's features of these names; ValueError naming one it lacks."""
    out = np.empty((len(records), len(names)), dtype=np.float64)
    for i, r in enumerate(records):
        by_name = dict(zip(r.feature_names, r.features))
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(f"log record {r.request_id!r} has no feature(s) {missing}")
        out[i] = [by_name[n] for n in names]
    return out

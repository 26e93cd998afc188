"""Synchronisation on a reference clock: the rules, in numpy.

An episode's ticks are ``start + k / fps`` up to its end. At a tick each stream is sampled at its latest
message at or before the tick (never one after it) and not before the episode's start; the sample must be
at most ``max_age`` old. A tick at which any stream has no such sample is dropped and counted against that
stream. The skew of a stream at a kept tick is the tick minus its sample's time (>= 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NS = 1_000_000_000


def episode_ticks(start_ns: int, end_ns: int, fps: float) -> np.ndarray:
    """int64 ticks start, start + 1/fps, ... <= end (k / fps rounded to the nanosecond, no drift)."""
    if end_ns < start_ns:
        return np.zeros(0, dtype=np.int64)
    n = int(np.floor((end_ns - start_ns) * fps / NS + 1e-9)) + 1
    k = np.arange(n, dtype=np.int64)
    ticks = start_ns + np.round(k * (NS / fps)).astype(np.int64)
    return ticks[ticks <= end_ns]


def sample_latest(times: np.ndarray, ticks: np.ndarray, not_before_ns: int, max_age_ns: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(index of each tick's sample or -1, its age in ns or -1). ``times`` non-decreasing int64.

    Messages with equal times: the last one recorded is the latest."""
    times = np.asarray(times, dtype=np.int64)
    ticks = np.asarray(ticks, dtype=np.int64)
    idx = np.searchsorted(times, ticks, side="right") - 1  # the last message with time <= tick
    ok = idx >= 0
    age = np.where(ok, ticks - times[np.maximum(idx, 0)], -1)
    ok &= times[np.maximum(idx, 0)] >= not_before_ns
    ok &= age <= max_age_ns
    return np.where(ok, idx, -1), np.where(ok, age, -1)


@dataclass
class StreamSkew:
    """Per stream over the kept ticks: skew percentiles and the ticks it made stale."""

    topic: str
    samples: int = 0
    p50_ms: float = float("nan")
    p95_ms: float = float("nan")
    max_ms: float = float("nan")
    stale_ticks: int = 0  # ticks dropped because this stream had no fresh sample (one tick may count for several)

    def as_dict(self) -> dict:
        r = lambda x: None if np.isnan(x) else round(float(x), 3)  # noqa: E731
        return {"topic": self.topic, "samples": self.samples, "skew_p50_ms": r(self.p50_ms),
                "skew_p95_ms": r(self.p95_ms), "skew_max_ms": r(self.max_ms), "stale_ticks": self.stale_ticks}


def skew_summary(topic: str, ages_ns: np.ndarray, stale: int) -> StreamSkew:
    s = StreamSkew(topic, int(len(ages_ns)), stale_ticks=int(stale))
    if len(ages_ns):
        ms = np.asarray(ages_ns, dtype=np.float64) * 1e-6
        s.p50_ms, s.p95_ms, s.max_ms = (float(np.percentile(ms, 50)), float(np.percentile(ms, 95)),
                                        float(ms.max()))
    return s


@dataclass
class SyncResult:
    """One episode: the kept ticks and, per stream, the message index sampled at each kept tick."""

    ticks: np.ndarray  # int64 [T] kept ticks
    index: dict[str, np.ndarray]  # stream name -> int64 [T] message index
    age: dict[str, np.ndarray]  # stream name -> int64 [T] ns
    stale: dict[str, int]  # stream name -> ticks it made stale
    total_ticks: int
    leading: int  # dropped before the first kept tick
    inner: int  # dropped between kept ticks (the dataset's time steps over them)
    trailing: int

    @property
    def dropped(self) -> int:
        return self.total_ticks - len(self.ticks)


def synchronise(streams: dict[str, np.ndarray], max_age_ns: dict[str, int], start_ns: int, end_ns: int,
                fps: float) -> SyncResult:
    """Sample every stream (name -> non-decreasing int64 times) at the episode's ticks (module docstring)."""
    ticks = episode_ticks(start_ns, end_ns, fps)
    idx, age = {}, {}
    keep = np.ones(len(ticks), dtype=bool)
    for name, times in streams.items():
        idx[name], age[name] = sample_latest(times, ticks, start_ns, max_age_ns[name])
        keep &= idx[name] >= 0
    stale = {name: int((idx[name] < 0).sum()) for name in streams}
    kept = np.flatnonzero(keep)
    if len(kept):
        leading, trailing = int(kept[0]), int(len(ticks) - 1 - kept[-1])
    else:
        leading, trailing = len(ticks), 0
    inner = len(ticks) - len(kept) - leading - trailing
    return SyncResult(ticks[keep], {n: i[keep] for n, i in idx.items()}, {n: a[keep] for n, a in age.items()},
                      stale, len(ticks), leading, inner, trailing)

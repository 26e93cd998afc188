"""The action queue: chunk rows resampled onto the control tick grid, merged LeRobot-style.

A chunk's row i is meant for time ``stamp + i * dt`` (stamp = observation time). The control loop runs on
its own grid, tick k at ``origin + k * period``. On arrival a chunk is resampled (linear interpolation in
time) onto the grid ticks it covers; ticks whose time has already passed while the chunk was computed are
skipped: that is the measured latency ``now - stamp``, not a guess. Ticks already queued are merged with the
aggregation function; queued ticks before the chunk's first usable tick are kept (they fill the gap), queued
ticks after its end are dropped (the newer prediction replaces them), as in LeRobot's client.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgefm_ros.control.aggregate import REPLACING, get_aggregate

_EPS = 1e-9


@dataclass(frozen=True)
class TickGrid:
    """Control ticks: tick k is at ``origin + k * period`` seconds."""

    origin: float
    period: float

    def __post_init__(self) -> None:
        if not (self.period > 0 and math.isfinite(self.period)):
            raise ValueError(f"TickGrid.period must be a positive number, got {self.period!r}")
        if not math.isfinite(self.origin):
            raise ValueError(f"TickGrid.origin must be finite, got {self.origin!r}")

    def time(self, k):  # int -> float; int array (m,) -> float64 (m,)
        if np.ndim(k):
            return self.origin + np.asarray(k, dtype=np.float64) * self.period
        return self.origin + k * self.period

    def first_at_or_after(self, t: float) -> int:
        return math.ceil((t - self.origin) / self.period - _EPS)

    def last_at_or_before(self, t: float) -> int:
        return math.floor((t - self.origin) / self.period + _EPS)


@dataclass(frozen=True)
class MergeResult:
    scheduled: int  # grid ticks filled from the chunk
    skipped_rows: int  # chunk rows whose time had passed on arrival
    aggregated: int  # ticks where a queued action was merged with the new one
    dropped: int  # queued ticks beyond the chunk's end, replaced by the newer prediction
    latency_s: float  # now - stamp: observation to arrival, measured
    first_tick: int  # first tick scheduled from the chunk (-1 when none)
    stale: bool = False  # observed before the episode started: dropped whole
    replaced: int = 0  # queued ticks overwritten by the new chunk (the rtc merge)


def resample(actions: np.ndarray, stamp: float, dt: float, times: np.ndarray) -> np.ndarray:
    """Chunk rows (n, d) at ``stamp + i * dt`` linearly interpolated at ``times`` (m,) -> (m, d)."""
    n = actions.shape[0]
    if n == 1:
        return np.repeat(actions, len(times), axis=0)
    r = np.clip((np.asarray(times, dtype=np.float64) - stamp) / dt, 0.0, n - 1)  # (m,) fractional row
    i0 = np.minimum(np.floor(r).astype(np.int64), n - 2)
    w = (r - i0)[:, None]
    return actions[i0] * (1.0 - w) + actions[i0 + 1] * w


class ActionQueue:
    """Pending actions by tick index; not thread-safe (the owner holds a lock)."""

    def __init__(self, grid: TickGrid, aggregate: str = "weighted_average"):
        self.grid = grid
        self._aggregate = get_aggregate(aggregate)
        self._replace = aggregate in REPLACING
        self._slots: dict[int, tuple[np.ndarray, int]] = {}  # tick -> (action (d,) float64, chunk seq)
        self._last_popped = -1

    def __len__(self) -> int:
        return len(self._slots)

    def ticks(self) -> list[int]:
        return sorted(self._slots)

    def clear(self) -> None:
        self._slots.clear()

    def merge(self, actions: np.ndarray, stamp: float, dt: float, now: float, seq: int = 0) -> MergeResult:
        """Merge a chunk (n, d) whose row i is for ``stamp + i * dt``; ``now`` is the arrival time."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] == 0:
            raise ValueError(f"chunk actions must be (n >= 1, action_dim), got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError("chunk actions hold non-finite values")
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"chunk dt must be a positive number, got {dt!r}")
        n = a.shape[0]
        first = max(self._last_popped + 1, self.grid.first_at_or_after(now), self.grid.first_at_or_after(stamp))
        last = self.grid.last_at_or_before(stamp + (n - 1) * dt)
        latency = now - stamp
        if first > last:  # the whole chunk lies in the past: keep what is queued
            return MergeResult(0, n, 0, 0, latency, -1)
        skipped = min(n, max(0, math.ceil((self.grid.time(first) - stamp) / dt - _EPS)))
        ks = np.arange(first, last + 1)
        values = resample(a, stamp, dt, self.grid.time(ks))  # (m, d)
        merged: dict[int, tuple[np.ndarray, int]] = {k: v for k, v in self._slots.items() if k < first}
        aggregated = replaced = 0
        for k, v in zip(ks.tolist(), values):
            old = self._slots.get(k)
            if old is not None and self._replace:
                replaced += 1
            elif old is not None and old[0].shape == v.shape:
                v = self._aggregate(old[0], v)
                aggregated += 1
            merged[k] = (v, seq)
        dropped = sum(1 for k in self._slots if k > last)
        self._slots = merged
        return MergeResult(len(ks), skipped, aggregated, dropped, latency, first, replaced=replaced)

    def pop(self, tick: int) -> tuple[np.ndarray, int] | None:
        """The action for ``tick`` (and its chunk seq), or None; ticks before it are discarded."""
        for k in [k for k in self._slots if k < tick]:
            del self._slots[k]
        self._last_popped = max(self._last_popped, tick)
        return self._slots.pop(tick, None)

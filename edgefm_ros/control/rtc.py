"""What a real-time-chunking request carries: the previous chunk's actions still ahead, and the delay.

    plan = ChunkContinuation(DelayEstimator(DelayConfig(), period), max_rows=50)
    req = plan.request(obs_stamp, dt)    # None before the first chunk or when the last one has run out
    chunk = engine.predict(obs, rtc_prefix=req.prefix, rtc_delay=req.delay)
    plan.sent(chunk); plan.measured(now - obs_stamp)

With ``aggregate: rtc`` the action queue holds the last chunk from its first unexecuted tick on, so the
actions executed from ``obs_stamp`` on are that chunk's rows resampled at ``obs_stamp + i * dt`` (the rows
of the new chunk). The first ``delay`` of them run while the new chunk is computed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefm_ros.control.delay import DelayEstimator
from edgefm_ros.control.queue import resample

_EPS = 1e-9


@dataclass(frozen=True)
class RtcRequest:
    prefix: np.ndarray  # (n, action_dim) f32 raw units: rows at obs_stamp + i * dt, i < n
    delay: int  # control ticks executed while the new chunk is computed


def continuation(actions: np.ndarray, stamp: float, dt: float, new_stamp: float, new_dt: float,
                 max_rows: int) -> np.ndarray | None:
    """A chunk (n, d) with rows at ``stamp + i * dt`` resampled at ``new_stamp + j * new_dt`` for the j whose
    time lies within the chunk (j < max_rows) -> (m, d) f32, or None when none does."""
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0:
        raise ValueError(f"chunk actions must be (n >= 1, action_dim), got shape {a.shape}")
    end = stamp + (a.shape[0] - 1) * dt
    j = np.arange(max_rows)
    times = new_stamp + j * new_dt
    keep = (times >= stamp - _EPS) & (times <= end + _EPS)
    if not keep.any():
        return None
    # rows before the old chunk's start (new_stamp < stamp) are not the old chunk's to give
    first = int(np.argmax(keep))
    if first:
        return None
    m = int(keep.sum())
    return resample(a, stamp, dt, times[:m]).astype(np.float32)


class ChunkContinuation:
    """The producer's side (vla_node): the last chunk it published and the delay estimate."""

    def __init__(self, delay: DelayEstimator, max_rows: int):
        if max_rows < 1:
            raise ValueError(f"ChunkContinuation.max_rows must be >= 1, got {max_rows}")
        self.delay, self.max_rows = delay, max_rows
        self._last: tuple[np.ndarray, float, float] | None = None  # (actions, stamp, dt)

    def sent(self, actions: np.ndarray, stamp: float, dt: float) -> None:
        self._last = (np.asarray(actions, dtype=np.float32).copy(), float(stamp), float(dt))

    def measured(self, latency_s: float) -> None:
        self.delay.add(latency_s)

    def reset(self) -> None:
        """A new episode: the old chunk is not continued (the delay statistics stay)."""
        self._last = None

    def request(self, stamp: float, dt: float) -> RtcRequest | None:
        if self._last is None:
            return None
        prefix = continuation(*self._last, stamp, dt, self.max_rows)
        if prefix is None:
            return None
        return RtcRequest(prefix, self.delay.ticks())

"""Inference delay in control ticks, for real-time chunking: a high percentile of recent latencies.

    est = DelayEstimator(DelayConfig(percentile=90, window=20, warmup=1), period=1 / 30)
    est.add(latency_s)          # observation stamp -> chunk published, per chunk
    d = est.ticks()             # ticks the robot keeps executing the old chunk while the next is computed

LeRobot's RTC takes the all-time maximum latency, so one cold-start spike (first call: allocation, kernel
packing, page faults) sets the delay for good (lerobot#2541). Here the first ``warmup`` samples are left
out once later ones exist, and only the last ``window`` count, so a spike ages out after ``window`` chunks.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

_EPS = 1e-9


@dataclass(frozen=True)
class DelayConfig:
    percentile: float = 90.0  # of the windowed latencies, in (0, 100]
    window: int = 20  # latest samples the estimate reads
    warmup: int = 1  # first samples (cold start) left out once later ones exist
    max_ticks: int = 50  # the estimate is capped here (the chunk length is a natural cap)

    def __post_init__(self) -> None:
        if not (isinstance(self.percentile, (int, float)) and 0.0 < self.percentile <= 100.0):
            raise ValueError(f"DelayConfig.percentile must be in (0, 100], got {self.percentile!r}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"DelayConfig.window must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"DelayConfig.warmup must be an integer >= 0, got {self.warmup!r}")
        if not isinstance(self.max_ticks, int) or self.max_ticks < 0:
            raise ValueError(f"DelayConfig.max_ticks must be an integer >= 0, got {self.max_ticks!r}")


def latency_ticks(latency_s: float, period: float) -> int:
    """Control ticks that pass during ``latency_s``: ceil(latency / period), 0 for no latency."""
    if not math.isfinite(latency_s) or latency_s <= 0:
        return 0
    return max(0, math.ceil(latency_s / period - _EPS))


class DelayEstimator:
    """Not thread-safe: the caller serialises add() and ticks() (vla_node's compute thread does both)."""

    def __init__(self, config: DelayConfig, period: float):
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(f"DelayEstimator.period must be a positive number, got {period!r}")
        self.config, self.period = config, period
        self._cold: list[float] = []  # the first `warmup` samples
        self._recent: deque[float] = deque(maxlen=config.window)
        self.count = 0  # finite samples ever added

    def add(self, latency_s: float) -> None:
        """One measured latency in seconds; non-finite or negative values are ignored."""
        if not (math.isfinite(latency_s) and latency_s >= 0):
            return
        self.count += 1
        if len(self._cold) < self.config.warmup:
            self._cold.append(float(latency_s))
        else:
            self._recent.append(float(latency_s))

    def reset(self) -> None:
        self._cold.clear()
        self._recent.clear()
        self.count = 0

    def latency_s(self) -> float:
        """The percentile of the window (the cold-start samples while there is nothing else); NaN when empty."""
        values = self._recent or self._cold
        if not values:
            return float("nan")
        return float(np.percentile(np.fromiter(values, float), self.config.percentile))

    def ticks(self) -> int:
        """The delay d in control ticks (0 before any sample), capped at ``max_ticks``."""
        return min(latency_ticks(self.latency_s(), self.period), self.config.max_ticks)

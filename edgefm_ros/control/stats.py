"""Rolling statistics: latency percentiles and control-tick timing (rate, period error, missed ticks)."""
from __future__ import annotations

import math
from collections import deque

import numpy as np


class RollingStats:
    """The last ``window`` samples of one quantity; percentiles on demand."""

    def __init__(self, window: int = 500):
        if window < 1:
            raise ValueError(f"RollingStats.window must be >= 1, got {window}")
        self._values: deque[float] = deque(maxlen=window)
        self.count = 0  # samples ever added

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._values.append(float(value))
            self.count += 1

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.fromiter(self._values, float), q)) if self._values else float("nan")

    def summary(self, prefix: str, scale: float = 1.0) -> dict[str, float]:
        """{prefix_p50, prefix_p99, prefix_max} scaled (e.g. 1e3 for ms); NaN when empty."""
        if not self._values:
            return {f"{prefix}_p50": float("nan"), f"{prefix}_p99": float("nan"), f"{prefix}_max": float("nan")}
        v = np.fromiter(self._values, float) * scale
        p50, p99 = np.percentile(v, [50, 99])
        return {f"{prefix}_p50": float(p50), f"{prefix}_p99": float(p99), f"{prefix}_max": float(v.max())}


class TickStats:
    """Timing of a periodic loop from the times its ticks actually ran (monotonic seconds)."""

    def __init__(self, period: float, window: int = 3000):
        if not period > 0:
            raise ValueError(f"TickStats.period must be > 0, got {period}")
        self.period = period
        self._times: deque[float] = deque(maxlen=window)
        self.errors = RollingStats(window)  # |actual period - nominal| seconds
        self.lateness = RollingStats(window)  # actual - deadline seconds
        self.ticks = 0
        self.missed = 0  # deadlines skipped because the loop ran more than a period late

    def record(self, t: float, deadline: float | None = None, missed: int = 0) -> None:
        if self._times:
            self.errors.add(abs(t - self._times[-1] - self.period))
        if deadline is not None:
            self.lateness.add(t - deadline)
        self._times.append(t)
        self.ticks += 1
        self.missed += missed

    def rate_hz(self) -> float:
        """Achieved rate over the window (NaN with fewer than two ticks)."""
        if len(self._times) < 2 or self._times[-1] <= self._times[0]:
            return float("nan")
        return (len(self._times) - 1) / (self._times[-1] - self._times[0])

    def summary(self) -> dict[str, float]:
        out = {"rate_hz": self.rate_hz(), "ticks": float(self.ticks), "missed_ticks": float(self.missed)}
        out.update(self.errors.summary("period_error_ms", 1e3))
        out.update(self.lateness.summary("lateness_ms", 1e3))
        return out


def period_errors(times: np.ndarray, period: float) -> np.ndarray:
    """|diff(times) - period| for a sorted sequence of tick times (seconds) -> (n-1,)."""
    t = np.asarray(times, dtype=np.float64)
    return np.abs(np.diff(t) - period)

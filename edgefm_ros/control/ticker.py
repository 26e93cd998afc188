"""A periodic loop on absolute deadlines: tick k is due at ``start + k * period`` (monotonic clock).

Sleeping to an absolute deadline (not ``sleep(period)``) keeps the rate exact on average; a loop that falls
more than a period behind skips the deadlines it missed (counted) instead of bursting to catch up.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Tick:
    index: int  # tick number since start
    deadline: float  # when it was due (monotonic seconds)
    woke: float  # when the loop actually woke (monotonic seconds)
    missed: int  # deadlines skipped just before this one


class Ticker:
    def __init__(self, period: float, spin_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(f"Ticker.period must be a positive number, got {period!r}")
        if not 0.0 <= spin_s < period:
            raise ValueError(f"Ticker.spin_s must be in [0, period), got {spin_s!r}")
        self.period = period
        self.spin_s = spin_s  # busy-wait this long before each deadline (0: plain sleep)
        self._clock = clock
        self.start = clock()
        self._next = 0

    def wait(self, stop: threading.Event | None = None) -> Tick | None:
        """Sleep until the next deadline; None when ``stop`` was set meanwhile."""
        deadline = self.start + self._next * self.period
        now = self._clock()
        missed = 0
        if now - deadline >= self.period:  # fell behind: jump to the current deadline
            missed = int((now - deadline) // self.period)
            self._next += missed
            deadline += missed * self.period
        remaining = deadline - now - self.spin_s
        if remaining > 0:
            if stop is not None:
                if stop.wait(remaining):
                    return None
            else:
                time.sleep(remaining)
        while self._clock() < deadline:  # spin the last spin_s (or the sleep's early return)
            pass
        if stop is not None and stop.is_set():
            return None
        tick = Tick(self._next, deadline, self._clock(), missed)
        self._next += 1
        return tick

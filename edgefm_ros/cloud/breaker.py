"""Circuit breaker for the cloud client: stop calling a server that keeps failing, probe it later.

closed --(failures consecutive failures)--> open --(cooldown_s later, one call allowed)--> half_open
half_open --success--> closed;  half_open --failure--> open (cool-down starts again)
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 3  # consecutive failed calls that open the breaker
    cooldown_s: float = 5.0  # open this long before one probe call is let through

    def __post_init__(self) -> None:
        if not (isinstance(self.failures, int) and self.failures >= 1):
            raise ValueError(f"BreakerConfig.failures must be an int >= 1, got {self.failures!r}")
        if not (math.isfinite(self.cooldown_s) and self.cooldown_s > 0):
            raise ValueError(f"BreakerConfig.cooldown_s must be a positive number, got {self.cooldown_s!r}")


class CircuitBreaker:
    def __init__(self, cfg: BreakerConfig = BreakerConfig()):
        self.cfg = cfg
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._opened_at = -math.inf
        self.opened = 0  # times it opened
        self.closed_again = 0  # times a probe closed it

    def state(self, now: float) -> str:
        with self._lock:
            if self._state == OPEN and now - self._opened_at >= self.cfg.cooldown_s:
                return HALF_OPEN  # the next allow() lets a probe through
            return self._state

    def allow(self, now: float) -> bool:
        """May a call start now? In half-open exactly one call (the probe) is let through."""
        with self._lock:
            if self._state == CLOSED:
                return True
            if self._state == OPEN and now - self._opened_at >= self.cfg.cooldown_s:
                self._state = HALF_OPEN
                return True
            return False  # open, or half-open with the probe in flight

    def record_success(self) -> None:
        with self._lock:
            if self._state != CLOSED:
                self.closed_again += 1
            self._state, self._failures = CLOSED, 0

    def record_failure(self, now: float) -> None:
        with self._lock:
            self._failures += 1
            if self._state == HALF_OPEN or (self._state == CLOSED and self._failures >= self.cfg.failures):
                self._state, self._opened_at = OPEN, now
                self.opened += 1

"""The simulated robot's loop on the wall clock (sim_node's physics thread, no ROS): an update every ``period`` on
an absolute grid (a loop more than a tick behind skips to the grid; the next update's physics catches up), a
camera frame every ``camera_period`` (one that fell behind is not burst out: the next comes on time), and the
gaps between loop starts measured.

    pacer = Pacer(1 / 100, 1 / 30, gaps_ms=RollingStats())
    while running:
        t = pacer.begin()              # paused meanwhile? pacer.restart() first
        ... physics update ...
        if pacer.camera_due(t):
            ... render, publish ...
            pacer.camera_sent(t)
        pacer.wait(stop)               # until the next tick (or ``stop`` set)
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

from edgefm_ros.control.stats import RollingStats


class Pacer:
    def __init__(self, period: float, camera_period: float, gaps_ms: RollingStats | None = None,
                 clock: Callable[[], float] = time.monotonic):
        for name, v in (("period", period), ("camera_period", camera_period)):
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"Pacer.{name} must be a positive number of seconds, got {v!r}")
        self.period, self.camera_period, self._clock = period, camera_period, clock
        self.gaps_ms = gaps_ms if gaps_ms is not None else RollingStats()  # between loop starts
        self.restart()

    def restart(self) -> None:
        """The grid starts now (after a pause: no catching up on the ticks it missed, no gap measured)."""
        self.next_tick = self.next_camera = self._clock()
        self._last = math.nan

    def begin(self) -> float:
        """A loop starts: its time (clock seconds), the gap since the previous one measured."""
        t = self._clock()
        if not math.isnan(self._last):
            self.gaps_ms.add((t - self._last) * 1e3)
        self._last = t
        return t

    def camera_due(self, t: float) -> bool:
        return t >= self.next_camera

    def camera_sent(self, t: float) -> None:
        """The frame due at the loop that began at ``t`` went out: the next is one camera period later, or one
        period from ``t`` when the schedule fell behind."""
        self.next_camera += self.camera_period
        if self.next_camera < t:
            self.next_camera = t + self.camera_period

    def wait(self, stop: threading.Event) -> None:
        """Sleep until the next tick (returns early when ``stop`` is set); more than a tick behind: the grid
        skips the ticks missed."""
        self.next_tick += self.period
        delay = self.next_tick - self._clock()
        if delay > 0:
            stop.wait(delay)
        elif delay < -self.period:
            self.next_tick += math.floor(-delay / self.period) * self.period

"""What the control loop commands each tick: the queued action, else the last commanded position (hold)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefm_ros.control.queue import ActionQueue


@dataclass(frozen=True)
class Command:
    positions: np.ndarray | None  # float64 (d,), None before anything was ever commanded
    holding: bool  # True when repeating the last commanded position (queue empty or inactive)
    seq: int  # sequence of the chunk the action came from (-1 when holding)


class Commander:
    """Pops one action per tick; on an empty queue holds the last commanded position and counts an underrun."""

    def __init__(self, queue: ActionQueue):
        self.queue = queue
        self.last: np.ndarray | None = None
        self.underruns = 0  # empty ticks after the first action was commanded
        self.waiting_ticks = 0  # empty ticks before any action (warm-up)

    def step(self, tick: int) -> Command:
        item = self.queue.pop(tick)
        if item is not None:
            self.last = item[0]
            return Command(item[0], False, item[1])
        if self.last is None:
            self.waiting_ticks += 1
        else:
            self.underruns += 1
        return Command(self.last, True, -1)

    def hold(self) -> Command:
        """The safe-stop command (deactivate): drop what is queued, repeat the last position."""
        self.queue.clear()
        return Command(self.last, True, -1)

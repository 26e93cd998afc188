"""Real-time scheduling of one thread (SCHED_FIFO) and the way back to what it had before, and stopping a
node's own thread within a bound. Linux: the sched_* calls take a native thread id as their pid."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Scheduling:
    tid: int  # native thread id (threading.get_native_id())
    policy: int  # os.SCHED_OTHER, os.SCHED_FIFO, ...
    priority: int  # static priority (0 for the non-real-time policies)


def scheduling_of(tid: int) -> Scheduling:
    """The current policy and priority of thread ``tid``."""
    return Scheduling(tid, os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)


class FifoScope:
    """SCHED_FIFO applied to one thread, and that thread's scheduling before it, to put back.

    ``apply`` changes the calling thread and keeps what it had; ``restore`` (from any thread: a lifecycle
    transition may run on another thread than the one that activated) puts it back. ``previous`` is None
    while nothing is applied (never applied, not permitted, or restored)."""

    def __init__(self) -> None:
        self.previous: Scheduling | None = None
        self.applied: Scheduling | None = None

    def apply(self, priority: int) -> Scheduling:
        """SCHED_FIFO at ``priority`` for the calling thread; returns its scheduling before. OSError when not
        permitted (no CAP_SYS_NICE, RLIMIT_RTPRIO): nothing changed, nothing recorded."""
        if not 1 <= priority <= 99:
            raise ValueError(f"SCHED_FIFO priority must be in [1, 99], got {priority!r}")
        tid = threading.get_native_id()
        if self.previous is not None and self.previous.tid != tid:
            raise RuntimeError(f"SCHED_FIFO already applied to thread {self.previous.tid}: restore it first")
        before = self.previous or scheduling_of(tid)
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
        self.previous, self.applied = before, Scheduling(tid, os.SCHED_FIFO, priority)
        return before

    def apply_or_warn(self, priority: int, log, what: str) -> bool:
        """``apply`` for a node's thread; where SCHED_FIFO is not permitted, a warning on ``log`` naming
        ``what`` (the control thread, the executor thread ...) and False: the thread keeps normal scheduling."""
        try:
            self.apply(priority)
            return True
        except OSError as e:
            log.warning(f"realtime priority {priority} not applied to the {what}: {e}")
            return False

    def restore(self) -> Scheduling | None:
        """Put back the scheduling ``apply`` replaced; returns it (None when nothing was applied). A thread
        that has ended needs nothing; any other OSError is raised and the record kept (to retry)."""
        prev = self.previous
        if prev is None:
            return None
        try:
            os.sched_setscheduler(prev.tid, prev.policy, os.sched_param(prev.priority))
        except ProcessLookupError:  # the thread is gone, and its scheduling with it
            pass
        self.previous = None
        return prev


def join_within(thread: threading.Thread, timeout_s: float, on_slow: Callable[[float], None] | None = None,
                slice_s: float = 1.0) -> bool:
    """Join ``thread`` (already told to stop) for up to ``timeout_s``; ``on_slow(elapsed)`` is called once
    per slice while it still runs. True once it has ended."""
    t0 = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - t0)
        thread.join(timeout=max(0.0, min(slice_s, left)))
        if not thread.is_alive():
            return True
        if left <= slice_s:
            return False
        if on_slow is not None:
            on_slow(time.monotonic() - t0)


def join_or_report(thread: threading.Thread, timeout_s: float, log, what: str) -> bool:
    """``join_within`` with a node's error lines: one each second ``what`` still runs after the stop, and one
    at the bound. True once it has ended."""
    if join_within(thread, timeout_s, lambda s: log.error(f"the {what} is still running {s:.1f} s after the stop")):
        return True
    log.error(f"the {what} did not stop within {timeout_s:g} s")
    return False

"""The worker thread of a lifecycle node that owns a model: activate starts it, deactivate / cleanup /
shutdown stop it. Callbacks only queue requests; the worker serves them one at a time, off the executor.

    self._worker = Worker("inference", inbox, self._serve, idle=None, poll_s=0.2).start()   # on_activate
    self._worker.stop(join_timeout_s=10.0); self._worker = None                             # on_deactivate

``inbox``: anything with ``take(timeout) -> item | None``, ``close()`` and ``closed`` (control.slot.LatestSlot:
only the newest request counts; RequestQueue: requests in order, the oldest dropped when full). ``stop``
closes it: a node that keeps its inbox across activations reopens it before starting a new worker.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class RequestQueue(Generic[T]):
    """Pending requests, oldest first; at most ``maxlen`` (a new one drops the oldest, counted in ``dropped``)."""

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError(f"RequestQueue maxlen must be >= 1, got {maxlen!r}")
        self._cond = threading.Condition()
        self._items: deque = deque(maxlen=maxlen)
        self._closed = False
        self.dropped = 0

    def put(self, item: T) -> None:
        with self._cond:
            if len(self._items) == self._items.maxlen:
                self.dropped += 1
            self._items.append(item)
            self._cond.notify()

    def take(self, timeout: float | None = None) -> T | None:
        """The oldest request; None on timeout or once closed (requests stay queued while closed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._closed, timeout)
            return None if self._closed or not self._items else self._items.popleft()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)


class Worker:
    """One daemon thread: ``handle(item)`` for each request ``inbox`` hands out, ``idle()`` after a wait
    of ``poll_s`` that brought none, until ``stop()``. ``handle`` catches its own errors."""

    def __init__(self, name: str, inbox, handle: Callable[[object], None], idle: Callable[[], None] | None = None,
                 poll_s: float = 0.2) -> None:
        self.inbox, self.handle, self.idle, self.poll_s = inbox, handle, idle, poll_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Worker":
        self._thread.start()
        return self

    def stop(self, join_timeout_s: float) -> None:
        """Closes the inbox (wakes the thread) and waits for the request in hand to finish."""
        self.inbox.close()
        self._thread.join(timeout=join_timeout_s)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self.inbox.take(timeout=self.poll_s)
            if item is not None:
                self.handle(item)
            elif self.inbox.closed:
                return
            elif self.idle is not None:
                self.idle()

"""A one-slot buffer: the producer overwrites, the consumer takes the latest (older items are dropped)."""
from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class LatestSlot(Generic[T]):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._item: T | None = None
        self._closed = False
        self.overwritten = 0  # items replaced before anyone took them

    def put(self, item: T) -> None:
        with self._cond:
            if self._item is not None:
                self.overwritten += 1
            self._item = item
            self._cond.notify()

    def take(self, timeout: float | None = None) -> T | None:
        """The latest item (and empty the slot); None on timeout or once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._item is not None or self._closed, timeout)
            item, self._item = self._item, None
            return None if self._closed else item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

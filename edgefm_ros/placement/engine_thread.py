"""The one thread the edge engine is built, warmed up and run on.

torch's OpenMP pool belongs to the thread that calls it, and a second pool (another thread's) throttles both to
sleeping between parallel regions on 2 cores: a chunk built and warmed up on one thread and run on another took
1.1-1.4 s, on one thread 0.9 s. So every call into the engine goes through ``run``.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class EngineThread:
    def __init__(self, name: str = "vla-model"):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` on the engine thread, waited for; its exception re-raised here."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """No further calls; one queued is cancelled, the one running ends on its own (not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

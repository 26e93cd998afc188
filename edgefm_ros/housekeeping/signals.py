"""SIGTERM as a clean exit for the tools that start node processes (the demo, ``edgefm-sim eval --exec ros``).

Python's default action for SIGTERM ends the process on the spot: its ``with`` blocks never stop the node
processes it started nor close its own DDS participant. ``sigterm_exits()`` makes SIGTERM raise SystemExit
in the main thread instead (as Ctrl-C raises KeyboardInterrupt), so the same clean-up runs on both.

    with sigterm_exits():
        ...   # start nodes, run, stop them
"""
from __future__ import annotations

import contextlib
import signal
import threading

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


def _raise_exit(signum, frame):
    raise SystemExit(SIGTERM_EXIT_CODE)


@contextlib.contextmanager
def sigterm_exits():
    """Within the block SIGTERM raises SystemExit(143) in the main thread; the previous handler is restored
    after it. Elsewhere than the main thread (signals cannot be handled there) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

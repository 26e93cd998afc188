"""Progress of a long conversion as lines: 'stage: done/total (pct) rate/s ETA', at most one a second per
stage, and always the last."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressPrinter:
    def __init__(self, out: TextIO = sys.stderr, every_s: float = 1.0):
        self.out, self.every_s = out, every_s
        self._start: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        t0 = self._start.setdefault(stage, now)
        final = total > 0 and done >= total
        if not final and now - self._last.get(stage, -1e9) < self.every_s:
            return
        self._last[stage] = now
        elapsed = now - t0
        rate = done / elapsed if elapsed > 0.1 else 0.0
        pct = f" ({100.0 * done / total:.0f}%)" if total else ""
        speed = f", {rate:.0f}/s" if rate > 0 else ""
        eta = f", ETA {max(total - done, 0) / rate:.0f}s" if total and rate > 0 and not final else ""
        self.out.write(f"{stage}: {done}/{total}{pct}{speed}{eta}\n")
        self.out.flush()

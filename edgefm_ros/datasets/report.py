"""What a conversion did: per bag the episode cue, the episodes, and per stream the skew (p50/p95/max of
tick minus sample time) and the ticks it made stale; dropped ticks (leading, inner, trailing). Printed as
lines and written as JSON (meta/conversion_report.json): no wall-clock times in it, so that converting the
same bags twice writes the same bytes."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .mapping import ACTION_KEY as ACTION
from .mapping import STATE_KEY as STATE
from .sync import skew_summary


def stream_report(plan, mapping) -> dict:
    """The report of one planned bag (convert.BagPlan)."""
    topics = {STATE: mapping.state.topic, ACTION: mapping.action.topic}
    topics.update({c.key: c.topic for c in mapping.cameras})
    eps = plan.episodes
    streams = {}
    for name, topic in topics.items():
        ages = np.concatenate([e.sync.age[name] for e in eps]) if eps else np.zeros(0, np.int64)
        stale = sum(e.sync.stale[name] for e in eps)
        streams[name] = skew_summary(topic, ages, stale).as_dict()
    return {
        "bag": plan.scan.path, "storage": plan.scan.storage, "split_by": plan.cue,
        "episodes": len(eps), "frames": int(sum(len(e.sync.ticks) for e in eps)),
        "ticks": int(sum(e.sync.total_ticks for e in eps)),
        "dropped": {"total": int(sum(e.sync.dropped for e in eps)), "leading": int(sum(e.sync.leading for e in eps)),
                    "inner": int(sum(e.sync.inner for e in eps)), "trailing": int(sum(e.sync.trailing for e in eps))},
        "skipped_short": plan.skipped,
        "streams": streams,
        "episode_list": [{"task": e.span.task, "outcome": e.span.outcome or "unknown", "frames": len(e.sync.ticks),
                          "start_ns": e.span.start_ns, "end_ns": e.span.end_ns, "dropped": e.sync.dropped}
                         for e in eps],
    }


@dataclass
class ConversionReport:
    fps: int
    chunk_size: int
    mapping: dict
    cameras: str
    bags: list[dict] = field(default_factory=list)
    episodes: int = 0
    frames: int = 0
    tasks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"fps": self.fps, "chunk_size": self.chunk_size, "cameras": self.cameras, "episodes": self.episodes,
                "frames": self.frames, "tasks": self.tasks, "bags": self.bags, "mapping": self.mapping}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")

    def lines(self) -> list[str]:
        out = [f"{self.episodes} episodes, {self.frames} frames at {self.fps} fps, {len(self.tasks)} task(s); "
               f"cameras as {self.cameras}"]
        for b in self.bags:
            d = b["dropped"]
            out.append(f"{b['bag']} ({b['storage']}): {b['episodes']} episodes split by {b['split_by']}; "
                       f"{b['frames']} of {b['ticks']} ticks kept, {d['total']} dropped (leading {d['leading']}, "
                       f"inner {d['inner']}, trailing {d['trailing']})"
                       + (f"; {len(b['skipped_short'])} short episode(s) left out" if b["skipped_short"] else ""))
            for name, s in b["streams"].items():
                out.append(f"  {name:32s} {s['topic']:28s} skew p50 {_ms(s['skew_p50_ms'])} p95 "
                           f"{_ms(s['skew_p95_ms'])} max {_ms(s['skew_max_ms'])}; stale ticks {s['stale_ticks']}")
        return out


def _ms(x) -> str:
    return "   -   " if x is None else f"{x:6.1f} ms"

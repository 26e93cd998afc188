"""Where episodes begin and end in a bag, from the best cue it has:

1. ``events``: episode events (std_msgs/String JSON, as sim_node publishes them): ``start`` opens an episode,
   ``success`` / ``timeout`` / ``reset`` closes it (an episode still open at the bag's end ends there,
   unfinished); the event's ``t`` is its time where the clock is the header's, else its receive time;
2. ``instruction``: each change of the instruction text opens an episode that lasts until the next change
   (or the data's end); a pause in the state stream longer than ``gap_s`` also ends one;
3. ``gaps``: pauses in the state stream longer than ``gap_s`` (no cue at all: one episode).

The task text is the event's instruction, else the latest instruction at or before the start, else the
mapping's ``task``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .bagread import BagScan, Stream
from .errors import RecordingError

END_EVENTS = ("success", "timeout", "reset")


@dataclass(frozen=True)
class EpisodeSpan:
    start_ns: int
    end_ns: int
    task: str  # instruction text
    cue: str  # events | instruction | gaps
    outcome: str = ""  # success | timeout | reset | unfinished | "" (no events)
    task_name: str = ""
    seed: int = -1

    @property
    def success(self) -> bool:
        return self.outcome in ("success", "")


def _latest_text(s: Stream | None, t_ns: int) -> str:
    if s is None or not s.texts:
        return ""
    i = int(np.searchsorted(s.times, t_ns, side="right")) - 1
    return s.texts[i] if i >= 0 else ""


def _parse_events(scan: BagScan) -> list[tuple[int, dict]]:
    ev = scan.events
    out = []
    for t_bag, text in zip(ev.times, ev.texts):
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or "event" not in d:
                raise ValueError("no 'event' field")
        except ValueError as e:
            raise RecordingError(scan.path, ev.topic, int(t_bag), f"episode event is not a JSON object with an "
                                                                  f"'event' field ({e}): {text[:120]!r}",
                                 scan.start_ns) from None
        t = int(t_bag)
        if "t" in d and scan.state.clock == "header":
            try:
                tf = float(d["t"])
                if not math.isfinite(tf) or tf <= 0:
                    raise ValueError
            except (TypeError, ValueError):
                raise RecordingError(scan.path, ev.topic, int(t_bag), f"episode event time 't' is not a "
                                                                      f"positive number: {d['t']!r}",
                                     scan.start_ns) from None
            t = int(round(tf * 1e9))
        out.append((t, d))
    return out


def _from_events(scan: BagScan, events: list[tuple[int, dict]], data_end: int) -> list[EpisodeSpan]:
    spans: list[EpisodeSpan] = []
    open_ev: tuple[int, dict] | None = None

    def close(t_end: int, outcome: str) -> None:
        t0, d = open_ev
        task = str(d.get("instruction") or "") or _latest_text(scan.instruction, t0)
        seed = d.get("seed", -1)
        spans.append(EpisodeSpan(t0, t_end, task, "events", outcome, str(d.get("task", "")),
                                 int(seed) if isinstance(seed, (int, float)) else -1))

    for t, d in events:
        kind = d["event"]
        if kind == "start":
            if open_ev is not None:
                close(t, "unfinished")
            open_ev = (t, d)
        elif kind in END_EVENTS and open_ev is not None:
            close(t, kind)
            open_ev = None
    if open_ev is not None:
        close(data_end, "unfinished")
    return spans


def _gap_runs(times: np.ndarray, gap_ns: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """(first, last) message times of the runs of ``times`` within [lo, hi] split at pauses > gap."""
    t = times[(times >= lo) & (times <= hi)]
    if len(t) == 0:
        return []
    cut = np.flatnonzero(np.diff(t) > gap_ns)
    starts = np.concatenate([[0], cut + 1])
    ends = np.concatenate([cut, [len(t) - 1]])
    return [(int(t[a]), int(t[b])) for a, b in zip(starts, ends)]


def split_episodes(scan: BagScan, gap_s: float, default_task: str = "") -> tuple[list[EpisodeSpan], str]:
    """(episodes in time order, the cue used: 'events' | 'instruction' | 'gaps')."""
    data_end = int(scan.state.times[-1])
    data_start = int(scan.state.times[0])
    gap_ns = int(round(gap_s * 1e9))
    events = _parse_events(scan) if scan.events is not None else []
    if any(d["event"] == "start" for _, d in events):
        spans, cue = _from_events(scan, events, data_end), "events"
    elif scan.instruction is not None and scan.instruction.texts:
        ins = scan.instruction
        changes = [(int(t), x) for i, (t, x) in enumerate(zip(ins.times, ins.texts))
                   if i == 0 or x != ins.texts[i - 1]]
        spans, cue = [], "instruction"
        for i, (t0, text) in enumerate(changes):
            t1 = changes[i + 1][0] - 1 if i + 1 < len(changes) else data_end
            for a, b in _gap_runs(scan.state.times, gap_ns, t0, t1):
                spans.append(EpisodeSpan(max(a, t0), b, text, cue))
    else:
        spans = [EpisodeSpan(a, b, default_task, "gaps")
                 for a, b in _gap_runs(scan.state.times, gap_ns, data_start, data_end)]
        cue = "gaps"
    out = []
    for s in spans:
        task = s.task or default_task
        if not task.strip():
            where = scan.instruction.topic if scan.instruction is not None else None
            raise RecordingError(scan.path, where, s.start_ns, "no task text for the episode starting here (no "
                                 "instruction in the bag or the event): give one with --task", scan.start_ns)
        out.append(EpisodeSpan(s.start_ns, s.end_ns, task, s.cue, s.outcome, s.task_name, s.seed))
    return out, cue

"""A cloud server crash in the routed closed loop (``edgefm-sim route-eval --exec ros --cloud-outage``).

``CloudOutage(at_episode, outage_s, after_s, kind)``: ``after_s`` seconds after episode ``at_episode - 1``
(0-based, the order of the run) reported its outcome, the whole ``edgefm-cloud serve`` process group

- ``crash``: is killed with SIGKILL (nothing is closed cleanly, requests in flight lose their connection);
  ``outage_s`` seconds later it is started again on the same port with the same token, so vla_node's configured
  URL works again;
- ``hang``: is stopped with SIGSTOP (connections are accepted by the kernel and never answered, requests in
  flight get no reply: only the client's deadline ends them); ``outage_s`` seconds later SIGCONT lets it go on,
  and it works through the requests that queued before it answers fresh ones.

``OutageRun`` carries the schedule out on a thread of its own while the episodes run (it watches sim_node's
results file, one line per finished episode) and records the wall-clock times of the kill and of the server
answering ready again; ``outage_report`` reads the run's record against them: chunks by source before, during
and after the outage, the first cloud chunk after the restart, and how long the arm held (ran out of actions).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

SOURCES = ("cloud", "edge", "edge-fallback")
FAULT_KINDS = ("crash", "hang")


@dataclass(frozen=True)
class CloudOutage:
    at_episode: int  # the episode (0-based, >= 1: the first one runs with the server up) the kill falls in
    outage_s: float  # kill -> restart (the restart then takes as long as the server needs to load)
    after_s: float = 1.0  # the previous episode's outcome -> the kill (sim_node settles 0.5 s between episodes)
    kind: str = "crash"  # "crash" (SIGKILL, then a restart) or "hang" (SIGSTOP, then SIGCONT)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"CloudOutage.kind must be one of {list(FAULT_KINDS)}, got {self.kind!r}")
        if isinstance(self.at_episode, bool) or not isinstance(self.at_episode, int) or self.at_episode < 1:
            raise ValueError(f"CloudOutage.at_episode must be an int >= 1 (the first episode runs with the server "
                             f"up), got {self.at_episode!r}")
        for name in ("outage_s", "after_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"CloudOutage.{name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def parse(cls, text: str) -> "CloudOutage":
        """'EPISODE,SECONDS[,KIND]' (e.g. '2,8' or '2,8,hang'), as ``--cloud-outage`` takes it."""
        parts = text.split(",")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            return cls(int(parts[0]), float(parts[1]), kind=parts[2].strip() if len(parts) == 3 else "crash")
        except ValueError as e:
            why = f": {e}" if str(e) else ""
            raise ValueError(f"--cloud-outage {text!r}: expected EPISODE,SECONDS[,crash|hang] with EPISODE an int "
                             f">= 1 and SECONDS >= 0 (e.g. 2,8 or 2,8,hang){why}") from None


def _finished(results: Path) -> int:
    try:
        return sum(1 for line in results.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


class OutageRun:
    """The schedule of ``fault`` on ``cloud`` (a ``tools.graph.LoopbackCloud``), on a thread, for a ``with`` block
    around the episodes; ``results``: sim_node's results file. Times are wall clock (the recorder's)."""

    def __init__(self, cloud, fault: CloudOutage, results: str | Path, progress: Callable[[str], None] = print):
        self.cloud, self.fault, self.results, self.progress = cloud, fault, Path(results), progress
        self.killed_at = math.nan
        self.ready_at = math.nan
        self.restart_s = math.nan  # the restart's own time: start -> ready
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloud-outage", daemon=True)

    def __enter__(self) -> "OutageRun":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.cloud.ready_timeout_s + 30.0)

    def _run(self) -> None:
        try:
            while _finished(self.results) < self.fault.at_episode:
                if self._stop.wait(0.05):
                    return  # the run ended first: nothing was killed
            if self._stop.wait(self.fault.after_s):
                return
            self.killed_at = time.time()
            if self.fault.kind == "hang":
                self.cloud.freeze()
                self.progress(f"[cloud outage] froze the cloud tier (SIGSTOP to its process group) during episode "
                              f"{self.fault.at_episode}; letting it go on in {self.fault.outage_s:g} s")
                self._stop.wait(self.fault.outage_s)
                self.cloud.thaw()
                self.restart_s = 0.0
                self.ready_at = time.time()
                self.progress("[cloud outage] the cloud tier goes on (SIGCONT)")
                return
            self.cloud.kill()
            self.progress(f"[cloud outage] killed the cloud tier (SIGKILL to its process group) during episode "
                          f"{self.fault.at_episode}; restarting it in {self.fault.outage_s:g} s")
            self._stop.wait(self.fault.outage_s)  # the run ending early still restarts it: the block stops it
            self.restart_s = self.cloud.start()
            self.ready_at = time.time()
            self.progress(f"[cloud outage] the cloud tier is ready again ({self.restart_s:.1f} s to start)")
        except BaseException as e:  # noqa: BLE001 - reported by report() and the run's caller
            self.error = e
            self.progress(f"[cloud outage] failed: {e}")

    def times(self) -> dict:
        return {"kind": self.fault.kind, "at_episode": self.fault.at_episode, "outage_s": self.fault.outage_s,
                "after_s": self.fault.after_s,
                "killed_at": self.killed_at, "ready_at": self.ready_at, "restart_s": self.restart_s,
                "down_s": self.ready_at - self.killed_at, "error": None if self.error is None else str(self.error)}


def slack_s(threshold: float, run, control_hz: float) -> float:
    """How long the arm can go on after action_node asks for the next chunk before its queue runs dry: the
    actions left then (``threshold`` of the chunk's rows, the shortest chunk recorded: the edge's and the cloud's
    checkpoints may differ) at ``control_hz``."""
    rows = min((shape[0] for shape in run.chunk_shape), default=0)
    return threshold * rows / control_hz


def _longest_true_run(t: np.ndarray, flag: np.ndarray) -> float:
    """The longest time ``flag`` stayed true (first true sample -> the next false one)."""
    best, since = 0.0, None
    for ti, f in zip(t, flag):
        if f and since is None:
            since = ti
        elif not f and since is not None:
            best, since = max(best, ti - since), None
    if since is not None and len(t):
        best = max(best, t[-1] - since)
    return float(best)


def outage_report(times: dict, run, windows: Sequence, slack_s: float) -> dict:
    """The outage read from the run's record (``tools.bag.analyze.Run``) and its episode windows
    (``tools.sim_ros.episode_windows``): chunks by source before / during / after (by arrival), each episode's
    phase (by its start), its wait for the first chunk (the arm holds at the start of every episode) and its
    longest hold after that (the queue run dry), the first cloud chunk after the server was ready again."""
    recv = np.asarray(run.chunk_recv, dtype=np.float64)
    stamp = np.asarray(run.chunk_stamp, dtype=np.float64)
    source = np.asarray(run.chunk_source, dtype=object)
    inference = np.asarray(run.chunk_inference, dtype=np.float64)
    st_t = np.asarray(run.status_time, dtype=np.float64)
    st_hold = np.asarray(run.status_holding, dtype=bool)
    killed, ready = float(times["killed_at"]), float(times["ready_at"])
    phase_of = lambda t: "before" if t < killed else ("during" if not t >= ready else "after")  # noqa: E731
    in_episode = np.zeros(len(recv), dtype=bool)
    holds, episodes = [], []
    for w in windows:
        mine = (recv >= w.start) & (recv <= w.end) & (stamp >= w.start)
        in_episode |= mine
        # the arm's holds after the episode's first chunk (before it the arm holds by design: the warm-up)
        first = recv[mine].min() if mine.any() else w.end
        sel = (st_t > first) & (st_t <= w.end)
        hold = _longest_true_run(st_t[sel], st_hold[sel])
        holds.append(hold)
        episodes.append({"seed": w.seed, "phase": phase_of(w.start), "success": w.outcome == "success",
                         "chunks": {s: int(np.sum(source[mine] == s)) for s in SOURCES},
                         "first_chunk_s": float(first - w.start), "longest_hold_s": hold})
    phases = {}
    for name in ("before", "during", "after"):
        sel = in_episode & np.array([phase_of(t) == name for t in recv], dtype=bool)
        phases[name] = {s: int(np.sum(source[sel] == s)) for s in SOURCES}
        phases[name]["longest_request_s"] = float(inference[sel].max()) if sel.any() else math.nan
    again = recv[(recv >= ready) & (source == "cloud")] if math.isfinite(ready) else np.zeros(0)
    # vla_node's cloud client at the end: its breaker's state and how often it opened (a probe call closes it)
    client = next(({k[len("cloud_"):]: v for k, v in values.items() if k.startswith("cloud_")}
                   for name, (_, _, values) in run.diagnostics.items() if "vla_node" in name), {})
    return {**times, "chunks": phases, "episodes": episodes, "slack_s": slack_s, "cloud_client": client,
            "longest_hold_s": float(max(holds, default=0.0)),
            "first_cloud_after_ready_s": float(again.min() - ready) if again.size else math.nan,
            "first_cloud_after_kill_s": float(again.min() - killed) if again.size else math.nan}


def format_outage(f: dict) -> str:
    """The report's ``fault`` in a few lines (``edgefm-sim route-eval --cloud-outage``)."""
    if f.get("error"):
        return f"cloud outage: the schedule failed: {f['error']}"
    if not math.isfinite(f["killed_at"]):
        return "cloud outage: the run ended before the kill"
    how = ("hung (SIGSTOP) during episode {e}, going on again {d:.1f} s later" if f.get("kind") == "hang" else
           "killed during episode {e}, ready again {d:.1f} s later (restart {r:.1f} s)").format(
        e=f["at_episode"], d=f["down_s"], r=f["restart_s"])
    lines = [f"cloud outage: {how}; first cloud chunk {f['first_cloud_after_ready_s']:.2f} s after "
             f"ready; vla_node's breaker opened {f['cloud_client'].get('breaker_opened', '?')} time(s), now "
             f"{f['cloud_client'].get('breaker', '?')}"]
    for phase, c in f["chunks"].items():
        n = sum(e["phase"] == phase for e in f["episodes"])
        ok = sum(e["success"] for e in f["episodes"] if e["phase"] == phase)
        lines.append(f"  {phase:>6}: {ok}/{n} episodes succeeded; chunks " + ", ".join(f"{s} {c[s]}" for s in SOURCES)
                     + f"; longest request {c['longest_request_s'] * 1e3:.0f} ms")
    eps = f["episodes"]
    lines.append(f"  the arm: longest hold after an episode's first chunk {f['longest_hold_s'] * 1e3:.0f} ms, longest "
                 f"wait for a first chunk {max((e['first_chunk_s'] for e in eps), default=math.nan) * 1e3:.0f} ms "
                 f"(queue slack {f['slack_s']:.2f} s)")
    return "\n".join(lines)

"""A long run of the simulated closed loop through the real node graph, sampled every window.

    python benchmarks/soak.py --minutes 60                    # the hour: table, growth per hour, plot, verdict
    python benchmarks/soak.py --minutes 3 --window-s 20 --warmup-min 1 --check   # the short version CI runs

``ros2 launch edgefm_ros sim.launch.py`` starts sim_node, vla_node and action_node (the committed checkpoint),
and sim_node runs episodes back to back (the checkpoint's tasks over the evaluation seeds, repeated) until
the time is up. Every window this script samples each node's RSS, open file descriptors and threads
(/proc), the Fast DDS files the graph's processes map in /dev/shm and how many of the files they ever mapped
no live process uses any more (both unaffected by other DDS programs on the machine), the control rate and its p99 |period error| (the commands' stamps),
observation-to-chunk latency (each chunk's measured inference time) and task success (sim_node's episode
events). At the end it prints the table, the growth per hour of each figure after the warm-up, the verdict
of each rule (edgefm_ros/housekeeping/soak.py SoakRules), and writes soak.json, soak.md and soak.svg.
After the graph is stopped it also checks that no process is left and no stale Fast DDS file remains.
The router and the cloud tier are not part of the simulated loop's graph yet, so they are not in the soak.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from edgefm_ros.housekeeping import shm
from edgefm_ros.housekeeping.soak import SoakRules, growth, judge, proc_sample, svg
from edgefm_ros.sim.paths import default_checkpoint
from edgefm_ros.sim.tasks import EVAL_SEEDS
from edgefm_ros.tools.graph import STARTED
from edgefm_ros.tools.sim_ros import COMMAND_TOPIC, LoopGraph, episode_windows, graph_params

NODES = ("sim_node", "vla_node", "action_node")


class Monitor:
    """The harness node's subscriptions: command stamps and chunk latencies since the last window."""

    def __init__(self, node, command_type: str):
        from trajectory_msgs.msg import JointTrajectory

        from edgefm_ros.msg import ActionChunk
        from edgefm_ros.ros import qos

        if command_type != "joint_trajectory":
            raise ValueError(f"the soak reads command stamps from JointTrajectory; command_type is {command_type!r}")
        self._lock = threading.Lock()
        self.stamps: list[float] = []
        self.latency_ms: list[float] = []
        node.create_subscription(JointTrajectory, COMMAND_TOPIC, self._on_cmd, qos.RELIABLE)
        node.create_subscription(ActionChunk, "/edgefm/action_chunk", self._on_chunk, qos.RELIABLE)

    def _on_cmd(self, msg) -> None:
        with self._lock:
            self.stamps.append(msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9)

    def _on_chunk(self, msg) -> None:
        with self._lock:
            self.latency_ms.append(msg.inference_time * 1e3)

    def drain(self, windows, guard_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(stamps, intervals within finished episodes, latencies) since the last drain. Intervals are taken
        between consecutive commands of one episode only (from ``guard_s`` after its start to its end): between
        episodes the arm is reset and no command is due. Stamps after the last finished episode wait for
        the next drain."""
        cut = windows[-1].end if windows else -math.inf
        with self._lock:
            s = np.asarray(self.stamps, dtype=np.float64)
            lat = np.asarray(self.latency_ms)
            self.stamps = [x for x in self.stamps if x > cut]
            self.latency_ms = []
        done = s[s <= cut]
        d = []
        for w in windows:
            t = done[(done >= w.start + guard_s) & (done <= w.end)]
            if t.size >= 2:
                d.append(np.diff(t))
        return done, (np.concatenate(d) if d else np.zeros(0)), lat


def node_pids(launch_log: Path) -> dict[str, int]:
    text = launch_log.read_text(errors="replace") if launch_log.exists() else ""
    return {m.group(1): int(m.group(3)) for m in STARTED.finditer(text) if m.group(1) in NODES}


def episodes(tasks: list[str], minutes: float) -> list[str]:
    """Enough episodes for the run (an episode lasts at least ~1 s with its reset), tasks interleaved."""
    seeds = list(EVAL_SEEDS[:20])
    n = int(minutes * 60 / 0.8) + len(tasks)
    return [f"{tasks[i % len(tasks)]}:{seeds[(i // len(tasks)) % len(seeds)]}" for i in range(n)]


def fmt_row(r: dict) -> str:
    nodes = "  ".join(f"{n.split('_')[0]} {r['nodes'][n]['rss_mb']:6.1f}MB {r['nodes'][n]['fds']:3.0f}fd "
                      f"{r['nodes'][n]['threads']:3.0f}th" for n in NODES if n in r["nodes"])
    return (f"{r['t_min']:6.1f}  {nodes}  shm {r['shm_files']:3d} (machine {r['shm_machine_files']:3d})  "
            f"stale {r['shm_stale_new']}  {r['rate_hz']:6.2f}Hz p99 {r['period_error_p99_ms']:5.2f}ms  lat p50 {r['latency_p50_ms']:6.1f}ms  "
            f"success {r['episodes_success']}/{r['episodes_done']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--window-s", type=float, default=60.0, help="sampling window (default one minute)")
    p.add_argument("--warmup-min", type=float, default=5.0, help="not judged: model load, allocator, caches")
    p.add_argument("--checkpoint", default=None, help="default: the committed checkpoint")
    p.add_argument("--tasks", default="", help="comma separated (default: the checkpoint's training tasks)")
    p.add_argument("--out", default="soak_output", help="soak.json, soak.md and soak.svg go here")
    p.add_argument("--domain-id", type=int, default=None)
    p.add_argument("--check", action="store_true", help="exit 1 when a rule fails")
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.window_s <= 0 or a.warmup_min < 0 or a.warmup_min >= a.minutes:
        p.error(f"need minutes > warmup-min >= 0 and window-s > 0; got {a.minutes}, {a.warmup_min}, {a.window_s}")
    rules = SoakRules(warmup_min=a.warmup_min)
    ckpt = Path(a.checkpoint) if a.checkpoint else default_checkpoint()
    tasks = [t for t in a.tasks.split(",") if t] or json.loads((ckpt / "edgefm_train.json").read_text())["tasks"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    domain = a.domain_id if a.domain_id is not None else 10 + os.getpid() % 90
    workdir = Path(tempfile.mkdtemp(prefix="edgefm-soak-"))
    params = graph_params(str(ckpt), episodes(tasks, a.minutes + 2), results_path=str(workdir / "episodes.jsonl"))
    period = 1.0 / float(params["action_node"]["control_rate_hz"])
    print(f"soak: {a.minutes:g} min, windows of {a.window_s:g} s, tasks {tasks}, checkpoint {ckpt}, "
          f"ROS_DOMAIN_ID {domain}, logs {workdir}", flush=True)
    rows, errors_ms, pids_seen = [], [], set()
    graph_files: set[str] = set()  # every Fast DDS file the graph's processes mapped: a stale one is theirs
    with LoopGraph(workdir, params, domain, progress=None, mode="launch") as g:
        mon = Monitor(g.session.node, params["action_node"]["command_type"])
        g.start()
        t_start = time.monotonic()
        seen_events, events_open = 0, []
        guard_s = float(params["sim_node"].get("command_guard_s", 0.0))
        next_t = t_start + a.window_s
        while True:
            time.sleep(max(0.0, next_t - time.monotonic()))
            now = time.monotonic()
            pids = node_pids(workdir / "launch.log")
            pids_seen.update(pids.values())
            events = g.events[seen_events:]
            seen_events += len(events)
            stamps, d, lat = mon.drain(episode_windows(events_open + events), guard_s)
            events_open = events_open + events
            windows = episode_windows(events_open)
            if windows:  # keep the events of an episode still running for the next window
                last = max(i for i, e in enumerate(events_open) if e.get("event") in ("success", "timeout", "reset"))
                events_open = events_open[last + 1:]
            err = np.abs(d - period) * 1e3
            t_min = (now - t_start) / 60.0
            if t_min >= a.warmup_min:
                errors_ms.extend(err.tolist())
            done = [e for e in events if e.get("event") in ("success", "timeout")]
            mine = shm.mapped_by(pids.values())
            graph_files |= mine
            row = {"t_min": round(t_min, 3), "nodes": {n: proc_sample(pid) for n, pid in pids.items()},
                   "shm_files": len(mine), "shm_mb": round(shm.size_mb(mine), 3),
                   "shm_stale_new": len(set(shm.stale()) & graph_files),
                   "shm_machine_files": shm.usage().files,
                   "rate_hz": float(1.0 / d.mean()) if d.size else math.nan,
                   "period_error_p99_ms": float(np.percentile(err, 99)) if err.size else math.nan,
                   "missed": int(np.sum(np.maximum(np.round(d / period) - 1, 0))) if d.size else 0,
                   "latency_p50_ms": float(np.median(lat)) if lat.size else math.nan,
                   "latency_p95_ms": float(np.percentile(lat, 95)) if lat.size else math.nan,
                   "chunks": int(lat.size),
                   "episodes_done": len(done), "episodes_success": sum(e["event"] == "success" for e in done)}
            rows.append(row)
            print(fmt_row(row), flush=True)
            if any(e.get("event") == "done" for e in events):
                print("soak: sim_node ran out of episodes", flush=True)
                break
            if now - t_start >= a.minutes * 60 - 1e-6:
                break
            next_t += a.window_s
    time.sleep(1.0)
    left = sorted(p for p in pids_seen if Path(f"/proc/{p}").exists())
    stale = shm.stale()
    g_rates = growth(rows, rules)
    verdict = judge(rows, rules, period, errors_ms)
    verdict["after the stop"] = (not left and not stale,
                                 f"{len(left)} processes left, {len(stale)} stale Fast DDS files")
    lines = [f"| minute | " + " | ".join(f"{n} RSS MB / fds / threads" for n in NODES)
             + " | graph's /dev/shm files (stale new) | rate Hz | p99 period error ms | obs->chunk p50 ms | success |",
             "|" + " --- |" * (len(NODES) + 6)]
    for r in rows:
        cells = [f"{r['nodes'][n]['rss_mb']:.1f} / {r['nodes'][n]['fds']:.0f} / {r['nodes'][n]['threads']:.0f}"
                 if n in r["nodes"] else "-" for n in NODES]
        lines.append(f"| {r['t_min']:.1f} | " + " | ".join(cells) + f" | {r['shm_files']} ({r['shm_stale_new']}) | "
                     f"{r['rate_hz']:.2f} | {r['period_error_p99_ms']:.2f} | {r['latency_p50_ms']:.1f} | "
                     f"{r['episodes_success']}/{r['episodes_done']} |")
    print("\ngrowth per hour after the warm-up:")
    for n, m in g_rates["nodes"].items():
        print(f"  {n}: RSS {m['rss_mb_per_h']:+.2f} MB/h ({m['rss_pct_per_h']:+.2f} %/h), fds {m['fds_per_h']:+.2f}/h, "
              f"threads {m['threads_per_h']:+.2f}/h")
    print(f"  /dev/shm: {g_rates['shm_files_per_h']:+.2f} files/h, {g_rates['shm_mb_per_h']:+.2f} MB/h; control p99 "
          f"{g_rates['period_error_p99_ms_per_h']:+.3f} ms/h; latency p50 {g_rates['latency_p50_ms_per_h']:+.2f} ms/h")
    print("\nverdict:")
    for k, (ok, what) in verdict.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {k}: {what}")
    total_s = sum(r["episodes_success"] for r in rows)
    total_n = sum(r["episodes_done"] for r in rows)
    print(f"episodes: {total_s}/{total_n} succeeded")
    (out / "soak.json").write_text(json.dumps({"minutes": a.minutes, "window_s": a.window_s, "rules": vars(rules)
                                               if hasattr(rules, "__dict__") else {}, "tasks": tasks,
                                               "checkpoint": str(ckpt), "rows": rows, "growth_per_h": g_rates,
                                               "verdict": {k: {"ok": ok, "measured": w} for k, (ok, w) in
                                                           verdict.items()}}, indent=1, default=float))
    (out / "soak.md").write_text("\n".join(lines) + "\n")
    (out / "soak.svg").write_text(svg(rows, f"edgefm_ros soak: {a.minutes:g} min, {total_s}/{total_n} episodes "
                                            f"succeeded"))
    print(f"wrote {out / 'soak.json'}, {out / 'soak.md'}, {out / 'soak.svg'}")
    ok = all(ok for ok, _ in verdict.values())
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())

"""edgefm-launch-cycles: start the full graph with ``ros2 launch``, stop it with Ctrl-C (or SIGTERM), N
times, and count the processes that did not end cleanly.

    python -m edgefm_ros.tools.launch_cycles --cycles 20      # ends with "abnormal exits: 0" when clean

Each cycle launches replay.launch.py (vla_node, action_node, router_node, the bag player and recorder) with
a small checkpoint and a synthetic bag (``--graph robot``: edgefm.launch.py without data), waits until the
lifecycle nodes are active and data flows, waits a random 0.5-3 s (inference in flight, commands at the
control rate), then sends the signal: ``--target group`` delivers it to every process of the launch's
process group, as a terminal's Ctrl-C does (and as systemd stops a service); ``--target launch`` to the
``ros2 launch`` process alone. Abnormal: a process
whose exit code is not 0, one still running ``--bound-s`` after the signal, a graph that did not come up.
This process is a child subreaper (Linux): processes whose launcher died are reparented to it, so their
exit codes are known too. ``ros2 launch`` itself exits 0 on SIGINT; on SIGTERM it ends at once by design
(upstream Jazzy: "using SIGTERM can result in orphaned processes"), so its status is shown, not counted,
for SIGTERM.

The launch machinery (``LaunchedGraph``: one ``ros2 launch`` in a session of its own, its log parsed for the
processes it started and how each ended) is tools/graph.py's, shared with the tests and the demo.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from edgefm_ros.housekeeping import shm
from edgefm_ros.tools.bag.make import MakeConfig, make_bag
from edgefm_ros.tools.graph import (READY, LaunchedGraph, StopResult, become_subreaper, choose_model, model_spec,
                                    node_params, params_yaml, pid_alive, ros2_launch_available)

# ---- the cycling tool -------------------------------------------------------------------------------------

def prepare(workdir: Path, checkpoint: str | None, bag: str | None, duration_s: float,
            realtime_priority: int) -> tuple[str, str]:
    """(params file, bag) for the replay graph: the demo's node parameters for ``checkpoint`` (default: the
    demo checkpoint) and a synthetic bag unless ``bag`` is given."""
    model = choose_model(checkpoint, None, 2, (48, 64))
    cfg = model_spec(model)
    opts = argparse.Namespace(action_rate=30.0, control_rate=50.0, aggregate="weighted_average", no_router=False,
                              shadow=0.0)
    params = node_params(model, cfg, opts)
    params["action_node"]["realtime_priority"] = realtime_priority
    path = workdir / "params.yaml"
    path.write_text(params_yaml(params))
    if not bag:
        bag = str(workdir / "bag")
        if not Path(bag).exists():
            make_bag(MakeConfig(bag, duration_s=duration_s, cameras=len(cfg.camera_keys), width=64, height=48))
    return str(path), bag


def run_cycles(n: int, workdir: Path, params: str, bag: str, sig: int, target: str, bound_s: float,
               up_timeout_s: float, run_s: tuple[float, float], domain_id: int, log=print,
               reap_all: bool = False, graph: str = "replay", on_up=None, extra: Mapping[str, str] | None = None,
               between=None) -> list[StopResult]:
    """``graph`` "replay": replay.launch.py, data flowing; "robot": edgefm.launch.py, no data. ``on_up(g)`` runs
    once every node is ready, ``between(g)`` before the stop (the kill cycles); ``extra``: more launch
    arguments."""
    results = []
    rng = random.Random()
    env = {"ROS_DOMAIN_ID": str(domain_id)}
    for i in range(n):
        if graph == "replay":
            record = workdir / f"record_{i}"
            shutil.rmtree(record, ignore_errors=True)
            file, args = "replay.launch.py", {"bag": bag, "record": str(record), "params_file": params,
                                              "use_router": "true", "play_delay_s": "0.0"}
        else:
            file, args = "edgefm.launch.py", {"params_file": params, "use_router": "true"}
        g = LaunchedGraph(file, {**args, **(extra or {})}, workdir / f"launch_{i}.log", env, reap_all=reap_all)
        try:
            g.wait_ready(("vla_node", "action_node", "router_node"), up_timeout_s)
            up = None
            if on_up is not None:
                on_up(g)
            if between is not None:
                between(g)
        except RuntimeError as e:
            up = str(e)
        time.sleep(rng.uniform(*run_s))
        r = g.stop(sig, target, bound_s)
        if up is not None:
            r.survivors.append(f"(not up: {up})")
        results.append(r)
        bad = r.abnormal() + ([f"not up: {up}"] if up else [])
        codes = " ".join(f"{k}={v}" for k, v in r.codes.items())
        log(f"cycle {i + 1}/{n}: {r.signal} to {r.target}: {codes}; ros2 launch={r.launch_rc}; all gone in "
            f"{r.seconds:.2f}s" + (f"; ABNORMAL: {bad}" if bad else "")
            + (f"; log lines: {r.crash_lines[:3]}" if r.crash_lines else ""))
    return results


@dataclass
class KillResult:
    signal: str
    pid: int
    code: int | None  # exit code launch reported (None: not reported within the bound)
    restarted_s: float | None  # signal -> the respawned node ready again (None: it did not come back)

    def abnormal(self) -> list[str]:
        want = 0 if self.signal in ("SIGINT", "SIGTERM") else -signal.Signals[self.signal].value
        bad = [] if self.code == want else [f"pid {self.pid}: exit {self.code} after {self.signal} (expected {want})"]
        return bad + ([] if self.restarted_s is not None else [f"pid {self.pid}: not restarted"])


def kill_cycles(g: LaunchedGraph, node: str, n: int, sig: int, up_timeout_s: float, run_s: tuple[float, float],
                log=print) -> list[KillResult]:
    """``n`` times: ``sig`` to ``node``'s current process of a graph launched with ``respawn:=true``, its exit
    code as launch reports it, and the time until the restarted process is ready again."""
    rng = random.Random()
    out = []
    for i in range(n):
        time.sleep(rng.uniform(*run_s))
        pid = g.pids(node)[-1]
        ready_before = g.ready_count(node)
        t0 = time.monotonic()
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        code, back = None, None
        end = t0 + up_timeout_s
        while time.monotonic() < end:
            code = g.reported_exits().get(pid, code)
            if code is not None and g.ready_count(node) > ready_before and g.pids(node)[-1] != pid:
                back = time.monotonic() - t0
                break
            time.sleep(0.05)
        r = KillResult(signal.Signals(sig).name, pid, code, back)
        out.append(r)
        bad = r.abnormal()
        log(f"kill {i + 1}/{n}: {r.signal} to {node} pid {pid}: exit {code}; ready again in "
            + (f"{back:.1f}s" if back is not None else "-") + (f"; ABNORMAL: {bad}" if bad else ""))
        if back is None:
            break
    return out


@dataclass(frozen=True)
class ShmCheck:
    """What /dev/shm holds before a run, with one graph up, and after it; and whether any process is left."""
    before: "shm.Usage"
    live: "shm.Usage"
    after: "shm.Usage"
    stale_new: list[str]  # Fast DDS files that appeared during the run, are still there and no process uses
    left_processes: list[int]

    def ok(self) -> bool:
        return self.within() and not self.stale_new and not self.left_processes

    def within(self) -> bool:
        """At most one live graph's worth more files than before (fewer is no leak: another program's
        participants may have gone meanwhile)."""
        return self.after.files - self.before.files <= max(self.live.files - self.before.files, 0)

    def line(self) -> str:
        graph = max(self.live.files - self.before.files, 0)
        return (f"/dev/shm Fast DDS files: {self.before.files} ({self.before.mb:.1f} MB) before, one graph up "
                f"+{graph}, after {self.after.files} ({self.after.mb:.1f} MB): "
                f"{'within' if self.within() else 'OUTSIDE'} +{graph}; "
                f"stale files left: {len(self.stale_new)}; processes left: {len(self.left_processes)}")


def shm_check(before_names: set[str], before: "shm.Usage", live: "shm.Usage", pids: Sequence[int]) -> ShmCheck:
    stale = set(shm.stale())
    names = {p.name for p in shm.SHM_DIR.iterdir()} if shm.SHM_DIR.exists() else set()
    return ShmCheck(before, live, shm.usage(), sorted((names - before_names) & stale),
                    sorted(p for p in set(pids) if pid_alive(p)))


def count_abnormal(results: Sequence[StopResult]) -> int:
    return sum(len(r.abnormal()) for r in results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgefm_ros.tools.launch_cycles", description=__doc__.split("\n")[0])
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--signal", choices=("INT", "TERM"), default="INT")
    p.add_argument("--target", choices=("group", "launch"), default="group",
                   help="group: every process of the launch's group (a terminal's Ctrl-C); launch: ros2 launch only")
    p.add_argument("--graph", choices=("replay", "robot"), default="replay",
                   help="replay: replay.launch.py, a bag playing into the graph (default); robot: edgefm.launch.py, "
                   "no data")
    p.add_argument("--checkpoint", help="SmolVLA checkpoint (default: the demo checkpoint, random weights)")
    p.add_argument("--bag", help="bag to replay (default: a synthetic one)")
    p.add_argument("--workdir", help="logs, params, bag, records (default: a temporary dir, removed when clean)")
    p.add_argument("--bound-s", type=float, default=15.0, help="every process must be gone this long after the signal")
    p.add_argument("--up-timeout-s", type=float, default=120.0)
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: from the pid)")
    p.add_argument("--realtime-priority", type=int, default=50 if os.geteuid() == 0 else 0,
                   help="action_node's SCHED_FIFO priority (default: 50 as root, as on a robot; 0: normal)")
    p.add_argument("--kills", type=int, default=0,
                   help="in the first cycle, signal one node this many times, launched with respawn:=true "
                   "(launch restarts it each time), before the stop")
    p.add_argument("--kill-node", default="vla_node", choices=sorted(READY))
    p.add_argument("--kill-signal", choices=("INT", "TERM", "KILL"), default="TERM")
    a = p.parse_args(argv)
    if a.cycles < 1:
        p.error(f"--cycles must be >= 1, got {a.cycles}")
    if a.kills < 0:
        p.error(f"--kills must be >= 0, got {a.kills}")
    if not ros2_launch_available():
        print("ros2 launch is not installed (scripts/setup.sh installs it from ../shared/ros2-jazzy)", file=sys.stderr)
        return 2
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    subreaper = become_subreaper()
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="edgefm_cycles_"))
    workdir.mkdir(parents=True, exist_ok=True)
    params, bag = prepare(workdir, a.checkpoint, a.bag, 30.0, a.realtime_priority)
    domain = a.domain_id if a.domain_id is not None else 10 + os.getpid() % 90
    print(f"{a.cycles} cycles of {a.graph} graph, SIG{a.signal} to {a.target}; logs in {workdir}"
          + ("" if subreaper else " (not a subreaper: orphans' exit codes unknown)"), flush=True)
    cleaned = shm.clean()  # the baseline: this machine less what no process uses
    if cleaned.removed:
        print(f"before the run: {cleaned.summary()}", flush=True)
    before_names = {f.name for f in shm.SHM_DIR.iterdir()} if shm.SHM_DIR.exists() else set()
    before, live, pids, kills = shm.usage(), [], [], []

    def on_up(g: LaunchedGraph) -> None:
        if not live:
            live.append(shm.usage())

    def between(g: LaunchedGraph) -> None:
        if a.kills and not kills:
            kills.extend(kill_cycles(g, a.kill_node, a.kills, getattr(signal, f"SIG{a.kill_signal}"), a.up_timeout_s,
                                     (0.5, 2.0), log=lambda s: print(s, flush=True)))
        pids.extend(g.all_pids())

    results = run_cycles(a.cycles, workdir, params, bag, getattr(signal, f"SIG{a.signal}"), a.target, a.bound_s,
                         a.up_timeout_s, (0.5, 3.0), domain, log=lambda s: print(s, flush=True), reap_all=subreaper,
                         graph=a.graph, on_up=on_up, between=between,
                         extra={"respawn": "true"} if a.kills else None)
    bad = count_abnormal(results)
    bad_kills = sum(len(k.abnormal()) for k in kills) + (a.kills - len(kills))
    slowest = max(r.seconds for r in results)
    time.sleep(0.5)
    check = shm_check(before_names, before, live[0] if live else before, pids)
    print(f"abnormal exits: {bad} (in {a.cycles} cycles; slowest shutdown {slowest:.2f}s)")
    if a.kills:
        back = [k.restarted_s for k in kills if k.restarted_s is not None]
        print(f"{a.kill_node} SIG{a.kill_signal} x{a.kills}: abnormal {bad_kills}; restarted "
              f"{len(back)}/{a.kills}" + (f" (ready again in {min(back):.1f}-{max(back):.1f}s)" if back else ""))
    print(check.line())
    if check.stale_new:
        print("stale: " + " ".join(check.stale_new[:40]))
    ok = bad == 0 and bad_kills == 0 and check.ok()
    if ok and not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""``edgefm-sim teach``: demonstrations recorded from the ROS graph, as a robot's are.

Three processes on one ROS domain, over DDS: sim_node (the simulated arm on the wall clock, publishing its
ground truth for the operator), the teleoperation device (tools/teleop_node.py: the scripted expert driving
sim_node over action_node's command topic) and ``edgefm-bag record`` (the cameras, the joint states, the
commands sent, the instruction, the episode events and episode starts, to an MCAP or sqlite3 bag). The
harness waits until every process is up and the recorder subscribes to every topic, tells sim_node to start
(``wait_for_start``), shows each episode's outcome, and once sim_node reports the last episode done stops the
recorder (the bag's metadata written), then the nodes. One episode per task and seed, task by task.

    summary = run_teach(TeachConfig(tasks=("reach",), seeds=(0, 1), bag="demos.mcap-bag"))
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from edgefm_ros.sim.paths import share_file
from edgefm_ros.sim.tasks import TASKS, TRAIN_SEEDS, get_task, parse_seeds, parse_tasks
from edgefm_ros.tools.graph import node_command, params_yaml

# rclpy, the nodes' modules and rosbags are imported where a session runs, so that `edgefm-sim` (whose parser
# holds this subcommand) starts without them.
STORAGES = ("mcap", "sqlite3")  # edgefm-bag record's storages (tools/bag/make.STORAGES)
OPERATOR = "teleop_operator"  # tools/teleop_node.NODE_NAME
GROUND_TRUTH_TOPIC = "sim/ground_truth"  # sim_node's ground_truth_topic, the operator's input
COMMAND_TOPIC = "/edgefm/command"
EVENTS_TOPIC = "/sim/events"
RESET_TOPIC = "/sim/reset"
RECORDER = "edgefm_bag_recorder"  # edgefm-bag record's node name
# what a robot's teaching session records: the converter's inputs (edgefm-bag to-dataset)
RECORD_TOPICS = ("/scene/image_raw", "/wrist/image_raw", "/joint_states", COMMAND_TOPIC, "/instruction",
                 EVENTS_TOPIC, "/edgefm/episode_start")
ENDS = ("success", "timeout", "reset")


@dataclass(frozen=True)
class TeachConfig:
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    bag: str  # the bag directory to write (must not exist)
    storage: str = "mcap"  # mcap (Jazzy's default) or sqlite3
    noise_m: float = 0.0  # the operator's xyz noise per command (m)
    hesitate_per_s: float = 0.0  # the operator's hesitations per second
    operator_seed: int = 0
    settle_s: float = 0.5  # sim_node's hold between episodes
    domain_id: int | None = None  # None: from the process id (60-99)
    ready_timeout_s: float = 180.0  # sim_node builds every task's world before it is active

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("TeachConfig.tasks: name at least one task")
        for t in self.tasks:
            get_task(t)  # ValueError naming an unknown task
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"TeachConfig.tasks {list(self.tasks)} name a task twice")
        if not self.seeds or any(not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValueError(f"TeachConfig.seeds must be integers >= 0, got {list(self.seeds)[:10]}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"TeachConfig.seeds name a seed twice: {list(self.seeds)[:10]}")
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {self.storage!r}")
        if Path(self.bag).exists():
            raise ValueError(f"bag {self.bag} already exists; choose a new path")
        if not (0.0 <= self.noise_m < 0.05):
            raise ValueError(f"noise_m must be in [0, 0.05) m, got {self.noise_m!r}")
        if not (0.0 <= self.hesitate_per_s <= 5.0):
            raise ValueError(f"hesitate_per_s must be in [0, 5], got {self.hesitate_per_s!r}")
        if not (0.0 <= self.settle_s <= 60.0):
            raise ValueError(f"settle_s must be in [0, 60] s, got {self.settle_s!r}")
        if self.domain_id is not None and not 0 <= self.domain_id <= 101:
            raise ValueError(f"domain_id must be in 0..101, got {self.domain_id}")

    @property
    def episodes(self) -> list[str]:
        """'task:seed' in the order taught: task by task, seeds in the order given."""
        return [f"{t}:{s}" for t in self.tasks for s in self.seeds]


def teach_params(cfg: TeachConfig, results_path: str = "", config: str | Path | None = None) -> dict:
    """sim_node's parameters (config/sim.yaml with this session's episodes, its ground truth on, held until the
    harness starts it) and the operator's (the same command topic, type and joints)."""
    doc = yaml.safe_load((Path(config) if config else share_file("config", "sim.yaml")).read_text())
    sim = dict(doc["sim_node"]["ros__parameters"])
    sim.update(episodes=cfg.episodes, wait_for_start=True, results_path=results_path, settle_s=cfg.settle_s,
               ground_truth_topic=GROUND_TRUTH_TOPIC, repeat=False, autostart=True,
               command_guard_s=0.0)  # only the operator commands: nothing from an old episode to ignore
    if os.geteuid() == 0:  # the robot keeps the wall clock on a busy machine (a warning where not granted)
        sim["realtime_priority"] = sim.get("realtime_priority") or 40
    op = {"ground_truth_topic": GROUND_TRUTH_TOPIC, "events_topic": sim["events_topic"],
          "command_topic": sim["command_topic"], "command_type": sim["command_type"],
          "joint_names": list(sim["joint_names"]), "tasks": list(cfg.tasks), "noise_m": float(cfg.noise_m),
          "hesitate_per_s": float(cfg.hesitate_per_s), "seed": int(cfg.operator_seed)}
    return {"sim_node": sim, OPERATOR: op}


class _Graph:
    """The three processes and the harness's own node (diagnostics, events, the start request)."""
    def __init__(self, cfg: TeachConfig, workdir: Path, domain: int, progress: Callable[[str], None] | None):
        self.cfg, self.workdir, self.domain, self.progress = cfg, workdir, domain, progress
        self.procs: dict[str, subprocess.Popen] = {}
        self.events: list[dict] = []
        self.sim_state = ""
        self._cond = threading.Condition()

    # ---- processes ----------------------------------------------------------------------------------------
    def _start(self, name: str, cmd: list[str]) -> None:
        env = dict(os.environ, ROS_DOMAIN_ID=str(self.domain), PYTHONUNBUFFERED="1")
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def _stop(self, name: str, timeout: float = 20.0) -> int | None:
        p = self.procs.get(name)
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        return p.returncode

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    # ---- the harness node -----------------------------------------------------------------------------------
    def __enter__(self) -> "_Graph":
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        from edgefm_ros.ros import qos
        from edgefm_ros.ros.diagnostics import DiagnosticArray
        from edgefm_ros.ros.spin import spin_until_shutdown

        self.context = Context()
        rclpy.init(context=self.context, domain_id=self.domain)
        try:
            self.node = rclpy.create_node("edgefm_teach", context=self.context)
            self._events_sub = self.node.create_subscription(String, EVENTS_TOPIC, self._on_event, qos.RELIABLE)
            self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, qos.DIAGNOSTICS)
            self.reset_pub = self.node.create_publisher(String, RESET_TOPIC, qos.RELIABLE)
            self.executor = SingleThreadedExecutor(context=self.context)
            self.executor.add_node(self.node)
        except BaseException:
            self.context.try_shutdown()
            raise
        self._spin = threading.Thread(target=spin_until_shutdown, args=(self.executor, self.context),
                                      kwargs={"period_s": 0.1}, daemon=True)
        self._spin.start()
        return self

    def __exit__(self, *exc) -> None:
        for name in ("recorder", "operator", "sim_node"):  # the recorder first: its bag is what must survive
            self._stop(name)
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._spin.join(timeout=2.0)

    def _on_diag(self, msg) -> None:
        for s in msg.status:
            if s.name.split(":")[0] == "sim_node":
                self.sim_state = next((kv.value for kv in s.values if kv.key == "state"), "")

    def _on_event(self, msg) -> None:
        try:
            ev = json.loads(msg.data)
        except ValueError:
            return
        with self._cond:
            self.events.append(ev)
            self._cond.notify_all()
        if self.progress and ev.get("event") in ENDS:
            done = sum(e.get("event") in ENDS for e in self.events)
            total = len(self.cfg.episodes)
            self.progress(f"[teach] [{done}/{total}] {ev['task']} seed {ev['seed']}: {ev['event']} after "
                          f"{ev['elapsed_s']:.2f} s")

    def wait_event(self, pred: Callable[[dict], bool], timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                hit = next((e for e in self.events if pred(e)), None)
                left = end - time.monotonic()
                if hit is not None or left <= 0:
                    return hit
                self._cond.wait(min(left, 0.2))

    def _wait(self, what: str, pred: Callable[[], bool], timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"{what}: processes exited {dead}; logs in {self.workdir}")
            time.sleep(0.1)
        raise RuntimeError(f"{what}: not within {timeout:.0f} s; logs in {self.workdir}")

    def _subscribed(self, node: str, topics: Sequence[str]) -> bool:
        return all(any(i.node_name == node for i in self.node.get_subscriptions_info_by_topic(t)) for t in topics)

    def start(self, params_file: Path) -> None:
        """Nodes and recorder up, every recorded topic subscribed, then the first episode started."""
        from std_msgs.msg import String

        ros = ["--ros-args", "--params-file", str(params_file)]
        self._start("sim_node", node_command("sim_node") + ros)
        self._start("operator", [sys.executable, "-m", "edgefm_ros.tools.teleop_node"] + ros)
        self._start("recorder", [sys.executable, "-m", "edgefm_ros.tools.bag_cli", "record", str(self.cfg.bag),
                                 "--storage", self.cfg.storage, "--topics", *RECORD_TOPICS])
        t0 = time.monotonic()
        self._wait("sim_node active", lambda: self.sim_state == "active", self.cfg.ready_timeout_s)
        self._wait("the operator listening",
                   lambda: self._subscribed(OPERATOR, [EVENTS_TOPIC, "/" + GROUND_TRUTH_TOPIC]), 60.0)
        self._wait("the recorder subscribed to every topic", lambda: self._subscribed(RECORDER, RECORD_TOPICS), 60.0)
        self._wait("sim_node listening for the start and heard", lambda: self.reset_pub.get_subscription_count() > 0
                   and self._events_sub.get_publisher_count() > 0, 30.0)
        if self.progress:
            self.progress(f"[teach] graph up in {time.monotonic() - t0:.1f} s (sim_node, {OPERATOR}, {RECORDER}; "
                          f"ROS_DOMAIN_ID {self.domain}); teaching {len(self.cfg.episodes)} episodes")
        for _ in range(6):  # one request once matched (reliable); again only after a long silence
            self.reset_pub.publish(String(data=""))
            if self.wait_event(lambda e: e.get("event") == "start", 10.0) is not None:
                return
        raise RuntimeError(f"sim_node did not start an episode; logs in {self.workdir}")


def bag_summary(bag: str | Path) -> dict:
    """Message counts per topic, the duration and the episodes (from the recorded events) of a bag."""
    from rosbags.rosbag2 import Reader  # rosbags: see the comment at the top

    from edgefm_ros.tools.bag.typestore import make_typestore

    ts = make_typestore()
    with Reader(str(bag)) as r:
        counts = {c.topic: c.msgcount for c in r.connections}
        types = {c.topic: c.msgtype for c in r.connections}
        conns = [c for c in r.connections if c.topic == EVENTS_TOPIC]
        events = [json.loads(ts.deserialize_cdr(d, c.msgtype).data) for c, _, d in r.messages(connections=conns)]
        duration = r.duration * 1e-9
    episodes, starts = [], {}
    for e in events:
        if e.get("event") == "start":
            starts[e["episode"]] = e
        elif e.get("event") in ENDS and e.get("episode") in starts:
            s = starts.pop(e["episode"])
            episodes.append({"task": s["task"], "seed": int(s["seed"]), "start": s["t"], "end": e["t"],
                             "outcome": e["event"]})
    return {"topics": counts, "types": types, "duration_s": duration, "episodes": episodes}


def run_teach(cfg: TeachConfig, workdir: str | Path | None = None,
              progress: Callable[[str], None] | None = print) -> dict:
    """Teach ``cfg.episodes`` through the graph into ``cfg.bag``; the summary (bag_summary plus the wall time).
    ``workdir`` keeps the processes' logs and params (default: a temporary one, kept when something fails).
    RuntimeError naming the logs when a process dies, the graph does not come up, or episodes are missing."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="edgefm-teach-")) if own else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    Path(cfg.bag).resolve().parent.mkdir(parents=True, exist_ok=True)
    params_file = work / "params.yaml"
    params_file.write_text(params_yaml(teach_params(cfg, str(work / "episodes.jsonl"))))
    domain = cfg.domain_id if cfg.domain_id is not None else 60 + os.getpid() % 40
    timeout = sum(get_task(e.rpartition(":")[0]).max_seconds + cfg.settle_s + 1.5 for e in cfg.episodes) * 1.5 + 60
    t0 = time.monotonic()
    if progress:
        progress(f"[teach] {len(cfg.tasks)} task(s) x {len(cfg.seeds)} seed(s) -> {cfg.bag} ({cfg.storage}); "
                 f"logs {work}")
    ok = False
    try:
        with _Graph(cfg, work, domain, progress) as g:
            g.start(params_file)
            if g.wait_event(lambda e: e.get("event") == "done", timeout) is None:
                raise RuntimeError(f"the episodes did not finish within {timeout:.0f} s; logs in {work}")
            time.sleep(0.5)  # the last events reach the recorder
            code = g._stop("recorder", timeout=60.0)
            if code != 0:
                raise RuntimeError(f"edgefm-bag record exited with {code}; log {work / 'recorder.log'}")
        summary = bag_summary(cfg.bag)
        want = {(e.rpartition(":")[0], int(e.rpartition(":")[2])) for e in cfg.episodes}
        got = {(e["task"], e["seed"]) for e in summary["episodes"]}
        if want - got or len(summary["episodes"]) != len(want):
            raise RuntimeError(f"the bag holds {len(summary['episodes'])} episodes, expected {len(want)} "
                               f"(missing {sorted(want - got)[:5]}); logs in {work}")
        ok = True
    except RuntimeError as e:
        kept = f"; {cfg.bag} holds what was recorded" if Path(cfg.bag, "metadata.yaml").is_file() else ""
        raise RuntimeError(f"{e}{kept}") from e
    finally:
        if own and ok:
            shutil.rmtree(work, ignore_errors=True)
    summary["wall_s"] = time.monotonic() - t0
    summary["successes"] = sum(e["outcome"] == "success" for e in summary["episodes"])
    if progress:
        progress(f"[teach] done in {summary['wall_s']:.0f} s: {summary['successes']}/{len(summary['episodes'])} "
                 f"episodes succeeded; {cfg.bag}: {summary['duration_s']:.1f} s recorded")
        for topic, n in sorted(summary["topics"].items()):
            progress(f"  {topic} [{summary['types'][topic]}]: {n}")
    return summary


def add_teach_args(p) -> None:
    """``edgefm-sim teach``'s arguments (sim_cli adds the subcommand)."""
    p.add_argument("--tasks", required=True, help=f"comma-separated ({','.join(TASKS)})")
    p.add_argument("--seeds", required=True, help=f"A-B (inclusive) or A,B,...: training seeds "
                   f"({TRAIN_SEEDS.start}-{TRAIN_SEEDS.stop - 1})")
    p.add_argument("--bag", required=True, help="the bag directory to write (new)")
    p.add_argument("--storage", choices=sorted(STORAGES), default="mcap", help="bag storage (default mcap, Jazzy's)")
    p.add_argument("--noise-m", type=float, default=0.0, help="the operator's xyz noise per command (m)")
    p.add_argument("--hesitate-per-s", type=float, default=0.0, help="the operator's hesitations per second")
    p.add_argument("--operator-seed", type=int, default=0, help="seed of the noise and hesitations")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: from the process id)")
    p.add_argument("--logs", default=None, help="keep the processes' logs here (default: kept only on failure)")
    p.add_argument("--allow-eval-seeds", action="store_true", help="teach on evaluation seeds too")


def cmd_teach(args) -> int:
    seeds = parse_seeds(args.seeds)
    outside = [s for s in seeds if s not in TRAIN_SEEDS]
    if outside and not args.allow_eval_seeds:
        print(f"edgefm-sim teach: seeds {outside[:5]} are not training seeds ({TRAIN_SEEDS.start}-"
              f"{TRAIN_SEEDS.stop - 1}); evaluation would see its own layouts (--allow-eval-seeds to go on)",
              file=sys.stderr)
        return 2
    cfg = TeachConfig(tasks=tuple(parse_tasks(args.tasks)), seeds=tuple(seeds), bag=args.bag, storage=args.storage,
                      noise_m=args.noise_m, hesitate_per_s=args.hesitate_per_s, operator_seed=args.operator_seed,
                      domain_id=args.domain_id)
    try:
        run_teach(cfg, workdir=args.logs, progress=lambda m: print(m, flush=True))
    except RuntimeError as e:
        print(f"edgefm-sim teach: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the processes are stopped, the recorder first: its bag is complete
        print(f"edgefm-sim teach: interrupted; {cfg.bag} holds the episodes recorded so far", file=sys.stderr)
        return 130
    return 0

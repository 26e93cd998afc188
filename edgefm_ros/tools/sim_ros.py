"""``edgefm-sim eval --exec ros``: the closed loop through the real node processes over real DDS.

sim_node (the simulated arm on the wall clock), vla_node and action_node run as separate processes, started
by their installed executables with one params file (config/sim.yaml plus this run's episodes, checkpoint,
delay): the replay session's process start (tools/graph.py), as ``ros2 launch`` would start them. The
policy nodes come up first; sim_node holds until this harness tells it to start (``wait_for_start``), so no
episode runs while the model loads. The harness records the commands, chunks, queue status, joint states,
episode events and diagnostics to a bag, and turns them into the shared report (edgefm_ros/sim/report.py).

    report = run_ros_eval(checkpoint, ["reach", "push"], range(1000, 1020))
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import yaml
from rosbags.rosbag2 import Reader

from edgefm_ros.dispatch.modes import check_mode
from edgefm_ros.sim.paths import default_checkpoint, share_file
from edgefm_ros.sim.report import EpisodeOutcome, make_report
from edgefm_ros.sim.rollout import checkpoint_tasks
from edgefm_ros.sim.tasks import TASKS
from edgefm_ros.tools.bag.analyze import percentiles, period_counts, read_run
from edgefm_ros.tools.bag.typestore import make_typestore
from edgefm_ros.tools.graph import EXEC_WITH_DEFAULT_SIGINT, ReplaySession

COMMAND_TOPIC = "/edgefm/command"
EVENTS_TOPIC = "/sim/events"
RESET_TOPIC = "/sim/reset"
SCENE_TOPIC, WRIST_TOPIC = "/scene/image_raw", "/wrist/image_raw"
RECORD_TOPICS = ("/edgefm/action_chunk", "/edgefm/queue_status", "/diagnostics", COMMAND_TOPIC, EVENTS_TOPIC,
                 "/joint_states", "/edgefm/route")
POLICY_NODES = ("vla_node", "action_node")


def graph_params(checkpoint: str, episodes: Sequence[str], *, delay_ms: float = 0.0, aggregate: str | None = None,
                 results_path: str = "", vlm_dir: str = "", config: str | Path | None = None,
                 engine_mode: str | None = None, extra: dict[str, dict] | None = None) -> dict:
    """Node parameters for one run: config/sim.yaml with this run's episodes, checkpoint and settings;
    ``engine_mode``: vla_node's engine mode (exact, fast, reference), else the config's; ``extra``: node ->
    parameters set on top (a node named only here, e.g. router_node, joins the graph)."""
    path = Path(config) if config else share_file("config", "sim.yaml")
    doc = yaml.safe_load(path.read_text())
    p = {n: dict(doc[n]["ros__parameters"]) for n in ("sim_node",) + POLICY_NODES}
    p["sim_node"].update(episodes=list(episodes), results_path=results_path, wait_for_start=True)
    p["vla_node"].update(checkpoint=str(checkpoint), vlm_dir=vlm_dir, inference_delay_ms=float(delay_ms))
    if engine_mode:
        p["vla_node"]["mode"] = check_mode(engine_mode, what="engine mode")
    if aggregate:
        p["action_node"]["aggregate"] = aggregate
    if p["action_node"].get("aggregate") == "rtc":  # the rtc merge needs chunks guided to continue the queue
        p["vla_node"]["rtc_enabled"] = True
    if os.geteuid() == 0:  # the robot's side keeps real time on a busy machine (a warning where not granted)
        p["action_node"].setdefault("realtime_priority", 50)
        p["sim_node"]["realtime_priority"] = p["sim_node"].get("realtime_priority") or 40
    for node, values in (extra or {}).items():  # a node joining the graph starts from config/sim.yaml's section
        p.setdefault(node, dict((doc.get(node) or {}).get("ros__parameters", {}))).update(values)
    return p


@dataclass
class Frames:
    """Camera frames the harness kept (every ``stride``-th), for the demo video."""

    stride: int = 2
    times: list = field(default_factory=list)
    scene: list = field(default_factory=list)
    wrist: list = field(default_factory=list)
    _n: int = 0
    _wrist_last: np.ndarray | None = None


def launch_available() -> bool:
    """``ros2 launch`` and this package's installed sim.launch.py are there."""
    if shutil.which("ros2") is None:
        return False
    try:  # ament_index_python: only in a ROS install
        from ament_index_python.packages import get_package_share_directory

        return (Path(get_package_share_directory("edgefm_ros")) / "launch" / "sim.launch.py").is_file()
    except Exception:  # noqa: BLE001 - not installed
        return False


class LoopGraph:
    """The node processes and this harness's own node (events, reset requests, optional frames).

    ``with LoopGraph(workdir, params, domain) as g: g.start(); g.wait_done(timeout)``

    mode "launch": one ``ros2 launch edgefm_ros sim.launch.py`` with this run's params file; "process": each
    node's executable started by the replay session (vla_node and action_node first, sim_node once they are
    active; nodes can be stopped and restarted one by one); "auto": launch where available."""

    def __init__(self, workdir: str | Path, params: dict, domain_id: int, frames: Frames | None = None,
                 progress: Callable[[str], None] | None = print, mode: str = "auto",
                 node_env: dict[str, dict[str, str]] | None = None):
        if mode not in ("auto", "launch", "process"):
            raise ValueError(f"mode {mode!r}: choose auto, launch or process")
        if node_env:
            mode = "process"  # a node's secret environment is never written to a launch's params file
        self.mode = ("launch" if launch_available() else "process") if mode == "auto" else mode
        self.workdir = Path(workdir)
        # the policy side: vla_node and action_node, and router_node where this run's params configure it
        self.policy_nodes = POLICY_NODES + (("router_node",) if "router_node" in params else ())
        nodes = () if self.mode == "launch" else self.policy_nodes
        self.session = ReplaySession(self.workdir, params, nodes, domain_id, RECORD_TOPICS, node_env=node_env)
        self.params, self.frames, self.progress = params, frames, progress
        self.launch: subprocess.Popen | None = None
        self.events: list[dict] = []
        self._cond = threading.Condition()

    def __enter__(self) -> "LoopGraph":
        # ROS where the loop runs: edgefm-demo's and edgefm-sim's parsers import this module without it
        from sensor_msgs.msg import Image
        from std_msgs.msg import String

        from edgefm_ros.ros import qos

        s = self.session.__enter__()
        try:
            n = s.node
            self._events_sub = n.create_subscription(String, EVENTS_TOPIC, self._on_event, qos.RELIABLE)
            self._reset_pub = n.create_publisher(String, RESET_TOPIC, qos.RELIABLE)
            if self.frames is not None:
                n.create_subscription(Image, SCENE_TOPIC, lambda m: self._on_frame("scene", m), qos.SENSOR)
                n.create_subscription(Image, WRIST_TOPIC, lambda m: self._on_frame("wrist", m), qos.SENSOR)
        except BaseException:
            s.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.launch is not None and self.launch.poll() is None:  # ros2 launch stops its nodes on SIGINT
            self.launch.send_signal(signal.SIGINT)
            try:
                self.launch.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.launch.pid, signal.SIGKILL)
                self.launch.wait(5)
        self.session.__exit__(*exc)

    def _start_launch(self) -> None:
        s = self.session
        v = self.params["vla_node"]
        cmd = ["ros2", "launch", "edgefm_ros", "sim.launch.py", f"params_file:={s.params_file}",
               f"checkpoint:={v['checkpoint']}", f"inference_delay_ms:={float(v.get('inference_delay_ms', 0.0))}",
               f"results_path:={self.params['sim_node'].get('results_path', '')}",
               f"use_router:={'true' if 'router_node' in self.params else 'false'}"]
        env = dict(os.environ, ROS_DOMAIN_ID=str(s.domain_id), PYTHONUNBUFFERED="1")
        with open(self.workdir / "launch.log", "ab") as log:
            # with SIGINT's default action restored: started from a background job (SIGINT ignored), ros2 launch
            # would ignore the SIGINT that stops it, and be killed at the bound instead
            self.launch = subprocess.Popen([sys.executable, "-c", EXEC_WITH_DEFAULT_SIGINT, *cmd], env=env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)

    # ---- observing ----------------------------------------------------------------------------------------
    def _on_event(self, msg) -> None:
        try:
            ev = json.loads(msg.data)
        except ValueError:
            return
        with self._cond:
            self.events.append(ev)
            self._cond.notify_all()
        if self.progress and ev.get("event") in ("success", "timeout", "reset"):
            done = sum(e["event"] in ("success", "timeout", "reset") for e in self.events)
            total = len(self.params["sim_node"]["episodes"])
            self.progress(f"[{done}/{total}] {ev['task']} seed {ev['seed']}: {ev['event']} after "
                          f"{ev['elapsed_s']:.2f}s")

    def _on_frame(self, key: str, msg) -> None:
        from edgefm_ros.ros.convert import image_msg_to_rgb, to_sec  # ROS, as in __enter__

        f = self.frames
        if key == "wrist":
            f._wrist_last = image_msg_to_rgb(msg)
            return
        f._n += 1
        if f._n % f.stride:
            return
        f.times.append(to_sec(msg.header.stamp))
        f.scene.append(image_msg_to_rgb(msg))
        f.wrist.append(f._wrist_last)

    def wait_event(self, pred: Callable[[dict], bool], timeout: float, since: int = 0) -> dict | None:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                hit = next((e for e in self.events[since:] if pred(e)), None)
                left = end - time.monotonic()
                if hit is not None or left <= 0:
                    return hit
                self._cond.wait(min(left, 0.2))

    # ---- running ------------------------------------------------------------------------------------------
    def start(self, ready_timeout: float = 180.0) -> None:
        """Policy nodes active, then sim_node started and told to begin (repeated until it does)."""
        from std_msgs.msg import String  # ROS, as in __enter__

        s = self.session
        if self.mode == "launch":
            self._start_launch()
            nodes = self.policy_nodes + ("sim_node",)

            def up():
                return all(s.diagnostics(n).get("state") == "active" for n in nodes)
            if not s.wait_for(lambda: up() or self.launch.poll() is not None, ready_timeout) or not up():
                raise RuntimeError(f"ros2 launch: nodes {[n for n in nodes if s.diagnostics(n).get('state') != 'active']}"
                                   f" not active (launch exit code {self.launch.poll()}); log {self.workdir / 'launch.log'}")
        else:
            s.wait_active(self.policy_nodes, timeout=ready_timeout)
            s.start_node("sim_node")
            if not s.wait_for(lambda: s.diagnostics("sim_node").get("state") == "active" or not s.alive("sim_node"),
                              ready_timeout) or not s.alive("sim_node"):
                raise RuntimeError(f"sim_node did not become active; log {self.workdir / 'sim_node.log'}")
        # One request once sim_node's reset subscription is matched (reliable: delivered from then on). A
        # second one only after a long silence: sent while an episode has just started, it would end that
        # episode as 'reset' (a loaded host once took 0.33 s to report the start; the old 0.2 s resend did it).
        # Both directions matched first: discovery is per endpoint, and an events subscription matched only after
        # the first episode began would miss that episode's start (its end then has no window).
        if not s.wait_for(lambda: self._reset_pub.get_subscription_count() > 0
                          and self._events_sub.get_publisher_count() > 0, ready_timeout):
            raise RuntimeError(f"sim_node's reset subscription or events publisher never matched (reset "
                               f"{self._reset_pub.get_subscription_count()}, events "
                               f"{self._events_sub.get_publisher_count()}); log {self.workdir / 'sim_node.log'}")
        for _ in range(6):
            self._reset_pub.publish(String(data=""))
            if self.wait_event(lambda e: e["event"] == "start", 10.0) is not None:
                return
        raise RuntimeError(f"sim_node did not start an episode; log {self.workdir / 'sim_node.log'}")

    def wait_done(self, timeout: float) -> bool:
        return self.wait_event(lambda e: e["event"] == "done", timeout) is not None


# ---- from the record to the report ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    task: str
    seed: int
    start: float
    end: float
    outcome: str
    time_to_success_s: float


def episode_windows(events: Iterable[dict]) -> list[Window]:
    """(start, end) of every finished episode from sim_node's events."""
    out, cur = [], None
    for e in events:
        if e["event"] == "start":
            cur = e
        elif e["event"] in ("success", "timeout", "reset") and cur is not None and e["episode"] == cur["episode"]:
            out.append(Window(cur["task"], int(cur["seed"]), float(cur["t"]), float(e["t"]), e["event"],
                              float(e.get("time_to_success_s", math.nan))))
            cur = None
    return out


def read_topic(bag: str | Path, topic: str) -> list[tuple[float, object]]:
    """(receive time s, message) of one topic in a recorded bag."""
    ts = make_typestore()
    out = []
    with Reader(str(bag)) as r:
        conns = [c for c in r.connections if c.topic == topic]
        for conn, t_ns, data in r.messages(connections=conns):
            out.append((t_ns * 1e-9, ts.deserialize_cdr(data, conn.msgtype)))
    return out


def joint_states(bag: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(stamps (n,), positions (n, 4)) of the recorded /joint_states."""
    rows = read_topic(bag, "/joint_states")
    t = np.array([m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for _, m in rows])
    return t, np.array([list(m.position) for _, m in rows], dtype=np.float64).reshape(len(rows), -1)


def outcomes_and_timing(run, windows: Sequence[Window], results: Sequence[dict], control_hz: float,
                        guard_s: float = 0.0) -> tuple[list[EpisodeOutcome], dict]:
    """Per-episode outcomes (commands, chunk boundaries) and the graph's timing over the episodes. Commands
    stamped within ``guard_s`` of an episode start are the old episode's (sim_node ignores them)."""
    cmd_t = np.asarray(run.cmd_stamp, dtype=np.float64)
    cmd_p = run.positions.reshape(len(cmd_t), -1) if len(cmd_t) else np.zeros((0, 4))
    recv = np.asarray(run.chunk_recv, dtype=np.float64)
    obs = np.asarray(run.chunk_stamp, dtype=np.float64)
    st_t = np.asarray(run.status_time, dtype=np.float64)
    st_u = np.asarray(run.status_underruns, dtype=np.float64)
    by_key = {(r["task"], int(r["seed"]), round(r["start_time"], 3)): r for r in results}
    outcomes, periods, lat, under_warm, ticks = [], [], [], 0, 0
    for w in windows:
        sel = (cmd_t >= w.start + guard_s) & (cmd_t <= w.end)
        cmds, ct = cmd_p[sel], cmd_t[sel]
        mine = (recv >= w.start) & (recv <= w.end) & (obs >= w.start)  # chunks of this episode
        bounds = sorted({int(np.searchsorted(ct, t)) for t in recv[mine] if np.searchsorted(ct, t) < len(ct)})
        lat.extend((np.asarray(run.chunk_inference)[mine] * 1e3).tolist())
        if len(ct) >= 2:
            periods.extend(np.diff(ct).tolist())
        # underruns after warm-up: from the episode's first command (its first chunk merged) to its end
        s_sel = (st_t >= (ct[0] if len(ct) else w.end)) & (st_t <= w.end)
        if s_sel.any():
            u = st_u[s_sel]
            under_warm += int(u[-1] - u[0])
            ticks += int(s_sel.sum())
        r = by_key.get((w.task, w.seed, round(w.start, 3)), {})
        extra = {k: r[k] for k in ("real_time_factor", "slipped_s", "max_physics_gap_ms", "rejected_commands")
                 if k in r}
        outcomes.append(EpisodeOutcome(w.task, w.seed, w.outcome == "success",
                                       w.time_to_success_s if w.outcome == "success" else math.nan,
                                       cmds if len(cmds) else np.zeros((0, 4)), tuple(bounds), extra))
    period = 1.0 / control_hz
    d = np.asarray(periods)
    err = percentiles(np.abs(d - period) * 1e3) if d.size else percentiles([])
    control = {"rate_hz": float(1.0 / d.mean()) if d.size else math.nan, "period_error_ms_p50": err["p50"],
               "period_error_ms_p99": err["p99"], "period_error_ms_max": err["max"],
               **period_counts(d, period),
               "commands": int(sum(len(o.commands) for o in outcomes))}
    total_under = int(st_u[-1] - st_u[0]) if st_u.size else 0
    rtf = [r["real_time_factor"] for r in results if r.get("real_time_factor") is not None]
    timing = {"control": control, "inference_latency_ms": percentiles(lat),
              "queue_underruns": {"after_warmup": under_warm, "total": total_under, "ticks": ticks},
              "simulation": {"real_time_factor_min": float(min(rtf)) if rtf else math.nan,
                             "real_time_factor_mean": float(np.mean(rtf)) if rtf else math.nan,
                             "slipped_s": float(sum(r.get("slipped_s", 0.0) for r in results)),
                             "max_physics_gap_ms": float(max((r.get("max_physics_gap_ms", 0.0) for r in results),
                                                             default=math.nan))}}
    return outcomes, timing


def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class RosRun:
    report: dict
    workdir: Path
    events: list
    frames: Frames | None
    run: object  # tools.bag.analyze.Run


def run_ros(checkpoint: str, episodes: Sequence[str], *, out_dir: str | Path, delay_ms: float = 0.0,
            aggregate: str | None = None, domain_id: int | None = None, frames: Frames | None = None,
            vlm_dir: str = "", progress: Callable[[str], None] | None = print, mode: str = "auto",
            engine_mode: str | None = None, extra: dict[str, dict] | None = None,
            node_env: dict[str, dict[str, str]] | None = None) -> RosRun:
    """Run ``episodes`` ('task:seed') through the node graph; the report and what was recorded. ``mode``: how
    the nodes start (graph_params for ``engine_mode`` and ``extra``); ``node_env``: a node's own environment
    (e.g. vla_node's cloud token)."""
    if not (Path(checkpoint) / "config.json").is_file():
        raise ValueError(f"checkpoint {checkpoint} holds no config.json")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "episodes.jsonl"
    if results_path.exists():
        results_path.unlink()
    params = graph_params(checkpoint, episodes, delay_ms=delay_ms, aggregate=aggregate,
                          results_path=str(results_path), vlm_dir=vlm_dir, engine_mode=engine_mode, extra=extra)
    timeout_s = sum(TASKS[e.rpartition(":")[0]].max_seconds + params["sim_node"]["settle_s"] + 1.0
                    for e in episodes) * 1.5 + 30.0
    domain = domain_id if domain_id is not None else 10 + os.getpid() % 90
    with LoopGraph(out / "run", params, domain, frames, progress, mode, node_env) as g:
        if progress:
            progress(f"starting {', '.join(g.policy_nodes)}, sim_node ({'ros2 launch' if g.mode == 'launch' else 'processes'}"
                     f", ROS_DOMAIN_ID {domain}, logs {out / 'run'}) ...")
        g.start()
        if not g.wait_done(timeout_s):
            raise RuntimeError(f"the episodes did not finish within {timeout_s:.0f}s; logs in {out / 'run'}")
        time.sleep(0.3)
        events = list(g.events)
    run = read_run(str(g.session.record_path), COMMAND_TOPIC)
    control_hz = float(params["action_node"]["control_rate_hz"])
    outcomes, timing = outcomes_and_timing(run, episode_windows(events), read_results(results_path), control_hz,
                                           float(params["sim_node"].get("command_guard_s", 0.0)))
    report = make_report(outcomes, exec_mode="ros", checkpoint=str(checkpoint), control_hz=control_hz,
                         timing=timing, settings={"delay_ms": delay_ms, "aggregate":
                                                  params["action_node"]["aggregate"], "episodes": list(episodes),
                                                  "chunk_size_threshold":
                                                  params["action_node"]["chunk_size_threshold"], "started_by": g.mode,
                                                  "engine_mode": params["vla_node"].get("mode", "exact")})
    return RosRun(report, out, events, frames, run)


def run_ros_eval(checkpoint: str | None, tasks: Sequence[str] | None, seeds: Iterable[int], delay_ms: float = 0.0,
                 aggregate: str | None = None, out_dir: str | Path | None = None,
                 progress: Callable[[str], None] | None = print, engine_mode: str | None = None,
                 domain_id: int | None = None) -> dict:
    """The report of ``tasks`` (None: the tasks the checkpoint was trained on, as for --exec sync) x ``seeds``
    through the node graph (``edgefm-sim eval --exec ros``); ``out_dir`` keeps the logs, the record and
    sim_node's episode results (else a temp dir); ``domain_id``: the graph's ROS_DOMAIN_ID (None: from the
    process id)."""
    ckpt = str(checkpoint or default_checkpoint())
    tasks = list(tasks) if tasks else checkpoint_tasks(ckpt)
    seeds = list(seeds)
    episodes = [f"{t}:{s}" for s in seeds for t in tasks]  # seed-major: every task early in the run
    with contextlib.ExitStack() as stack:
        if out_dir is None:
            out_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="edgefm-sim-ros-"))
        return run_ros(ckpt, episodes, out_dir=out_dir, delay_ms=delay_ms, aggregate=aggregate,
                       progress=progress, engine_mode=engine_mode, domain_id=domain_id).report

"""A replay session: the node graph, a bag replayed into its inputs and its outputs recorded, all on one ROS
domain. Used by the demo, the integration and fault tests, and the benchmark.

The graph (vla_node, action_node, router_node) starts with ``ros2 launch edgefm_ros edgefm.launch.py
params_file:=...`` where ``ros2 launch`` is installed, else each node executable as a process with
``--ros-args --params-file`` (nodes outside that graph, and nodes given an environment of their own, always
start as processes). ``start_node`` after ``stop_node`` (fault tests) restarts a node as a process.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from edgefm_ros.housekeeping import shm
from edgefm_ros.housekeeping.signals import sigterm_exits

# the nodes edgefm.launch.py starts
LAUNCH_GRAPH = ("vla_node", "action_node", "router_node")
OUTPUT_TOPICS = ("edgefm/action_chunk", "edgefm/queue_status", "edgefm/route", "/diagnostics")


def node_command(name: str) -> list[str]:
    """The installed node executable (colcon install space), else ``python -m edgefm_ros.nodes.<name>``."""
    try:
        from ament_index_python.packages import get_package_prefix

        exe = Path(get_package_prefix("edgefm_ros")) / "lib" / "edgefm_ros" / name
        if exe.is_file() and os.access(exe, os.X_OK):
            return [sys.executable, str(exe)]
    except Exception:
        pass
    return [sys.executable, "-m", f"edgefm_ros.nodes.{name}"]


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # rcl's params parser refuses YAML anchors/aliases
        return True


def params_yaml(params: Mapping[str, Mapping]) -> str:
    """A ``--params-file`` document: ``node: {ros__parameters: {...}}`` per node."""
    doc = {k: {"ros__parameters": {n: list(v) if isinstance(v, tuple) else v for n, v in p.items()}}
           for k, p in params.items()}
    return yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False)


def installed_executable(name: str) -> Path | None:
    cmd = node_command(name)
    return Path(cmd[1]) if len(cmd) == 2 else None


class ReplaySession:
    """Context manager; everything it writes goes under ``workdir`` (params.yaml, <node>.log or launch.log,
    record/). ``node_env``: extra environment per node (e.g. vla_node's EDGEFM_CLOUD_TOKEN: never in
    params.yaml; such nodes start as processes). ``launch``: start the graph with ``ros2 launch`` (None:
    where it is installed)."""

    def __init__(self, workdir: str | Path, params: Mapping[str, Mapping], nodes: Sequence[str],
                 domain_id: int, record_topics: Sequence[str] = OUTPUT_TOPICS, storage: str = "sqlite3",
                 node_env: Mapping[str, Mapping[str, str]] | None = None, launch: bool | None = None):
        if not 0 <= domain_id <= 101:
            raise ValueError(f"domain_id must be in 0..101, got {domain_id}")
        self.workdir = Path(workdir)
        self.params, self.nodes, self.domain_id = params, tuple(nodes), domain_id
        self.record_topics = tuple(record_topics)
        self.storage = storage
        self.node_env = {k: dict(v) for k, v in (node_env or {}).items()}  # node -> extra environment (secrets)
        self.procs: dict[str, subprocess.Popen] = {}
        self.record_path = self.workdir / "record"
        self._diag: dict[str, dict] = {}  # node name -> latest diagnostic values
        self._diag_lock = threading.Lock()
        graph = [n for n in self.nodes if n in LAUNCH_GRAPH and n not in self.node_env]
        if launch is None:
            from edgefm_ros.tools.launch_cycles import ros2_launch_available

            launch = {"vla_node", "action_node"} <= set(graph) and ros2_launch_available()
        self.launched_nodes = tuple(graph) if launch else ()
        self.launched = None  # launch_cycles.LaunchedGraph once started

    # ---- lifecycle --------------------------------------------------------------------------------------
    def __enter__(self) -> "ReplaySession":
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        from edgefm_ros.ros import qos
        from edgefm_ros.ros.diagnostics import DiagnosticArray
        from edgefm_ros.tools.bag.record import Recorder, RecordConfig

        self._sigterm = sigterm_exits()
        self._sigterm.__enter__()  # SIGTERM of the tool stops the nodes it started, as Ctrl-C does
        cleaned = shm.clean()  # what earlier runs killed by SIGKILL or the OOM killer left in /dev/shm
        if cleaned.removed:
            print(f"before the run: {cleaned.summary()}", flush=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.record_path.exists():
            shutil.rmtree(self.record_path)
        self.params_file = self.workdir / "params.yaml"
        self.params_file.write_text(params_yaml(self.params))
        self.context = Context()
        rclpy.init(context=self.context, domain_id=self.domain_id)
        self.node = rclpy.create_node("edgefm_replay_session", context=self.context)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, qos.DIAGNOSTICS)
        self.recorder = Recorder(self.node, RecordConfig(str(self.record_path), self.record_topics, self.storage))
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spin = threading.Thread(target=self._spin_loop, daemon=True)
        self._spin.start()
        if self.launched_nodes:
            from edgefm_ros.tools.launch_cycles import LaunchedGraph

            self.launched = LaunchedGraph("edgefm.launch.py", {
                "params_file": str(self.params_file),
                "use_router": str("router_node" in self.launched_nodes).lower()},
                self.workdir / "launch.log", {"ROS_DOMAIN_ID": str(self.domain_id)})
        for name in self.nodes:
            if name not in self.launched_nodes:
                self.start_node(name)
        return self

    def _spin_loop(self) -> None:
        from edgefm_ros.ros.spin import spin_until_shutdown

        spin_until_shutdown(self.executor, self.context, period_s=0.1)

    def start_node(self, name: str) -> subprocess.Popen:
        from edgefm_ros.ros.spin import EXIT_WITH_PARENT_ENV  # rclpy, loaded lazily like the rest of the session's

        # EXIT_WITH_PARENT: a node ends with this tool, even one killed by SIGKILL (no orphan keeps running)
        env = dict(os.environ, ROS_DOMAIN_ID=str(self.domain_id), PYTHONUNBUFFERED="1",
                   **{EXIT_WITH_PARENT_ENV: "1", **self.node_env.get(name, {})})
        log = open(self.workdir / f"{name}.log", "ab")
        cmd = node_command(name) + ["--ros-args", "--params-file", str(self.params_file)]
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()
        return self.procs[name]

    def _launched_pid(self, name: str) -> int | None:
        if self.launched is None or name in self.procs or name not in self.launched_nodes:
            return None
        return self.launched.started().get(name)

    def stop_node(self, name: str, sig: int = signal.SIGINT, timeout: float = 10.0) -> int | None:
        pid = self._launched_pid(name)
        if pid is not None:
            return self._stop_launched(name, pid, sig, timeout)
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return None if p is None else p.returncode
        p.send_signal(sig)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait(5)

    def _stop_launched(self, name: str, pid: int, sig: int, timeout: float) -> int | None:
        """Signal a node ``ros2 launch`` started; its exit code as launch reports it."""
        from edgefm_ros.tools.launch_cycles import _alive

        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        end = time.monotonic() + timeout
        while time.monotonic() < end and pid not in self.launched.reported_exits():
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        return self.launched.reported_exits().get(pid)

    def __exit__(self, *exc) -> None:
        for name in list(self.procs):
            self.stop_node(name)
        if self.launched is not None:
            self.launch_result = self.launched.stop(signal.SIGINT, "launch", bound_s=15.0)
        time.sleep(0.3)
        self.recorder.close()
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._spin.join(timeout=2.0)
        self.context.destroy()  # the participant deleted now, not when the collector gets to it
        shm.clean()  # a node that had to be killed at the bound left its files
        self._sigterm.__exit__(None, None, None)

    # ---- observing --------------------------------------------------------------------------------------
    def _on_diag(self, msg) -> None:
        with self._diag_lock:
            for s in msg.status:
                node = s.name.split(":")[0]
                self._diag[node] = {"level": int(s.level[0]) if isinstance(s.level, bytes) else int(s.level),
                                    "message": s.message, **{kv.key: kv.value for kv in s.values}}

    def diagnostics(self, node: str) -> dict:
        with self._diag_lock:
            return dict(self._diag.get(node, {}))

    def wait_for(self, predicate, timeout: float, poll: float = 0.1) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(poll)
        return bool(predicate())

    def wait_active(self, nodes: Sequence[str] | None = None, timeout: float = 60.0) -> None:
        """Until every node's diagnostics say ``state: active``; RuntimeError naming the laggards."""
        nodes = tuple(nodes or self.nodes)

        def ready():
            return all(self.diagnostics(n).get("state") == "active" for n in nodes)

        def done():
            return ready() or any(not self.alive(n) for n in nodes)

        if not self.wait_for(done, timeout) or not ready():
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if self.launched is not None:
                codes = self.launched.reported_exits()
                dead.update({n: codes[p] for n, p in self.launched.started().items() if p in codes})
            lag = [n for n in nodes if self.diagnostics(n).get("state") != "active"]
            raise RuntimeError(f"nodes {lag} not active (exited with codes {dead}); logs in {self.workdir}")

    def alive(self, name: str) -> bool:
        if self.launched is not None and name in self.launched_nodes and name not in self.procs:
            from edgefm_ros.tools.launch_cycles import _alive

            pid = self.launched.started().get(name)
            return self.launched.running() if pid is None else _alive(pid)  # None: launch is starting it
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    # ---- replaying --------------------------------------------------------------------------------------
    def player(self, bag: str, **kw):
        from edgefm_ros.tools.bag.play import Player, PlayConfig

        return Player(self.node, PlayConfig(bag, **kw))

    def play(self, bag: str, stop_after_s: float | None = None, **kw) -> int:
        """Replay ``bag`` (PlayConfig keywords); returns messages published."""
        p = self.player(bag, **kw)
        stop = threading.Event()
        timer = threading.Timer(stop_after_s, stop.set) if stop_after_s else None
        if timer:
            timer.start()
        try:
            return p.play(stop)
        finally:
            if timer:
                timer.cancel()

"""Starting the node graph and replaying into it: what the demo, launch_cycles, sim_ros and teach share.

- ``ros2 launch``: ``LaunchedGraph`` runs one ``ros2 launch edgefm_ros <file> <args>`` in a session of its own,
  parses its log for the processes it started and how each ended, and stops it (``StopResult``);
- node processes: ``node_command`` (the installed executable, else ``python -m``), ``params_yaml`` (a
  ``--params-file`` document), ``pid_alive`` (a pid running, not a zombie);
- ``ReplaySession``: the graph (vla_node, action_node, router_node) on one ROS domain, a bag replayed into
  its inputs and its outputs recorded; /dev/shm cleaned of dead participants' files before and after;
- the replay graph's node parameters (``choose_model``, ``node_params``): the demo's and launch_cycles'.

The graph starts with ``ros2 launch edgefm_ros edgefm.launch.py params_file:=...`` where ``ros2 launch`` is
installed, else each node executable as a process with ``--ros-args --params-file`` (nodes outside that graph,
and nodes given an environment of their own, always start as processes). ``start_node`` after ``stop_node``
(fault tests) restarts a node as a process.

rclpy, the ROS message packages and rosbags are imported where a session runs or a bag plays: ``edgefm-sim``
imports this module (through tools/teach.py) and its parser runs without ROS.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from edgefm_ros.housekeeping import shm
from edgefm_ros.housekeeping.signals import sigterm_exits
from edgefm_ros.tools.bag.synth import JOINTS

# ---- ros2 launch ----------------------------------------------------------------------------------------

# `ros2 launch` reports its processes in these words (launch/actions/execute_local.py)
STARTED = re.compile(r"\[INFO\] \[([\w.-]+)-(\d+)\]: process started with pid \[(\d+)\]")
CLEAN = re.compile(r"\[([\w.-]+)-(\d+)\]: process has finished cleanly \[pid (\d+)\]")
DIED = re.compile(r"\[([\w.-]+)-(\d+)\]: process has died \[pid (\d+), exit code (-?\d+)")
# what each of our nodes logs once it is up (lifecycle nodes: activated)
READY = {"vla_node": "warm-up done", "action_node": "active: control loop running",
         "router_node": "active: deciding"}
CRASH_WORDS = ("malloc", "Aborted", "Segmentation fault", "core dumped", "Traceback", "double free")
# A child started with SIGINT ignored (a background job of a non-interactive shell) would ignore Ctrl-C:
# `ros2 launch` runs with the default disposition restored.
EXEC_WITH_DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                             "os.execvp(sys.argv[1], sys.argv[1:])")


def ros2_launch_available() -> bool:
    """The ``ros2`` command with its launch verb (installed from ../shared/ros2-jazzy or a ROS install)."""
    if shutil.which("ros2") is None:
        return False
    try:  # the probe: ROS's launch packages are optional (a pip-only install has none)
        import launch_ros  # noqa: F401
        import ros2launch  # noqa: F401
    except ImportError:
        return False
    return True


def become_subreaper() -> bool:
    """Orphaned descendants are reparented to this process (prctl PR_SET_CHILD_SUBREAPER); False when not
    on Linux."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pid_alive(pid: int) -> bool:
    """Running (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@dataclass
class StopResult:
    signal: str
    target: str
    launch_rc: int | None  # None: still running at the bound
    codes: dict[str, int | None]  # process name -> exit code (None: unknown, still running at the bound)
    survivors: list[str]  # processes still running at the bound
    seconds: float  # signal -> the last process gone
    crash_lines: list[str] = field(default_factory=list)

    def abnormal(self) -> list[str]:
        bad = [f"{n}: exit {c}" for n, c in self.codes.items() if c not in (0, None)]
        bad += [f"{n}: still running {self.seconds:.1f}s after {self.signal}" for n in self.survivors]
        bad += [f"{n}: exit code unknown" for n, c in self.codes.items() if c is None and n not in self.survivors]
        if self.signal == "SIGINT" and self.launch_rc != 0:
            bad.append(f"ros2 launch: exit {self.launch_rc}")
        return bad


class LaunchedGraph:
    """One ``ros2 launch edgefm_ros <file> <args>`` in a session of its own; output to ``log``.
    ``reap_all``: collect every child of this process (a subreaper's orphans); only where no other code of
    the process waits for children of its own."""

    def __init__(self, launch_file: str, args: Mapping[str, str], log: str | Path,
                 env: Mapping[str, str] | None = None, package: str = "edgefm_ros", reap_all: bool = False):
        self.reap_all = reap_all
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["ros2", "launch", package, launch_file] + [f"{k}:={v}" for k, v in args.items()]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", EXEC_WITH_DEFAULT_SIGINT, *cmd],
                                         env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.reaped: dict[int, int] = {}  # pid -> exit code, of orphans reaped by this (subreaper) process
        self.launch_rc: int | None = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def started(self) -> dict[str, int]:
        """process name (vla_node, edgefm-bag ...) -> pid, as ``ros2 launch`` reported them; a second process of
        the same executable is "<name>-<launch's number>"; a respawned process keeps its name (latest pid)."""
        out, keys = {}, {}
        for m in STARTED.finditer(self.text()):
            key = keys.setdefault((m.group(1), m.group(2)), m.group(1) if m.group(1) not in out
                                  else f"{m.group(1)}-{m.group(2)}")
            out[key] = int(m.group(3))
        return out

    def pids(self, name: str) -> list[int]:
        """Every pid ``ros2 launch`` started for process ``name`` (a respawned node has several), in order."""
        return [int(m.group(3)) for m in STARTED.finditer(self.text()) if m.group(1) == name]

    def all_pids(self) -> list[int]:
        return [int(m.group(3)) for m in STARTED.finditer(self.text())] + [self.proc.pid]

    def ready_count(self, name: str) -> int:
        """How many times process ``name`` logged its READY words (once per start)."""
        return len(re.findall(rf"\[{re.escape(name)}-\d+\] .*{re.escape(READY[name])}", self.text()))

    def reported_exits(self) -> dict[int, int]:
        """pid -> exit code, as ``ros2 launch`` reported them."""
        text = self.text()
        out = {int(m.group(3)): 0 for m in CLEAN.finditer(text)}
        out.update({int(m.group(3)): int(m.group(4)) for m in DIED.finditer(text)})
        return out

    def running(self) -> bool:
        self._poll()
        return self.launch_rc is None

    def _poll(self) -> None:
        if self.launch_rc is None and self.proc.pid in self.reaped:
            self.launch_rc = self.reaped[self.proc.pid]
        elif self.launch_rc is None:
            try:
                pid, status = os.waitpid(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = 0, 0
            if pid:
                self.launch_rc = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.launch_rc
        if self.reap_all:
            self._reap_orphans()

    def _reap_orphans(self) -> None:
        """Collect any other child (an orphan reparented to a subreaper)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            code = os.waitstatus_to_exitcode(status)
            self.reaped[pid] = code
            if pid == self.proc.pid:
                self.launch_rc = code
                self.proc.returncode = code

    def wait_ready(self, names: Sequence[str], timeout: float) -> None:
        """Until every process in ``names`` logged its READY words; RuntimeError naming the laggards (and the
        processes that exited) otherwise."""
        end = time.monotonic() + timeout
        while True:
            text = self.text()
            lag = [n for n in names if not re.search(rf"\[{re.escape(n)}-\d+\] .*{re.escape(READY[n])}", text)]
            if not lag:
                return
            dead = self.reported_exits()
            if dead or not self.running() or time.monotonic() > end:
                raise RuntimeError(f"{lag} not up after {timeout:.0f}s (exited: {dead}, launch rc "
                                   f"{self.launch_rc}); log {self.log}")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGINT, target: str = "launch", bound_s: float = 15.0) -> StopResult:
        """Send ``sig`` to the ``ros2 launch`` process (target "launch") or to its whole process group
        ("group": a terminal's Ctrl-C), wait until every process it started is gone or ``bound_s`` passed
        (then they are killed), and say how each ended."""
        if target not in ("launch", "group"):
            raise ValueError(f"target must be 'launch' or 'group', got {target!r}")
        started = self.started()
        t0 = time.monotonic()
        try:
            if target == "group":
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass
        while time.monotonic() - t0 < bound_s:
            if not self.running() and not any(pid_alive(p) for p in started.values()):
                break
            time.sleep(0.05)
        seconds = time.monotonic() - t0
        self._poll()
        survivors = [n for n, p in started.items() if pid_alive(p)]
        for n in survivors:
            try:
                os.kill(started[n], signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.running():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)
            self._poll()
        time.sleep(0.2)
        self._poll()
        reported = self.reported_exits()
        codes = {n: self.reaped.get(p, reported.get(p)) for n, p in started.items()}
        crash = [ln for ln in self.text().splitlines() if any(w in ln for w in CRASH_WORDS)]
        return StopResult(signal.Signals(sig).name, target, self.launch_rc, codes, survivors, seconds, crash)


# ---- node processes and the replay session ------------------------------------------------------------

# the nodes edgefm.launch.py starts
LAUNCH_GRAPH = ("vla_node", "action_node", "router_node")
OUTPUT_TOPICS = ("edgefm/action_chunk", "edgefm/queue_status", "edgefm/route", "/diagnostics")


def node_command(name: str) -> list[str]:
    """The installed node executable (colcon install space), else ``python -m edgefm_ros.nodes.<name>``."""
    try:  # ament_index_python: only in a ROS install
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
            launch = {"vla_node", "action_node"} <= set(graph) and ros2_launch_available()
        self.launched_nodes = tuple(graph) if launch else ()
        self.launched: LaunchedGraph | None = None  # once started

    # ---- lifecycle --------------------------------------------------------------------------------------
    def __enter__(self) -> "ReplaySession":
        # ROS (rclpy, messages) only once a session runs: see the module's docstring
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
            self.launched = LaunchedGraph("edgefm.launch.py", {
                "params_file": str(self.params_file),
                "use_router": str("router_node" in self.launched_nodes).lower()},
                self.workdir / "launch.log", {"ROS_DOMAIN_ID": str(self.domain_id)})
        for name in self.nodes:
            if name not in self.launched_nodes:
                self.start_node(name)
        return self

    def _spin_loop(self) -> None:
        from edgefm_ros.ros.spin import spin_until_shutdown  # rclpy, as in __enter__

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
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        end = time.monotonic() + timeout
        while time.monotonic() < end and pid not in self.launched.reported_exits():
            time.sleep(0.05)
        if pid_alive(pid):
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
            pid = self.launched.started().get(name)
            return self.launched.running() if pid is None else pid_alive(pid)  # None: launch is starting it
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    # ---- replaying --------------------------------------------------------------------------------------
    def player(self, bag: str, **kw):
        from edgefm_ros.tools.bag.play import Player, PlayConfig  # rosbags (the tools extra), where a bag plays

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


# ---- the replay graph's node parameters (the demo's, launch_cycles') ------------------------------------

COMMAND_TOPIC = "/edgefm/command"
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
DEMO_LINK_MBPS = 100.0  # router_node's static link in --cloud mode (a good LAN/Wi-Fi link)


@dataclass(frozen=True)
class Model:
    checkpoint: str
    vlm_dir: str  # "" when the checkpoint resolves its own
    origin: str  # how it was chosen, for the summary
    random_weights: bool
    vision_position_ids: str = "auto"  # --vision-position-ids, passed to vla_node and the cloud tier


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgefm_ros"


def choose_model(checkpoint: str | None, vlm: str | None, cameras: int, hw: tuple[int, int],
                 vision_position_ids: str = "auto") -> Model:
    if checkpoint:
        if not (Path(checkpoint) / "config.json").is_file():
            raise ValueError(f"--checkpoint {checkpoint} holds no config.json")
        readme = Path(checkpoint) / "README.md"
        random = readme.is_file() and "RANDOM WEIGHTS" in readme.read_text()
        return Model(checkpoint, vlm or "", "local checkpoint (--checkpoint)", random, vision_position_ids)
    out = cache_dir() / f"demo-smolvla-tiny-seed0-{cameras}cam-{hw[0]}x{hw[1]}"
    try:  # torch, only where a model is chosen (see the module's docstring)
        from edgefm_ros.training.random_checkpoint import make_checkpoint

        if not (out / "model.safetensors").is_file():
            make_checkpoint(out, arch="tiny", seed=0, cameras=cameras, raw_hw=hw)
        return Model(str(out), "", f"demo checkpoint (edgefm-vla make-checkpoint, cached in {out})", True,
                     vision_position_ids)
    except ImportError:
        pass
    ref = REFERENCE / "smolvla-tiny"
    if (ref / "config.json").is_file():
        return Model(str(ref), str(REFERENCE / "vlm" / "smolvlm-tiny"), "tiny reference checkpoint (../shared)", True,
                     vision_position_ids)
    raise ValueError("no model: pass --checkpoint DIR (a LeRobot SmolVLA checkpoint)")


def model_spec(m: Model):
    from edgefm_ros.runtime.checkpoint import load_checkpoint  # torch, as in choose_model

    return load_checkpoint(m.checkpoint, m.vlm_dir or None).config


def demo_router_config() -> str:
    """config/router_demo.yaml: the source tree's, else the installed share's."""
    path = Path(__file__).resolve().parents[2] / "config" / "router_demo.yaml"
    if not path.is_file():
        try:  # ament_index_python: only in a ROS install
            from ament_index_python.packages import get_package_share_directory

            path = Path(get_package_share_directory("edgefm_ros")) / "config" / "router_demo.yaml"
        except Exception:  # noqa: BLE001 - not installed: say what is missing below
            pass
    if not path.is_file():
        raise FileNotFoundError(f"demo router config not found at {path}")
    return str(path)


@dataclass(frozen=True)
class Cloud:
    """The cloud tier the demo started (--cloud)."""

    url: str
    log: str
    shadow_log: str  # "" when shadow mode is off


class LoopbackCloud:
    """``edgefm-cloud serve`` of ``checkpoint`` on a free loopback port (exact mode, one thread, a bearer token of
    this run only: 192 random bits), in a process group of its own, its output appended to ``log_path``. The
    token goes to the server, and to vla_node, through the environment, never a command line or params file.

    ``kill()`` ends the whole group at once with SIGKILL (a crash: the supervisor, MLServer, nginx's master and
    workers); ``start()`` serves again on the same port and token, so a client's configured ``url`` works again;
    ``freeze()`` / ``thaw()`` stop and continue the group (SIGSTOP / SIGCONT: a server that hangs);
    ``stop()`` (and the end of a ``with`` block) asks the supervisor to stop both servers (SIGTERM)."""

    def __init__(self, checkpoint: str, log_path: Path, vlm: str | None = None, vision_position_ids: str = "auto",
                 progress=print, ready_timeout_s: float = 300.0):
        from edgefm_ros.cloud.server.settings import free_port  # the cloud extra, where a cloud tier runs

        self.token = secrets.token_urlsafe(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path, self.progress, self.ready_timeout_s = Path(log_path), progress, ready_timeout_s
        self.cmd = [sys.executable, "-m", "edgefm_ros.cloud.cli", "serve", "--checkpoint", checkpoint, "--mode",
                    "exact", "--vision-position-ids", vision_position_ids, "--host", "127.0.0.1", "--port",
                    str(self.port), "--threads", "1", "--ready-timeout", str(ready_timeout_s)]
        self.cmd += ["--vlm", vlm] if vlm else []
        self.proc: subprocess.Popen | None = None
        self._tmp: str | None = None  # the tier's TMPDIR: its run directory, which a SIGKILL leaves behind

    def __enter__(self) -> "LoopbackCloud":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> float:
        """Starts the tier and returns once its public endpoint answers ready: the seconds that took."""
        from edgefm_ros.cloud.client.base import TOKEN_ENV  # as in __init__
        from edgefm_ros.cloud.server.serve import _die_with_parent, url_ok

        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"the cloud tier on port {self.port} is already running (pid {self.proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.progress(f"starting the cloud tier on loopback port {self.port} (log {self.log_path}) ...")
        t0 = time.monotonic()
        # SIGTERM when this process dies, so no orphan keeps the port; not from another thread (a restart of a
        # fault schedule): the kernel sends it when the thread that started the child ends
        main = threading.current_thread() is threading.main_thread()
        self._tmp = tempfile.mkdtemp(prefix="edgefm-lc-")  # short: nginx's unix socket path lives in it
        with open(self.log_path, "ab") as log:
            env = dict(os.environ, TMPDIR=self._tmp, **{TOKEN_ENV: self.token})
            self.proc = subprocess.Popen(self.cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent if main else None)
        while not url_ok(f"{self.url}/v2/health/ready"):
            if self.proc.poll() is not None or time.monotonic() - t0 > self.ready_timeout_s:
                self.kill()
                raise RuntimeError(f"the cloud tier on port {self.port} did not become ready (exit code "
                                   f"{self.proc.returncode}); log {self.log_path}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def kill(self) -> None:
        """SIGKILL to the whole process group, as a crash; returns once the supervisor is gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def freeze(self) -> None:
        """SIGSTOP to the whole process group: a server that hangs. The kernel still accepts connections into
        the listening sockets' backlogs, and nothing answers them until ``thaw()``."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the cloud tier on port {self.port} is not running: nothing to freeze")
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT to the whole process group (after ``freeze()``); the server works through what queued."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self, grace_s: float = 20.0) -> None:
        self.thaw()  # a frozen group would not hear SIGTERM
        if self.proc is None or self.proc.poll() is not None:
            return self.kill()  # the group's stragglers, if any
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


@contextlib.contextmanager
def loopback_cloud(checkpoint: str, log_path: Path, vlm: str | None = None, vision_position_ids: str = "auto",
                   progress=print):
    """A ``LoopbackCloud`` for the ``with`` block: yields (url, token)."""
    with LoopbackCloud(checkpoint, log_path, vlm, vision_position_ids, progress) as cloud:
        yield cloud.url, cloud.token


def node_params(m: Model, cfg, args, cloud: Cloud | None = None) -> dict:
    cams = cfg.camera_keys
    vla = dict(checkpoint=m.checkpoint, vlm_dir=m.vlm_dir, vision_position_ids=m.vision_position_ids, threads=1,
               camera_topics=[f"/camera{i + 1}/image_raw/compressed" if i % 2 else f"/camera{i + 1}/image_raw"
                              for i in range(len(cams))],
               camera_keys=list(cams), joint_states_topic="/joint_states",
               state_joint_names=list(JOINTS[:cfg.state_dim]),
               instruction_topic="/instruction", action_rate_hz=args.action_rate, max_observation_age_s=0.5,
               diagnostics_period_s=0.5, autostart=True)
    action = dict(control_rate_hz=args.control_rate, joint_names=list(JOINTS[:cfg.action_dim]),
                  command_type="joint_trajectory", command_topic=COMMAND_TOPIC, aggregate=args.aggregate,
                  chunk_size_threshold=0.5, diagnostics_period_s=0.5, autostart=True,
                  realtime_priority=50 if os.geteuid() == 0 else 0)
    out = {"vla_node": vla, "action_node": action}
    if router_available() and not args.no_router:
        out["router_node"] = dict(camera_topics=vla["camera_topics"], camera_keys=list(cams),
                                  instruction_topic="/instruction", rate_hz=2.0, diagnostics_period_s=0.5)
    if cloud is not None:
        names = demo_candidates()
        vla.update(cloud_url=cloud.url, shadow_fraction=args.shadow if cloud.shadow_log else 0.0,
                   shadow_log=cloud.shadow_log, shadow_edge_candidate=names["edge"],
                   shadow_cloud_candidate=names["cloud"])
        out["router_node"].update(config_path=demo_router_config(), static_bandwidth_mbps=DEMO_LINK_MBPS,
                                  static_rtt_s=0.005)
    return out


def demo_candidates() -> dict[str, str]:
    """placement -> candidate name in the demo router config (its edge_only / cloud_only)."""
    from edgefm_ros.routing.config import load_router_config  # cv2 (routing features), for --cloud only

    cfg = load_router_config(demo_router_config())
    return {"edge": cfg.edge_only, "cloud": cfg.cloud_only}


def router_available() -> bool:
    return importlib.util.find_spec("edgefm_ros.nodes.router_node") is not None and \
        installed_executable("router_node") is not None

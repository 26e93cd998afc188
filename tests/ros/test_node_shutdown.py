"""Every node exits 0 on SIGINT and on SIGTERM in every lifecycle state: unconfigured, inactive, active,
during inference, and with a cloud call in flight. Each case runs the installed node executable as a
process (autostart false), drives its lifecycle over the real change_state service, sends the signal and
checks the exit code, the bound, and that the node said why it stopped."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from edgefm_ros.housekeeping import shm
from replay_helpers import CAMERAS, JOINTS, node_params

BOUND_S = 12.0  # signal -> exit (launch would send SIGTERM after 5 s and SIGKILL after 10 s)
RNG = np.random.default_rng()


class Driver:
    """A test node: lifecycle transitions of the node under test, and its inputs."""

    def __init__(self, domain_id: int):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from edgefm_ros.msg import QueueStatus, RouteDecision
        from edgefm_ros.ros import qos
        from edgefm_ros.ros.spin import spin_until_shutdown

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("edgefm_shutdown_driver", context=self.context)
        self.pubs = {"image": self.node.create_publisher(Image, CAMERAS[0], qos.SENSOR),
                     "jpeg": self.node.create_publisher(CompressedImage, CAMERAS[1], qos.SENSOR),
                     "state": self.node.create_publisher(JointState, "/joint_states", qos.SENSOR),
                     "task": self.node.create_publisher(String, "/instruction", qos.LATCHED),
                     "status": self.node.create_publisher(QueueStatus, "edgefm/queue_status", qos.RELIABLE),
                     "route": self.node.create_publisher(RouteDecision, "edgefm/route", qos.RELIABLE)}
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=spin_until_shutdown, args=(self.executor, self.context), daemon=True)
        self._thread.start()

    def _call(self, srv_type, service: str, request, timeout: float):
        """One service call; None when no answer came within ``timeout`` (a reply sent before the client's
        reply reader was discovered is lost: the caller asks again)."""
        client = self.node.create_client(srv_type, service)
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                return None
            future = client.call_async(request)
            end = time.monotonic() + timeout
            while not future.done() and time.monotonic() < end:
                time.sleep(0.05)
            return future.result() if future.done() else None
        finally:
            self.node.destroy_client(client)

    def state(self, node: str, timeout: float = 30.0) -> str:
        from lifecycle_msgs.srv import GetState

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r = self._call(GetState, f"/{node}/get_state", GetState.Request(), 5.0)
            if r is not None:
                return r.current_state.label
        return ""

    def transition(self, node: str, label: str, timeout: float = 60.0) -> bool:
        """Configure or activate ``node``; True once it is in the state the transition leads to."""
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState

        ids = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE}
        goal = {"configure": "inactive", "activate": "active"}[label]
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r = self._call(ChangeState, f"/{node}/change_state",
                           ChangeState.Request(transition=Transition(id=ids[label])), 10.0)
            if r is not None:
                return bool(r.success)
            if self.state(node) == goal:  # done, only the answer was lost
                return True
        return False

    def wait_up(self, node: str, timeout: float = 60.0) -> None:
        """Until the node answers its lifecycle service (built, spinning: its signal handlers are set). An
        answer, not the service's discovery: the same node of the previous test stays discovered for a
        while after it exited, and a signal sent then reached a process still importing (exit -2)."""
        assert self.state(node, timeout), f"/{node}/get_state never answered"

    def observation_and_request(self, route: str = "") -> None:
        """Fresh camera frames, a joint state, the task, a route decision (when given) and a must-go chunk
        request, a few times (best-effort sensor topics)."""
        import cv2
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import String

        from edgefm_ros.msg import QueueStatus, RouteDecision

        self.pubs["task"].publish(String(data="pick up the cube"))
        for _ in range(5):
            stamp = self.node.get_clock().now().to_msg()
            px = RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8)
            im = Image(height=48, width=64, encoding="rgb8", step=192, data=px.tobytes())
            im.header.stamp = stamp
            self.pubs["image"].publish(im)
            jpg = CompressedImage(format="jpeg", data=cv2.imencode(".jpg", px)[1].tobytes())
            jpg.header.stamp = stamp
            self.pubs["jpeg"].publish(jpg)
            js = JointState(name=list(JOINTS), position=RNG.uniform(-1, 1, len(JOINTS)).tolist())
            js.header.stamp = stamp
            self.pubs["state"].publish(js)
            if route:
                rd = RouteDecision(target=route, candidate=f"{route}-test", reason="test")
                rd.header.stamp = stamp
                self.pubs["route"].publish(rd)
            time.sleep(0.05)
        st = QueueStatus(request_chunk=True, must_go=True)
        st.header.stamp = self.node.get_clock().now().to_msg()
        self.pubs["status"].publish(st)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._thread.join(timeout=2.0)


class SilentServer:
    """A TCP server that accepts connections and never answers: a cloud call stays in flight."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        for c in self.accepted:
            c.close()
        self.sock.close()


CASES = [("vla_node", "unconfigured", signal.SIGINT), ("vla_node", "inactive", signal.SIGTERM),
         ("vla_node", "active", signal.SIGINT), ("vla_node", "inference", signal.SIGTERM),
         ("vla_node", "cloud_call", signal.SIGINT),
         ("action_node", "unconfigured", signal.SIGTERM), ("action_node", "inactive", signal.SIGINT),
         ("action_node", "active", signal.SIGTERM)]


@pytest.mark.parametrize("name,state,sig", CASES, ids=[f"{n}-{s}-{g.name}" for n, s, g in CASES])
def test_node_exits_0_on_signal_in_every_state(ros, tiny_model, tmp_path, ros_domain_id, name, state, sig):
    from edgefm_ros.tools.graph import node_command, params_yaml

    params = node_params(tiny_model)
    for p in params.values():
        p["autostart"] = False
    server = SilentServer() if state == "cloud_call" else None
    if state == "inference":
        params["vla_node"]["inference_delay_ms"] = 4000.0  # a slow model: the chunk is in hand for 4 s
    if server is not None:
        params["vla_node"].update(cloud_url=f"http://127.0.0.1:{server.port}", cloud_deadline_s=30.0)
    (tmp_path / "params.yaml").write_text(params_yaml({name: params[name]}))
    log = open(tmp_path / "node.log", "wb")
    proc = subprocess.Popen(node_command(name) + ["--ros-args", "--params-file", str(tmp_path / "params.yaml")],
                            stdout=log, stderr=subprocess.STDOUT, env={**__import__("os").environ,
                                                                       "EDGEFM_CLOUD_TOKEN": "test-token"})
    driver = Driver(ros_domain_id)
    try:
        driver.wait_up(name)
        if state != "unconfigured":
            assert driver.transition(name, "configure")
        if state not in ("unconfigured", "inactive"):
            assert driver.transition(name, "activate")
        if state in ("inference", "cloud_call"):
            driver.observation_and_request("cloud" if state == "cloud_call" else "")
            time.sleep(1.0)
        if server is not None:
            end = time.monotonic() + 10
            while not server.accepted and time.monotonic() < end:
                time.sleep(0.05)
            assert server.accepted, "vla_node made no cloud call"
        assert proc.poll() is None, f"{name} exited early: {(tmp_path / 'node.log').read_text()}"
        owned = shm.owned_by(proc.pid)  # its participant's segment and listening ports
        assert any(shm.SEGMENT.match(n) for n in owned), f"{name} holds no Fast DDS segment: {owned}"
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(BOUND_S + 5)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        driver.close()
        if server is not None:
            server.close()
    text = (tmp_path / "node.log").read_text()
    assert rc == 0, f"{name} in state {state}: exit {rc} after {sig.name}\n{text[-3000:]}"
    assert took < BOUND_S, f"{name} took {took:.1f}s to exit"
    assert f"{sig.name}: shutting down" in text
    # its participant's segments go with it. A listening port of its can stay, without its lock file, where a
    # peer had it open when the node exited (Fast DDS leaves the unlinking to the last user, which does not
    # always do it); the clean-up removes such a port once no live process maps it
    left = [n for n in owned if (shm.SHM_DIR / n).exists()]
    segments = [n for n in left if shm.SEGMENT.match(n)]
    assert not segments, f"{name} in state {state}: its segments outlived it after {sig.name}: {segments}"
    shm.clean()
    kept = [n for n in owned if (shm.SHM_DIR / n).exists()]
    assert not set(kept) - shm.mapped_names(), f"the clean-up left unmapped files of {name}: {kept}"
    if state == "inference":
        assert "observation refused" not in text, text[-2000:]  # the request was taken: inference in hand


def test_sigkilled_node_leaves_segments_that_clean_removes(ros, tiny_model, tmp_path, ros_domain_id):
    """SIGKILL runs nothing in the node: its segment stays in /dev/shm until the clean-up (what the launch
    files, the demo and the eval tools run at start) removes it; a live participant's files stay."""
    from edgefm_ros.tools.graph import node_command, params_yaml

    params = node_params(tiny_model)
    (tmp_path / "params.yaml").write_text(params_yaml({"action_node": params["action_node"]}))
    with open(tmp_path / "node.log", "wb") as log:
        proc = subprocess.Popen(node_command("action_node") + ["--ros-args", "--params-file",
                                                               str(tmp_path / "params.yaml")],
                                stdout=log, stderr=subprocess.STDOUT)
    driver = Driver(ros_domain_id)
    try:
        driver.wait_up("action_node")
        owned = shm.owned_by(proc.pid)
        mine = shm.owned_by(__import__("os").getpid())  # the driver's participant: alive throughout
        assert any(shm.SEGMENT.match(n) for n in owned) and any(shm.SEGMENT.match(n) for n in mine)
        proc.kill()
        proc.wait(10)
        assert all((shm.SHM_DIR / n).exists() for n in owned if shm.SEGMENT.match(n)), "SIGKILL removed files?"
        result = shm.clean()
        for n in owned:
            assert not (shm.SHM_DIR / n).exists(), f"{n} of the killed node survived the clean-up"
            assert not (shm.SHM_DIR / (n + "_el")).exists()
        assert set(n for n in owned if shm.SEGMENT.match(n)) <= set(result.removed)
        for n in mine:
            assert (shm.SHM_DIR / n).exists(), f"the clean-up removed {n} of a live participant"
    finally:
        if proc.poll() is None:
            proc.kill()
        driver.close()


@pytest.mark.parametrize("name,bad", [("action_node", "control_rate_hz:=-5.0"), ("vla_node", "cloud_deadline_s:=-1.0")])
def test_node_refusing_its_parameters_leaves_no_shared_memory(ros, tmp_path, ros_domain_id, name, bad):
    """A node that exits 2 on an invalid parameter (refused while it was being built) still deletes its DDS
    participant: no Fast DDS file appears that no process uses."""
    from edgefm_ros.tools.graph import node_command

    before = {p.name for p in shm.SHM_DIR.iterdir()}
    r = subprocess.run(node_command(name) + ["--ros-args", "-p", bad], capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "ROS_DOMAIN_ID": str(ros_domain_id)})
    assert r.returncode == 2 and "invalid parameters" in r.stdout + r.stderr, r.stdout + r.stderr
    left = [n for n in shm.stale() if n not in before]
    assert not left, f"{name} refusing {bad} left {left}"


STUCK_NODE = """
import sys, time
import rclpy.node
from edgefm_ros.ros import spin

class Stuck(rclpy.node.Node):
    def destroy_node(self):
        print("destroying", flush=True)
        time.sleep(60)  # as a participant's deletion stuck in native code would

sys.exit(spin.run_node(lambda: Stuck("stuck_node"), "stuck_node"))
"""


def test_a_shutdown_stuck_after_the_threads_stopped_dumps_the_stacks_and_exits_1(ros, tmp_path, ros_domain_id):
    """Past the node's own threads, a shutdown stuck where no Python signal handler runs ends by itself after
    spin.SHUTDOWN_WATCHDOG_S, with status 1 and every thread's stack on stderr naming where it was stuck."""
    import os

    from edgefm_ros.ros.spin import SHUTDOWN_WATCHDOG_S

    script = tmp_path / "stuck.py"
    script.write_text(STUCK_NODE)
    env = {**os.environ, "ROS_DOMAIN_ID": str(ros_domain_id), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(3.0)  # up and spinning
        assert proc.poll() is None, proc.communicate()[0]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=SHUTDOWN_WATCHDOG_S + 20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        shm.clean()  # its participant was never deleted: its files, which no live process uses
    assert proc.returncode == 1, (proc.returncode, out)
    assert SHUTDOWN_WATCHDOG_S <= took < SHUTDOWN_WATCHDOG_S + 10, took
    assert "destroying" in out and "Timeout" in out and "in destroy_node" in out, out


_LEAVING_SIBLING = r"""
import mmap, os, sys, time
from pathlib import Path
from edgefm_ros.ros import spin
d, port, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with open(d / port, "r+b") as f:
    m = mmap.mmap(f.fileno(), 4096)  # a departed peer's port, written to while leaving
(d / f"ready.{os.getpid()}").touch()
while not go.exists():
    time.sleep(0.005)
class Log:
    def info(self, s): print(s, flush=True)
    def warning(self, s): print(s, flush=True)
spin.clean_after_launcher(Log(), shm_dir=d, wait_s=float(sys.argv[4]))
time.sleep(0.3)  # the rest of the exit, the port still mapped
"""


def _siblings_leave_together(tmp_path, n: int, wait_s: float, hold=None) -> tuple[list[str], float]:
    port = "fastrtps_port4242"
    (tmp_path / port).write_bytes(b"\0" * 4096)
    (tmp_path / f"sem.{port}_mutex").write_bytes(b"\0" * 32)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _LEAVING_SIBLING, str(tmp_path), port, str(go), str(wait_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(n)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready.*"))) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    go.touch()  # every sibling cleans while the others still map the port
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return outs, time.monotonic() - t0


def test_siblings_leaving_together_remove_the_ports_they_all_wrote_to(ros, tmp_path):
    """Nodes orphaned together each map the departed peers' ports they wrote to while leaving: each clean-up
    sees the others' mappings, so without an order the port outlives them all. The highest pid waits for
    the lower ones to unmap it and removes it, with its semaphore."""
    outs, took = _siblings_leave_together(tmp_path, 3, wait_s=5.0)
    assert not (tmp_path / "fastrtps_port4242").exists() and not (tmp_path / "sem.fastrtps_port4242_mutex").exists(), outs
    assert sum("removed" in o for o in outs) == 1, outs  # the last one, and only it
    assert took < 3.0, took


def test_a_leaving_node_does_not_wait_for_a_process_that_is_not_its_sibling(ros, tmp_path):
    """A port some other process (not a sibling: here the test itself, a lower pid) maps is in use: kept,
    and nobody waits for it."""
    import mmap

    port = tmp_path / "fastrtps_port4242"
    port.write_bytes(b"\0" * 4096)
    with open(port, "r+b") as f:
        m = mmap.mmap(f.fileno(), 4096)
    try:
        outs, took = _siblings_leave_together(tmp_path, 2, wait_s=5.0)
        assert port.exists(), outs
        assert took < 3.0, took  # the 5 s wait was never entered
    finally:
        m.close()


_SLOW_CLEAN_AFTER_LAUNCHER = r"""
import faulthandler, os, time
import rclpy
from rclpy.signals import SignalHandlerOptions
from edgefm_ros.ros import spin

def slow_clean(logger):
    time.sleep(float(os.environ["HOLD_S"]))  # siblings waited for on a loaded machine
    print("cleaned", flush=True)

spin.clean_after_launcher = slow_clean
request = spin.ShutdownRequest(rclpy.logging.get_logger("orphan"))
request.parent_gone = lambda: True  # the launcher died first
rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
faulthandler.dump_traceback_later(float(os.environ["WATCHDOG_S"]), exit=True)  # as run_node arms it
spin.finish(request, rclpy.logging.get_logger("orphan"))
spin.exit_now(0)
"""


def test_the_clean_up_after_the_launcher_runs_outside_the_shutdown_watchdog(ros, tmp_path, ros_domain_id):
    """The shutdown watchdog bounds the native teardown; the clean-up an orphaned node runs after it (Python,
    with its own bounded wait for siblings) is not cut short by it: a clean-up longer than the watchdog ends
    with status 0 and the clean-up done, not status 1 half-way through."""
    import os

    env = {**os.environ, "ROS_DOMAIN_ID": str(ros_domain_id), "HOLD_S": "1.5", "WATCHDOG_S": "0.5"}
    r = subprocess.run([sys.executable, "-c", _SLOW_CLEAN_AFTER_LAUNCHER], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0 and "cleaned" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])

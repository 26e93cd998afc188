"""Helpers of the launch and CLI tests: the real ``ros2`` command (skip without it), a params file for the
tiny model, ``ros2 topic hz`` read as a number, and a /diagnostics observer in the test process."""
from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

from replay_helpers import node_params
from skips import require_material

HZ_LINE = re.compile(r"average rate: ([0-9.]+)")


def need_ros2_launch() -> None:
    from edgefm_ros.tools.graph import ros2_launch_available

    require_material(ros2_launch_available(), "ros2 launch / the ros2 CLI are not installed (scripts/setup.sh "
                     "installs them from ../shared/ros2-jazzy)")


def write_params(path: Path, tiny_model, **per_node) -> str:
    """The replay tests' node parameters for the tiny model (autostart true), overrides per node."""
    from edgefm_ros.tools.graph import params_yaml

    params = node_params(tiny_model)
    for node, over in per_node.items():
        params[node].update(over)
    path.write_text(params_yaml(params))
    return str(path)


def ros2(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """``ros2 <args>`` with this process's environment (ROS_DOMAIN_ID of the test)."""
    return subprocess.run(["ros2", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def topic_hz(topic: str, seconds: float, window: int = 100) -> float:
    """The last average rate ``ros2 topic hz`` printed within ``seconds`` (a separate subscriber process);
    nan when it printed none."""
    p = subprocess.Popen(["ros2", "topic", "hz", topic, "--window", str(window)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    time.sleep(seconds)
    p.send_signal(2)
    out = p.communicate(timeout=15)[0]
    rates = HZ_LINE.findall(out)
    return float(rates[-1]) if rates else float("nan")


class DiagnosticsObserver:
    """The latest /diagnostics values per node, from a node in this process (own context)."""

    def __init__(self, domain_id: int):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        from edgefm_ros.ros import qos
        from edgefm_ros.ros.diagnostics import DiagnosticArray

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("edgefm_test_observer", context=self.context)
        self.values: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, qos.DIAGNOSTICS)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        from edgefm_ros.ros.spin import spin_until_shutdown

        self._thread = threading.Thread(target=spin_until_shutdown, args=(self.executor, self.context),
                                        daemon=True)
        self._thread.start()

    def _on_diag(self, msg) -> None:
        with self._lock:
            for s in msg.status:
                self.values[s.name.split(":")[0]] = {"message": s.message, **{kv.key: kv.value for kv in s.values}}

    def get(self, node: str) -> dict:
        with self._lock:
            return dict(self.values.get(node, {}))

    def wait(self, node: str, pred, timeout: float = 20.0) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            v = self.get(node)
            if v and pred(v):
                return v
            time.sleep(0.1)
        return self.get(node)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._thread.join(timeout=2.0)

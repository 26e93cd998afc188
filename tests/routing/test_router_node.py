"""router_node as a real process: images + instruction in, RouteDecision out; runtime thresholds validated."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from skips import require_module

rclpy = require_module("rclpy", "rclpy (ROS 2 Jazzy wheels) is not installed")
RouteDecisionMsg = require_module("edgefm_ros.msg", "edgefm_ros.msg is not built (run scripts/setup.sh)").RouteDecision

ROOT = Path(__file__).resolve().parents[2]
CAMERAS = ("/rt_cam1/image_raw", "/rt_cam2/image_raw/compressed")


def node_command() -> list[str]:
    exe = ROOT / "install" / "edgefm_ros" / "lib" / "edgefm_ros" / "router_node"
    if exe.is_file():
        return [sys.executable, str(exe)]
    return [sys.executable, "-m", "edgefm_ros.nodes.router_node"]


class Harness:
    """router_node in a subprocess plus an in-process node that feeds and watches it."""

    def __init__(self, tmp_path: Path, domain: int, params: dict):
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import CompressedImage, Image
        from std_msgs.msg import String

        from edgefm_ros.ros import qos

        pfile = tmp_path / "params.yaml"
        pfile.write_text(yaml.safe_dump({"router_node": {"ros__parameters": params}}))
        self.log = tmp_path / "router_node.log"
        env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONUNBUFFERED="1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(node_command() + ["--ros-args", "--params-file", str(pfile)], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node("router_node_test", context=self.context)
        self.decisions: list = []
        self.diag: dict = {}
        self.lock = threading.Lock()
        self.node.create_subscription(RouteDecisionMsg, "edgefm/route", self._on_route, qos.RELIABLE)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, qos.DIAGNOSTICS)
        self.raw = self.node.create_publisher(Image, CAMERAS[0], qos.SENSOR)
        self.jpeg = self.node.create_publisher(CompressedImage, CAMERAS[1], qos.SENSOR)
        self.instr = self.node.create_publisher(String, "/rt_instruction", qos.LATCHED)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self):
        from edgefm_ros.ros.spin import spin_until_shutdown

        spin_until_shutdown(self.executor, self.context)

    def _on_route(self, msg):
        with self.lock:
            self.decisions.append((time.monotonic(), msg))

    def _on_diag(self, msg):
        for s in msg.status:
            if s.name.startswith("router_node"):
                with self.lock:
                    self.diag = {"level": s.level, "message": s.message, **{kv.key: kv.value for kv in s.values}}

    def publish_images(self, rgb: np.ndarray, jpeg: bytes, bad: bool = False):
        from sensor_msgs.msg import CompressedImage, Image

        h, w, _ = rgb.shape
        data = rgb.tobytes()[: -7 if bad else None]
        self.raw.publish(Image(height=h, width=w, encoding="rgb8", step=w * 3, data=data))
        self.jpeg.publish(CompressedImage(format="jpeg", data=jpeg))

    def stream(self, rgb: np.ndarray, jpeg: bytes, period: float = 0.05) -> None:
        """Keep both cameras publishing (sensor QoS: samples before discovery are simply lost)."""
        self._stream_stop = threading.Event()

        def loop():
            while not self._stream_stop.is_set() and self.context.ok():
                self.publish_images(rgb, jpeg)
                time.sleep(period)

        self._streamer = threading.Thread(target=loop, daemon=True)
        self._streamer.start()

    def wait(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if predicate():
                    return True
            if self.proc.poll() is not None:
                raise AssertionError(f"router_node exited with {self.proc.returncode}:\n{self.log.read_text()}")
            time.sleep(0.05)
        return False

    def set_param(self, name: str, value: float):
        from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
        from rcl_interfaces.srv import SetParameters

        cli = self.node.create_client(SetParameters, "/router_node/set_parameters")
        assert cli.wait_for_service(timeout_sec=10.0), "router_node's parameter service did not appear"
        req = SetParameters.Request(parameters=[Parameter(name=name, value=ParameterValue(
            type=ParameterType.PARAMETER_DOUBLE, double_value=value))])
        fut = cli.call_async(req)
        end = time.monotonic() + 10.0
        while not fut.done() and time.monotonic() < end:
            time.sleep(0.02)
        assert fut.done(), "set_parameters timed out"
        return fut.result().results[0]

    def close(self):
        if getattr(self, "_streamer", None) is not None:
            self._stream_stop.set()
            self._streamer.join(2.0)
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self.thread.join(2.0)


@pytest.fixture
def harness(request, tmp_path, ros_domain_id):
    params = dict(camera_topics=list(CAMERAS), instruction_topic="/rt_instruction", rate_hz=4.0,
                  static_bandwidth_mbps=80.0, static_rtt_s=0.03, diagnostics_period_s=0.2,
                  config_path=str(ROOT / "config" / "router.yaml"))
    params.update(getattr(request, "param", {}))
    h = Harness(tmp_path, ros_domain_id, params)
    yield h
    h.close()


def test_image_messages_are_viewed_without_copies():
    from sensor_msgs.msg import Image

    from edgefm_ros.nodes.router_node import image_view

    rng = np.random.default_rng()
    rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    padded = np.zeros((6, 5 * 3 + 4), np.uint8)  # rows padded to a larger step
    padded[:, :15] = rgb[..., ::-1].reshape(6, 15)
    msg = Image(height=6, width=5, encoding="bgr8", step=19, data=padded.tobytes())
    view = image_view(msg)
    np.testing.assert_array_equal(view, rgb)
    assert np.shares_memory(view, np.frombuffer(msg.data, np.uint8))
    with pytest.raises(ValueError, match="expected step"):
        image_view(Image(height=6, width=5, encoding="rgb8", step=15, data=rgb.tobytes()[:-1]))
    with pytest.raises(ValueError, match="encoding"):
        image_view(Image(height=6, width=5, encoding="yuv422", step=10, data=bytes(60)))


def test_router_node_publishes_decisions_and_validates_thresholds(harness):
    import cv2
    from std_msgs.msg import String

    from edgefm_ros.routing.config import load_router_config
    from edgefm_ros.routing.features import FEATURE_NAMES

    cfg = load_router_config(ROOT / "config" / "router.yaml")
    rng = np.random.default_rng()
    rgb = cv2.GaussianBlur(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8), (0, 0), 1.5)
    ok, jpg = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_QUALITY, 40])

    harness.instr.publish(String(data="pick up the red cube"))
    harness.stream(rgb, jpg.tobytes())
    assert harness.wait(lambda: len(harness.decisions) >= 1, 30.0), harness.log.read_text()
    # once both cameras are in, the JPEG camera's quality 40 is read from its DQT (max over cameras)
    assert harness.wait(lambda: abs(harness.decisions[-1][1].features[2] - 0.6) < 1e-6, 5.0)
    _, d = harness.decisions[-1]
    names = [c.name for c in cfg.candidates]
    assert d.target in ("edge", "cloud") and d.candidate in names
    assert cfg.candidate(d.candidate).placement == d.target
    assert list(d.feature_names) == list(FEATURE_NAMES) and len(d.features) == 10
    assert all(math.isfinite(x) for x in d.features)
    assert list(d.candidates) == names
    assert all(0 < q < 1 for q in d.predicted_quality) and all(x > 0 for x in d.predicted_latency)
    assert d.bandwidth_mbps == pytest.approx(80.0, rel=1e-3) and not d.guard_active and not d.breaker_open
    assert d.resolution == cfg.candidate(d.candidate).resolution
    assert d.jpeg_quality == (cfg.candidate(d.candidate).jpeg_quality if d.target == "cloud" else 0)
    assert d.reason in ("edge_first", "cloud_gain", "deadline_edge", "deadline_cloud")

    # the configured rate
    n0, t0 = len(harness.decisions), time.monotonic()
    time.sleep(1.5)
    rate = (len(harness.decisions) - n0) / (time.monotonic() - t0)
    assert 2.5 < rate < 6.0, rate

    # thresholds: a bad delta_min is rejected with a reason naming it; a good one is applied
    for bad in (5.0, float("nan")):
        res = harness.set_param("delta_min", bad)
        assert not res.successful and "delta_min" in res.reason and "[-1.0, 1.0]" in res.reason, res.reason
    res = harness.set_param("guard_mbps", -3.0)
    assert not res.successful and "guard_mbps" in res.reason
    res = harness.set_param("delta_min", 0.9)
    assert res.successful, res.reason
    assert harness.wait(lambda: harness.diag.get("delta_min") == "0.9", 5.0), harness.diag
    assert harness.wait(lambda: harness.decisions[-1][1].target == "edge", 5.0)
    res = harness.set_param("guard_mbps", 500.0)  # above the 80 Mbps link: the guard closes the cloud
    assert res.successful
    assert harness.wait(lambda: harness.decisions[-1][1].guard_active, 5.0)

    # a malformed image is counted, not fatal; overhead is in /diagnostics
    # sensor QoS keeps the latest sample only, and the stream goes on beside: a busy node may never see one
    # bad image, so it is sent again until counted

    def bad_counted() -> bool:
        if int(harness.diag.get("malformed_images", 0)) >= 1:
            return True
        harness.publish_images(rgb, jpg.tobytes(), bad=True)
        return False

    assert harness.wait(bad_counted, 15.0), harness.diag
    n = len(harness.decisions)
    assert harness.wait(lambda: len(harness.decisions) > n + 1, 15.0)
    diag = dict(harness.diag)
    assert 0 < float(diag["decision_ms_p95"]) < 1000 and int(diag["decisions"]) >= 5

    # with a static link, the cloud client's failed calls still open the breaker (config/router.yaml: after 3)
    # and a successful one closes it; the static rate and round trip stay what the router decides with
    from std_msgs.msg import Float64MultiArray

    from edgefm_ros.ros import qos

    link = harness.node.create_publisher(Float64MultiArray, "edgefm/link_sample", qos.RELIABLE)
    assert harness.wait(lambda: link.get_subscription_count() > 0, 15.0)
    for _ in range(3):
        link.publish(Float64MultiArray(data=[]))
    assert harness.wait(lambda: harness.decisions[-1][1].breaker_open, 15.0), harness.diag
    _, d = harness.decisions[-1]
    assert d.target == "edge" and d.reason == "breaker" and d.bandwidth_mbps == pytest.approx(80.0, rel=1e-3)
    link.publish(Float64MultiArray(data=[200_000.0, 0.5, 0.2]))  # a slow call: 3.2 Mbit/s, 200 ms
    assert harness.wait(lambda: not harness.decisions[-1][1].breaker_open, 15.0), harness.diag
    _, d = harness.decisions[-1]
    assert d.bandwidth_mbps == pytest.approx(80.0, rel=1e-3) and d.rtt_s == pytest.approx(0.03, rel=1e-3)
    assert harness.proc.poll() is None, "router_node died"


@pytest.mark.parametrize("harness", [{"rate_hz": 0.0}], indirect=True)
def test_every_new_instruction_is_routed_at_once(harness):
    import cv2
    from std_msgs.msg import String

    from edgefm_ros.routing.features import FEATURE_NAMES

    rng = np.random.default_rng()
    rgb = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    ok, jpg = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_QUALITY, 80])
    harness.stream(rgb, jpg.tobytes())
    assert harness.wait(lambda: int(harness.diag.get("fresh_cameras", 0)) == 2, 30.0), harness.log.read_text()
    assert harness.decisions == []  # no instruction yet, no timer: nothing routed
    texts = ["pick up the cube", "is the cup empty?", "if it is there, then move that one again"]
    question, deictic = FEATURE_NAMES.index("text_question"), FEATURE_NAMES.index("text_deictic")
    for i, text in enumerate(texts):
        t_sent = time.monotonic()
        harness.instr.publish(String(data=text))
        assert harness.wait(lambda: len(harness.decisions) == i + 1, 2.0), (text, len(harness.decisions))
        assert harness.decisions[-1][0] - t_sent < 1.0
    feats = [m.features for _, m in harness.decisions]
    assert [f[question] for f in feats] == [0.0, 1.0, 0.0]
    assert feats[2][deictic] > 0.5 and feats[0][deictic] == 0.0
    time.sleep(0.8)
    assert len(harness.decisions) == 3  # one decision per instruction, none in between

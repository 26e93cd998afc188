"""router_node: the INAR-VL router as a ROS 2 node (a thin shell over edgefm_ros.routing).

Subscribes to the cameras (sensor_msgs/Image, or CompressedImage for topics ending in /compressed;
sensor-data QoS), the instruction (std_msgs/String from any reliable publisher, latched or not) and link samples
(std_msgs/Float64MultiArray ``[upload_bytes, upload_s, rtt_s]`` from whoever makes cloud calls; an
empty array reports a failed call). Publishes ``edgefm_ros/RouteDecision`` on ``route_topic`` at
``rate_hz`` and at once on every new instruction, and the decision overhead on /diagnostics.

The bandwidth guard keeps every decision on the edge while the link estimate is unknown, and only
link samples move it: with ``cloud_url`` set the node probes that endpoint's link itself (an upload to
its /edgefm/probe, cloud/probe.py) on a background thread when the estimate is unknown or about to go
stale, at most every ``probe_period_s``; a failed probe counts as a failed call (circuit breaker).

``delta_min``, ``guard_mbps`` and ``guard_hysteresis_mbps`` can be changed at runtime (``ros2 param
set``); a bad value is rejected with the reason. Images are read as zero-copy numpy views of
``msg.data`` (no cv_bridge); a JPEG CompressedImage goes to the router as its bytes, so its encoder
quality is read from the quantisation tables.
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult

from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Float64MultiArray, String

from edgefm_ros.msg import RouteDecision as RouteDecisionMsg
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.params import ParamSpec, declare, validate
from edgefm_ros.ros.spin import run_node
from edgefm_ros.routing.config import check_thresholds
from edgefm_ros.routing.policy import Router
from edgefm_ros.types import RouteDecision

NODE_NAME = "router_node"

PARAMS = (
    ParamSpec("config_path", "str", "", "Router YAML (candidates, coefficients, thresholds); empty: the "
              "package's config/router.yaml."),
    ParamSpec("camera_topics", "str[]", ("/camera1/image_raw",), "Camera topics (sensor_msgs/Image, or "
              "CompressedImage when the transport says so)."),
    ParamSpec("camera_keys", "str[]", (), "Camera key for each topic (e.g. observation.images.camera1); "
              "empty: observation.images.camera<i>."),
    ParamSpec("camera_transports", "str[]", (), "raw or compressed per camera topic; empty: compressed when "
              "the topic ends in /compressed.", choices=("raw", "compressed")),
    ParamSpec("instruction_topic", "str", "/instruction", "std_msgs/String task from any reliable publisher; "
              "a latched (transient local) one also reaches a node started after it."),
    ParamSpec("default_instruction", "str", "", "Instruction used until one arrives; empty: wait for one."),
    ParamSpec("route_topic", "str", "edgefm/route", "Output: edgefm_ros/RouteDecision."),
    ParamSpec("rate_hz", "float", 2.0, "Decisions per second (0: only on new instructions).", range=(0.0, 100.0)),
    ParamSpec("deadline_s", "float", 0.0, "Request deadline the decision must meet; 0: the router config's "
              "default_deadline_s.", range=(0.0, 60.0)),
    ParamSpec("max_image_age_s", "float", 1.0, "Camera frames received longer ago than this are not used.",
              range=(0.001, 3600.0)),
    ParamSpec("link_sample_topic", "str", "edgefm/link_sample", "Input: Float64MultiArray [upload_bytes, "
              "upload_s, rtt_s] per cloud call; [] for a failed call."),
    ParamSpec("static_bandwidth_mbps", "float", 0.0, "When > 0: a known fixed link, fed to the estimator "
              "before each decision (demos, benches); 0: measured samples only.", range=(0.0, 100000.0)),
    ParamSpec("static_rtt_s", "float", 0.02, "RTT of the static link.", range=(0.0, 10.0)),
    ParamSpec("cloud_url", "str", "", "Cloud endpoint (edgefm-cloud serve) whose link is probed, e.g. "
              "https://10.0.0.5:8443; empty: no probes (samples from link_sample_topic only)."),
    ParamSpec("cloud_token_file", "str", "", "File holding the endpoint's bearer token; empty: "
              "$EDGEFM_CLOUD_TOKEN."),
    ParamSpec("cloud_ca_file", "str", "", "CA certificate (PEM) of an https cloud_url signed by a private CA."),
    ParamSpec("probe_period_s", "float", 5.0, "Link probe when the estimate is unknown or about to go stale, "
              "at most this often (background thread); 0: off.", range=(0.0, 3600.0)),
    ParamSpec("probe_bytes", "int", 131072, "Upload size of a link probe.", range=(16384, 262144)),
    ParamSpec("diagnostics_period_s", "float", 1.0, "Period of /diagnostics.", range=(0.05, 60.0)),
)
# Changeable at runtime; defaults come from the router config. (name, description, range)
THRESHOLDS = (
    ("delta_min", "Quality gain the cloud must exceed over the best edge candidate.", (-1.0, 1.0)),
    ("guard_mbps", "Below this bandwidth estimate the router serves edge-only.", (0.0, 10000.0)),
    ("guard_hysteresis_mbps", "The guard releases above guard_mbps + this.", (0.0, 10000.0)),
)


@dataclass(frozen=True)
class RouterNodeConfig:
    config_path: str
    camera_topics: tuple[str, ...]
    camera_keys: tuple[str, ...]
    camera_transports: tuple[str, ...]
    instruction_topic: str
    default_instruction: str
    route_topic: str
    rate_hz: float
    deadline_s: float
    max_image_age_s: float
    link_sample_topic: str
    static_bandwidth_mbps: float
    static_rtt_s: float
    cloud_url: str
    cloud_token_file: str
    cloud_ca_file: str
    probe_period_s: float
    probe_bytes: int
    diagnostics_period_s: float

    def __post_init__(self) -> None:
        if not self.camera_topics:
            raise ValueError("camera_topics must name at least one camera topic")
        if self.cloud_url and not self.cloud_url.startswith(("http://", "https://")):
            raise ValueError(f"cloud_url must be http(s)://host[:port], got {self.cloud_url!r}")
        for name in ("camera_keys", "camera_transports"):
            n = len(getattr(self, name))
            if n != len(self.camera_topics):
                raise ValueError(f"{name} has {n} entries for {len(self.camera_topics)} camera_topics")
        if len(set(self.camera_keys)) != len(self.camera_keys):
            raise ValueError(f"camera_keys {list(self.camera_keys)} holds duplicates")


def make_config(values: Mapping[str, Any]) -> RouterNodeConfig:
    v = validate(PARAMS, values)
    topics = v["camera_topics"]
    v["camera_keys"] = v["camera_keys"] or tuple(f"observation.images.camera{i + 1}" for i in range(len(topics)))
    v["camera_transports"] = v["camera_transports"] or tuple(
        "compressed" if t.rstrip("/").endswith("/compressed") else "raw" for t in topics)
    v["config_path"] = v["config_path"] or default_config_path()
    return RouterNodeConfig(**{f.name: v[f.name] for f in fields(RouterNodeConfig)})


def make_prober(cfg: RouterNodeConfig, link):
    """Link probes of ``cloud_url`` feeding ``link`` (None without cloud_url or with probe_period_s 0)."""
    if not cfg.cloud_url or cfg.probe_period_s <= 0:
        return None
    from edgefm_ros.cloud.client.base import read_token
    from edgefm_ros.cloud.probe import ProbeConfig
    from edgefm_ros.cloud.probe import make_prober as make

    try:
        token = read_token(cfg.cloud_token_file)
    except OSError as e:
        raise ValueError(f"cloud_token_file {cfg.cloud_token_file!r} cannot be read: {e}") from None
    return make(cfg.cloud_url, token, link, ProbeConfig(period_s=cfg.probe_period_s, nbytes=cfg.probe_bytes),
                cfg.cloud_ca_file or None)


def default_config_path() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory

        path = Path(get_package_share_directory("edgefm_ros")) / "config" / "router.yaml"
        if path.is_file():
            return str(path)
    except Exception:  # noqa: BLE001 - not installed by colcon: the source tree's copy
        pass
    return str(Path(__file__).resolve().parents[2] / "config" / "router.yaml")


# ---- messages <-> numpy (zero copy) ---------------------------------------------------------------------

_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8UC1": 1, "8UC3": 3}


def image_view(msg: Image) -> np.ndarray:
    """uint8 (H, W, 3) RGB or (H, W) grey: a view of msg.data (no copy); ValueError when malformed."""
    ch = _CHANNELS.get(msg.encoding)
    if ch is None:
        raise ValueError(f"unsupported image encoding {msg.encoding!r}; supported: {sorted(_CHANNELS)}")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h <= 0 or w <= 0 or step < w * ch:
        raise ValueError(f"bad image geometry {h}x{w}, step {step}, {ch} channel(s)")
    buf = np.frombuffer(msg.data, dtype=np.uint8)
    if buf.size != h * step:
        raise ValueError(f"image data holds {buf.size} bytes, expected step*height = {h * step}")
    px = buf.reshape(h, step)[:, : w * ch].reshape(h, w, ch)  # (H, W, ch) view
    if ch == 1:
        return px[..., 0]
    if msg.encoding in ("bgr8", "8UC3"):
        return px[..., ::-1]
    if msg.encoding == "bgra8":
        return px[..., 2::-1]
    return px[..., :3]


def compressed_view(msg: CompressedImage) -> memoryview:
    """The compressed bytes as a view of msg.data; ValueError when empty."""
    data = memoryview(msg.data).cast("B")
    if len(data) < 4:
        raise ValueError(f"compressed image ({msg.format!r}) holds only {len(data)} bytes")
    return data


def decision_to_msg(d: RouteDecision, stamp) -> RouteDecisionMsg:
    m = RouteDecisionMsg(target=d.target, candidate=d.candidate, reason=d.reason,
                         feature_names=list(d.feature_names), features=[float(x) for x in d.features],
                         candidates=[p.name for p in d.predictions],
                         predicted_quality=[float(p.quality) for p in d.predictions],
                         predicted_latency=[float(p.latency_s) for p in d.predictions],
                         predicted_energy=[float(p.energy_j) for p in d.predictions],
                         guard_active=bool(d.guard_open), breaker_open=bool(d.params.get("breaker_open", False)),
                         bandwidth_mbps=float(d.bandwidth_mbps), rtt_s=float(d.rtt_s),
                         jpeg_quality=int(d.params.get("jpeg_quality", 0)),
                         resolution=int(d.params.get("resolution", 0)))
    m.header.stamp = stamp
    return m


# ---- the node -------------------------------------------------------------------------------------------

class RouterNode(Node):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.cfg = make_config(declare(self, PARAMS))
        self.router = Router.from_yaml(self.cfg.config_path)
        pol = self.router.cfg.policy
        defaults = {"delta_min": pol.delta_min, "guard_mbps": pol.guard_mbps,
                    "guard_hysteresis_mbps": pol.guard_hysteresis_mbps}
        for name, text, (lo, hi) in THRESHOLDS:
            # No floating_point_range here: rclpy would answer before our callback, which validates with
            # the routing library's own check (the one Router.set_thresholds applies) and names the value.
            d = ParameterDescriptor(description=f"{text} Range [{lo}, {hi}]; validated on set.")
            self.declare_parameter(name, float(defaults[name]), d)
        self.router.set_thresholds(**{n: self.get_parameter(n).value for n, _, _ in THRESHOLDS})
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self._images: dict[str, tuple[object, float]] = {}  # camera key -> (view, received monotonic)
        self._instruction = self.cfg.default_instruction
        self._bad_images = 0
        self._failures = 0
        self._decisions = 0
        self._overhead_ms: deque[float] = deque(maxlen=200)
        self._last: RouteDecision | None = None
        self._last_problem = ""
        self._pending = False  # a new instruction waits for images
        self.prober = make_prober(self.cfg, self.router.link)  # touches the link only in _poll_probe (this thread)

        for topic, key, transport in zip(self.cfg.camera_topics, self.cfg.camera_keys, self.cfg.camera_transports):
            mtype = CompressedImage if transport == "compressed" else Image
            self.create_subscription(mtype, topic, lambda m, k=key: self._on_image(k, m), qos.SENSOR)
        qos.instruction_subscriptions(self, String, self.cfg.instruction_topic, self._on_instruction)
        self.create_subscription(Float64MultiArray, self.cfg.link_sample_topic, self._on_link_sample, qos.RELIABLE)
        self._pub = self.create_publisher(RouteDecisionMsg, self.cfg.route_topic, qos.RELIABLE)
        self._diag_pub = self.create_publisher(diag.DiagnosticArray, "/diagnostics", qos.DIAGNOSTICS)
        if self.cfg.rate_hz > 0:
            self.create_timer(1.0 / self.cfg.rate_hz, self._decide)
        self.create_timer(self.cfg.diagnostics_period_s, self._publish_diagnostics)
        if self.prober is not None:
            self.create_timer(min(0.25, self.cfg.probe_period_s), self._poll_probe)
        self.get_logger().info(
            f"routing {len(self.router.cfg.candidates)} candidates from {self.cfg.config_path}; cameras "
            f"{list(self.cfg.camera_topics)}; delta_min {self.router.delta_min}, guard {self.router.guard.guard_mbps} "
            f"Mbps (+{self.router.guard.hysteresis_mbps})")

    # parameters --------------------------------------------------------------------------------------------
    def _on_set_parameters(self, params) -> SetParametersResult:
        names = {n for n, _, _ in THRESHOLDS}
        new = {"delta_min": self.router.delta_min, "guard_mbps": self.router.guard.guard_mbps,
               "guard_hysteresis_mbps": self.router.guard.hysteresis_mbps}
        for p in params:
            if p.name not in names:
                continue
            if not isinstance(p.value, (int, float)) or isinstance(p.value, bool):
                return SetParametersResult(successful=False, reason=f"{p.name} must be a number, got {p.value!r}")
            new[p.name] = float(p.value)
        try:
            check_thresholds(new["delta_min"], new["guard_mbps"], new["guard_hysteresis_mbps"])
        except ValueError as e:
            return SetParametersResult(successful=False, reason=str(e))
        self.router.set_thresholds(**new)
        self.get_logger().info(f"thresholds now {new}")
        return SetParametersResult(successful=True)

    # inputs -----------------------------------------------------------------------------------------------
    def _on_image(self, key: str, msg) -> None:
        try:
            view = compressed_view(msg) if isinstance(msg, CompressedImage) else image_view(msg)
        except ValueError as e:
            self._bad_images += 1
            self._last_problem = f"camera {key}: {e}"
            self.get_logger().warn(f"dropping a malformed image on {key}: {e}", throttle_duration_sec=5.0)
            return
        self._images[key] = (view, time.monotonic())
        if self._pending:
            self._decide()

    def _on_instruction(self, msg: String) -> None:
        self._instruction = msg.data
        self._pending = True
        self._decide()

    def _on_link_sample(self, msg: Float64MultiArray) -> None:
        now = time.monotonic()
        data = list(msg.data)
        try:
            if not data:
                self.router.link.observe_failure(now)
            elif len(data) == 3:
                self.router.link.observe(int(data[0]), float(data[1]), float(data[2]), now)
            else:
                raise ValueError(f"expected [upload_bytes, upload_s, rtt_s] or [], got {data}")
        except ValueError as e:
            self.get_logger().warn(f"ignoring a link sample: {e}", throttle_duration_sec=5.0)

    def _poll_probe(self) -> None:
        if self.prober is None:
            return
        r = self.prober.poll()  # never blocks: the probe itself runs on the prober's thread
        if r is not None and not r.ok:
            self.get_logger().warn(f"link probe of {self.cfg.cloud_url} failed: {r.error}", throttle_duration_sec=30.0)

    def destroy_node(self):
        if self.prober is not None:
            self.prober.close()
            self.prober = None
        return super().destroy_node()

    # decisions --------------------------------------------------------------------------------------------
    def _fresh_images(self, now: float) -> dict:
        return {k: v for k, (v, t) in self._images.items() if now - t <= self.cfg.max_image_age_s}

    def _decide(self) -> None:
        if not self.context.ok():
            return
        if not self._instruction and not self._pending:
            self._last_problem = "waiting for an instruction"
            return
        now = time.monotonic()
        images = self._fresh_images(now)
        if not images:
            self._last_problem = "no fresh camera image"
            return
        if self.cfg.static_bandwidth_mbps > 0:
            nbytes = 1_000_000
            self.router.link.observe(nbytes, nbytes * 8 / (self.cfg.static_bandwidth_mbps * 1e6),
                                     self.cfg.static_rtt_s, now)
        t0 = time.perf_counter()
        try:
            d = self.router.decide(images, self._instruction, self.cfg.deadline_s or None, now)
        except ValueError as e:
            self._failures += 1
            self._last_problem = f"decision failed: {e}"
            self.get_logger().warn(self._last_problem, throttle_duration_sec=5.0)
            return
        msg = decision_to_msg(d, self.get_clock().now().to_msg())
        self._overhead_ms.append((time.perf_counter() - t0) * 1e3)
        self._pending = False
        self._last, self._last_problem = d, ""
        self._decisions += 1
        self._pub.publish(msg)

    def _publish_diagnostics(self) -> None:
        if not self.context.ok():
            return
        ms = np.array(self._overhead_ms) if self._overhead_ms else np.array([math.nan])
        d = self._last
        values = {
            "decisions": self._decisions, "decision_ms_last": float(ms[-1]), "decision_ms_mean": float(np.mean(ms)),
            "decision_ms_p95": float(np.percentile(ms, 95)), "target": d.target if d else "",
            "candidate": d.candidate if d else "", "reason": d.reason if d else "",
            "delta_min": self.router.delta_min, "guard_mbps": self.router.guard.guard_mbps,
            "guard_hysteresis_mbps": self.router.guard.hysteresis_mbps, "guard_active": self.router.guard.active,
            "breaker_open": self.router.link.breaker_open(time.monotonic()),
            "bandwidth_mbps": self.router.link.bandwidth_mbps(time.monotonic()),
            "rtt_s": self.router.link.rtt_s(time.monotonic()),
            "fresh_cameras": len(self._fresh_images(time.monotonic())), "malformed_images": self._bad_images,
            "failed_decisions": self._failures,
        }
        if self.prober is not None:
            values.update(self.prober.stats())
        level = diag.WARN if self._last_problem else diag.OK
        if self._last_problem:
            message = self._last_problem
        else:
            message = f"last decision {d.target}/{d.candidate} ({d.reason})" if d else "no decision yet"
        status = diag.make_status(f"{NODE_NAME}: routing", NODE_NAME, level, message, values)
        self._diag_pub.publish(diag.make_array(self.get_clock().now().to_msg(), [status]))


def main(args=None) -> int:
    return run_node(RouterNode, NODE_NAME, args)

if __name__ == "__main__":
    sys.exit(main())

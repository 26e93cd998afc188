"""The EAGLE-3 style draft head: fused low/mid/high target features, one Llama layer, a reduced vocabulary.

The target's hidden states after three layers (low, mid, high) are fused (``fuse``: 3H -> H); at
position i the draft takes ``inp(cat(embed(x[i+1]), feature_i))`` through one Llama decoder layer
(its own KV cache) and predicts x[i+2] over a reduced draft vocabulary (``d2t`` maps draft ids to
target ids). Deeper draft steps feed the draft's own output hidden in place of the target feature
(trained for that: training-time test, see ``edgefm_ros/training/speculative_draft.py``).

On disk: one safetensors file with the config, the target weights' fingerprint and free-form
metadata (training stats, measured per-rank acceptance). The head may be left out and rebuilt from
the target's embedding rows (it is frozen to them in training), and matrices may be stored as fp16.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from edgefm_ros.models.smollm import LlamaLayer
from edgefm_ros.dispatch.table import OpResolver, Record, Table
from edgefm_ros.models.config import TextConfig
from edgefm_ros.runtime.safetensors_mmap import MappedSafetensors

from ..generate import LlmEngine
from ..gguf_loader import TensorSource

DRAFT_FORMAT = "edgefm-eagle3-draft/1"
# the draft's GEMMs (op_kind, layer_role): their row counts change from pass to pass (tree level widths,
# accepted lengths), and packed-weight GEMMs re-pack for every new row count beyond a few
_DRAFT_GEMMS = (("linear", "draft_fuse"), ("linear", "draft_in"), ("linear", "draft_qkv"), ("linear", "draft_o"),
                ("linear", "draft_head"), ("mlp", "draft_mlp"))


def default_taps(layers: int) -> tuple[int, ...]:
    """Low / mid / high feature layers (EAGLE-3: outputs of layers 2, L/2 and L-3, 1-based)."""
    return tuple(sorted({min(1, layers - 1), max(layers // 2 - 1, 0), max(layers - 4, 0)}))


@dataclass(frozen=True)
class DraftConfig:
    text: TextConfig  # the decoder layer's sizes (hidden = the target's)
    taps: tuple[int, ...]  # target layers whose outputs are fused
    draft_vocab: int
    target_vocab: int
    rope_theta: float

    def __post_init__(self) -> None:
        if not self.taps or list(self.taps) != sorted(set(self.taps)) or self.taps[0] < 0:
            raise ValueError(f"taps must be distinct increasing layer indices, got {self.taps!r}")
        if not 0 < self.draft_vocab <= self.target_vocab:
            raise ValueError(f"draft_vocab {self.draft_vocab} must lie in (0, {self.target_vocab}]")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, s: str) -> "DraftConfig":
        d = json.loads(s)
        return cls(TextConfig(**d.pop("text")), tuple(d.pop("taps")), **d)


def draft_config_for(engine: LlmEngine, draft_vocab: int, inner: int | None = None) -> DraftConfig:
    t = engine.model_config.text
    text = TextConfig(hidden=t.hidden, inner=inner or t.inner, layers=1, heads=t.heads, kv_heads=t.kv_heads,
                      head_dim=t.head_dim, vocab=draft_vocab, eps=t.eps)
    return DraftConfig(text, default_taps(t.layers), min(draft_vocab, t.vocab), t.vocab, engine.model_config.rope_theta)


class DraftHead(nn.Module):
    """fuse (taps*H -> H), inp (2H -> H), one Llama layer, norm, head (H -> draft vocab); ops via the resolver."""

    def __init__(self, cfg: DraftConfig, ops, w, meta: dict | None = None):
        super().__init__()
        h = cfg.text.hidden
        self.cfg, self.meta = cfg, dict(meta or {})
        self.fuse = ops.linear("draft.fuse", "draft_fuse", [(w("fuse.weight", h, h * len(cfg.taps)), None)])
        self.inp = ops.linear("draft.inp", "draft_in", [(w("inp.weight", h, 2 * h), None)])
        self.layers = nn.ModuleList([LlamaLayer(cfg.text, ops, w.scoped("layer."), "draft.layer", "draft",
                                                rope_theta=cfg.rope_theta)])
        self.norm = ops.rms_norm("draft.norm", "draft_norm", w("norm.weight", h), cfg.text.eps)
        self.head = ops.linear("draft.head", "draft_head", [(w("head.weight", cfg.draft_vocab, h), None)])
        d2t = w.src.take(w.prefix + "d2t", (cfg.draft_vocab,), torch.int64)
        self.register_buffer("d2t", d2t, persistent=False)

    def features(self, taps: Sequence[torch.Tensor]) -> torch.Tensor:
        """target hidden after each tap layer [B, n, H] -> fused feature [B, n, H]."""
        return self.fuse(torch.cat(list(taps), dim=-1))

    def inputs(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """emb [B, n, H] of the next token, hidden [B, n, H] (fused feature or own output) -> [B, n, H]."""
        return self.inp(torch.cat([emb, hidden], dim=-1))

    def rope_tables(self, positions):
        return self.layers[0].rope.tables(positions, self.layers[0].head_dim)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """draft hidden [B, n, H] -> draft-vocabulary logits [B, n, Vd]."""
        return self.head(self.norm(g))


def draft_ops(engine: LlmEngine) -> OpResolver:
    """The engine's decode table plus fp32 aten GEMMs for the draft's roles (no per-row-count packing);
    a user table naming these roles more specifically still wins."""
    base = engine.resolvers["decode"]
    extra = tuple(Record(impl_id="fused", op_kind=kind, layer_role=role, impl_params={"backend": "aten"},
                         source="speculative draft: aten GEMMs") for kind, role in _DRAFT_GEMMS)
    return OpResolver(Table(base.table.records + extra), base.hw_profile, base.model, base.stage_of)


def init_draft_weights(cfg: DraftConfig, target_embed: torch.Tensor, d2t: torch.Tensor, seed: int = 0) -> dict:
    """Random draft weights (std 0.02, norms 1); the head starts as the target's embedding rows of d2t."""
    g = torch.Generator().manual_seed(seed)
    t, h = cfg.text, cfg.text.hidden

    def rnd(*shape):
        return torch.randn(shape, generator=g) * 0.02

    return {"fuse.weight": rnd(h, h * len(cfg.taps)), "inp.weight": rnd(h, 2 * h), "norm.weight": torch.ones(h),
            "head.weight": target_embed[d2t].clone(), "d2t": d2t.to(torch.int64).clone(),
            "layer.input_layernorm.weight": torch.ones(h), "layer.post_attention_layernorm.weight": torch.ones(h),
            "layer.self_attn.q_proj.weight": rnd(t.heads * t.head_dim, h),
            "layer.self_attn.k_proj.weight": rnd(t.kv_heads * t.head_dim, h),
            "layer.self_attn.v_proj.weight": rnd(t.kv_heads * t.head_dim, h),
            "layer.self_attn.o_proj.weight": rnd(h, t.heads * t.head_dim),
            "layer.mlp.gate_proj.weight": rnd(t.inner, h), "layer.mlp.up_proj.weight": rnd(t.inner, h),
            "layer.mlp.down_proj.weight": rnd(h, t.inner)}


def build_draft(cfg: DraftConfig, tensors: dict, ops, meta: dict | None = None) -> DraftHead:
    src = TensorSource(tensors, "draft head")
    head = DraftHead(cfg, ops, src.scoped(""), meta)
    src.check_all_used()
    return head


def save_draft(path: str | Path, cfg: DraftConfig, tensors: dict, target_fp: str, meta: dict | None = None,
               head_from_target: bool = False, half: bool = False) -> Path:
    """Write a draft head. ``head_from_target``: leave out ``head.weight`` (it must equal the target's
    embedding rows of d2t; rebuilt at load); ``half``: store float matrices as fp16 (read back as fp32)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {}
    for k, v in tensors.items():
        if k == "head.weight" and head_from_target:
            continue
        v = v.detach().contiguous()
        out[k] = v.half() if half and v.is_floating_point() and v.dim() == 2 else v
    md = {"format": DRAFT_FORMAT, "config": cfg.to_json(), "target": target_fp, "meta": json.dumps(meta or {}),
          "head": "target_embed" if head_from_target else "stored"}
    save_file(out, str(path), metadata=md)
    return path


def load_draft(path: str | Path, engine: LlmEngine) -> DraftHead:
    """A saved draft head, refused unless trained for this engine's weights."""
    path = Path(path)
    md = MappedSafetensors(path).metadata
    if md.get("format") != DRAFT_FORMAT:
        raise ValueError(f"{path}: not a draft head file (format {md.get('format')!r})")
    if md.get("target") != engine.weights_fp:
        raise ValueError(f"{path}: draft head was trained for other target weights "
                         f"({str(md.get('target'))[:12]}... vs {engine.weights_fp[:12]}...)")
    cfg = DraftConfig.from_json(md["config"])
    tensors = {k: v.float() if v.dtype == torch.float16 else v for k, v in load_file(str(path)).items()}
    if md.get("head") == "target_embed":
        tensors["head.weight"] = engine.lm["decode"].token_embedding[tensors["d2t"]].detach().clone()
    with torch.no_grad():
        return build_draft(cfg, tensors, draft_ops(engine), json.loads(md.get("meta", "{}"))).eval()

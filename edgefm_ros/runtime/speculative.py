"""EAGLE-3 style speculative decoding: a one-layer draft head over the target's low/mid/high features.

Draft head (``DraftHead``): the target's hidden states after three layers (low, mid, high) are fused
(``fuse``: 3H -> H); at position i the draft takes ``inp(cat(embed(x[i+1]), feature_i))`` through one
Llama decoder layer (its own KV cache) and predicts x[i+2] over a reduced draft vocabulary (``d2t``
maps draft ids to target ids). Later chain steps feed the draft's own output hidden in place of the
target feature (trained for that: training-time test, see ``edgefm_ros/tools/train_draft.py``).

Decoding (greedy): the draft proposes a chain of k tokens, the target scores the pending token plus
the chain in one pass, the longest prefix that matches the target's own argmax is committed plus the
target's token after it. Every committed token is the target's argmax given the committed prefix, so
the output is token-for-token the plain greedy output.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from edgefm_ros.models.smollm import LlamaLayer
from edgefm_ros.runtime.config import TextConfig

from .generate import Generation, GenerationError, LlmEngine, SamplingConfig, _Stream, causal_mask, run_layers
from .kv_cache import StaticKVCache

DRAFT_FORMAT = "edgefm-eagle3-draft/1"


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
        d = asdict(self)
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> "DraftConfig":
        d = json.loads(s)
        return cls(TextConfig(**d.pop("text")), tuple(d.pop("taps")), **d)


def draft_config_for(engine: LlmEngine, draft_vocab: int, inner: int | None = None) -> DraftConfig:
    t = engine.cfg.text
    text = TextConfig(hidden=t.hidden, inner=inner or t.inner, layers=1, heads=t.heads, kv_heads=t.kv_heads,
                      head_dim=t.head_dim, vocab=draft_vocab, eps=t.eps)
    return DraftConfig(text, default_taps(t.layers), min(draft_vocab, t.vocab), t.vocab, engine.cfg.rope_theta)


class DraftHead(nn.Module):
    """fuse (taps*H -> H), inp (2H -> H), one Llama layer, norm, head (H -> draft vocab); ops via the resolver."""

    def __init__(self, cfg: DraftConfig, ops, w):
        super().__init__()
        h = cfg.text.hidden
        self.cfg = cfg
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


def init_draft_weights(cfg: DraftConfig, target_embed: torch.Tensor, d2t: torch.Tensor, seed: int = 0) -> dict:
    """Random draft weights (std 0.02, norms 1); the head starts as the target's embedding rows of d2t."""
    g = torch.Generator().manual_seed(seed)
    t, h = cfg.text, cfg.text.hidden

    def rnd(*shape):
        return torch.randn(shape, generator=g) * 0.02

    w = {"fuse.weight": rnd(h, h * len(cfg.taps)), "inp.weight": rnd(h, 2 * h), "norm.weight": torch.ones(h),
         "head.weight": target_embed[d2t].clone(), "d2t": d2t.to(torch.int64).clone(),
         "layer.input_layernorm.weight": torch.ones(h), "layer.post_attention_layernorm.weight": torch.ones(h),
         "layer.self_attn.q_proj.weight": rnd(t.heads * t.head_dim, h),
         "layer.self_attn.k_proj.weight": rnd(t.kv_heads * t.head_dim, h),
         "layer.self_attn.v_proj.weight": rnd(t.kv_heads * t.head_dim, h),
         "layer.self_attn.o_proj.weight": rnd(h, t.heads * t.head_dim),
         "layer.mlp.gate_proj.weight": rnd(t.inner, h), "layer.mlp.up_proj.weight": rnd(t.inner, h),
         "layer.mlp.down_proj.weight": rnd(h, t.inner)}
    return w


def build_draft(cfg: DraftConfig, tensors: dict, ops) -> DraftHead:
    from .gguf_loader import TensorSource

    src = TensorSource(tensors, "draft head")
    head = DraftHead(cfg, ops, src.scoped(""))
    src.check_all_used()
    return head


def save_draft(path: str | Path, cfg: DraftConfig, tensors: dict, target_fp: str, meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = {"format": DRAFT_FORMAT, "config": cfg.to_json(), "target": target_fp,
          "meta": json.dumps(meta or {})}
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path), metadata=md)
    return path


def load_draft(path: str | Path, engine: LlmEngine) -> DraftHead:
    """A saved draft head, refused unless trained for this engine's weights."""
    from .safetensors_mmap import MappedSafetensors

    path = Path(path)
    md = MappedSafetensors(path).metadata
    if md.get("format") != DRAFT_FORMAT:
        raise ValueError(f"{path}: not a draft head file (format {md.get('format')!r})")
    if md.get("target") != engine.weights_fp:
        raise ValueError(f"{path}: draft head was trained for other target weights "
                         f"({str(md.get('target'))[:12]}... vs {engine.weights_fp[:12]}...)")
    cfg = DraftConfig.from_json(md["config"])
    with torch.no_grad():
        return build_draft(cfg, load_file(str(path)), engine.resolvers["decode"]).eval()


class SpeculativeDecoder:
    """Greedy chain speculation with a draft head; ``generate`` mirrors ``LlmEngine.generate``."""

    def __init__(self, engine: LlmEngine, draft: DraftHead, k: int = 4):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (draft tokens per step) must be a positive integer, got {k!r}")
        t = draft.cfg.text
        if engine.cfg.text.hidden != t.hidden or max(draft.cfg.taps) >= engine.cfg.text.layers:
            raise ValueError("draft head does not fit this target (hidden size or tap layers)")
        self.engine, self.draft, self.k = engine, draft, k
        codec = engine.resolvers["decode"].build("kv", "draft.kv_cache", "draft_kv", f"h{t.kv_heads}xd{t.head_dim}",
                                                 {"kv_heads": t.kv_heads, "head_dim": t.head_dim})
        self.cache = StaticKVCache(codec, 1, 1, t.kv_heads, engine.config.capacity, t.head_dim)
        self.valid_from = 0  # first draft cache slot with an entry (> 0 when a fixed prefix was reused)

    def _draft_pass(self, emb: torch.Tensor, hidden: torch.Tensor, start: int) -> torch.Tensor:
        """Draft layer over positions [start, start + n) -> its output hidden [1, n, H]."""
        n = emb.shape[1]
        x = self.draft.inputs(emb, hidden)
        if self.valid_from:  # a reused prefix left no draft entries below valid_from
            mask = causal_mask(start, n) & (torch.arange(start + n) >= self.valid_from)[None, None]
        else:
            mask = None if n == 1 else causal_mask(start, n)
        g, _ = run_layers(self.draft, x, torch.arange(start, start + n)[None], mask, self.cache, start)
        self.cache.length = start + n
        return g

    def _propose(self, tokens: Sequence[int], feats: torch.Tensor, start: int, k: int) -> list[int]:
        """Catch the draft cache up (positions start.., inputs tokens[i] and target features), then chain k."""
        lm = self.engine.lm["decode"]
        g = self._draft_pass(lm.embed_tokens(torch.tensor([list(tokens)])), feats, start)[:, -1:]
        keep = self.cache.length
        out = []
        for j in range(k):
            tok = int(self.draft.d2t[torch.argmax(self.draft.logits(g)[0, -1])])
            out.append(tok)
            if j + 1 < k:
                g = self._draft_pass(lm.embed_tokens(torch.tensor([[tok]])), g, self.cache.length)
        self.cache.length = keep  # speculative entries are scratch
        return out

    @torch.inference_mode()
    def generate(self, prompt, sampling: SamplingConfig = SamplingConfig(),
                 on_token: Callable[[int, str], None] | None = None) -> Generation:
        if not sampling.greedy:
            raise GenerationError("speculative decoding here is greedy only (temperature 0)")
        e, taps = self.engine, self.draft.cfg.taps
        t0 = time.perf_counter()
        ids, start, _ = e.begin(e.encode(prompt), None)
        if len(ids) + sampling.max_new_tokens + self.k + 1 > e.config.capacity:
            raise GenerationError(f"prompt of {len(ids)} tokens + max_new_tokens {sampling.max_new_tokens} exceeds "
                                  f"the KV capacity {e.config.capacity}")
        logits, tapped = e.prefill(ids[start:], start, taps=taps)
        nxt = int(torch.argmax(logits))
        seq = list(ids)  # committed tokens in the target cache, then `nxt` pending
        feats, fstart = self.draft.features(tapped), start  # target features not yet in the draft cache
        stops, stream = e.stop_ids(sampling), _Stream(e.tokenizer, sampling.stop_strings, on_token)
        out, accepted = [], []
        t1, ttft, reason = t0, 0.0, "length"
        self.cache.length = self.valid_from = start
        while True:
            if not out:
                t1 = time.perf_counter()
                ttft = t1 - t0
            done = self._commit(nxt, out, stops, stream, sampling.max_new_tokens)
            if done:
                reason = done
                break
            draft = self._propose(seq[fstart + 1:] + [nxt], feats, fstart, self.k)
            base = e.cache.length
            v_logits, v_taps = e.forward_decode([nxt] + draft, taps)
            y = torch.argmax(v_logits, dim=-1).tolist()  # target's choice after each of the k + 1 tokens
            a = 0
            while a < len(draft) and draft[a] == y[a]:
                a += 1
            accepted.append(a + 1)
            e.cache.length = base + 1 + a
            seq += [nxt] + draft[:a]
            feats, fstart = self.draft.features([t[:, :a + 1] for t in v_taps]), base
            for tok in draft[:a]:
                done = self._commit(tok, out, stops, stream, sampling.max_new_tokens)
                if done:
                    break
            if done:
                reason = done
                break
            nxt = y[a]
        return Generation(out, stream.text, reason, len(ids), len(ids) - start, ttft, time.perf_counter() - t1,
                          accepted)

    @staticmethod
    def _commit(tok: int, out: list, stops, stream: _Stream, limit: int) -> str | None:
        """Append one token; the stop reason when generation ends with it."""
        if tok in stops:
            stream.emit(tok, True)
            return "eos"
        out.append(tok)
        if stream.push(out):
            stream.emit(tok, True)
            return "stop_string"
        if len(out) >= limit:
            stream.emit(tok, True)
            return "length"
        stream.emit(tok, False)
        return None

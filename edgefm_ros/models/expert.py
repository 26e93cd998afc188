"""The action expert: a narrower Llama stack whose layers alternate between self-attention over
(prefix keys/values + action tokens) and cross-attention into the VLM's per-layer keys/values."""
from __future__ import annotations

import torch
from torch import nn

from .config import TextConfig


class ExpertLayer(nn.Module):
    def __init__(self, cfg: TextConfig, hidden: int, inner: int, cross: bool, ops, w, name: str):
        super().__init__()
        hd, kvd = cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.cross, self.heads, self.kv_heads, self.head_dim = cross, cfg.heads, cfg.kv_heads, hd
        kind = "cross" if cross else "self"
        self.norm1 = ops.rms_norm(f"{name}.input_layernorm", "expert_norm", w("input_layernorm.weight", hidden), cfg.eps)
        q = (w("self_attn.q_proj.weight", cfg.heads * hd, hidden), None)
        if cross:
            # keys/values come from the VLM cache (width kv_heads * head_dim), projected once per chunk
            self.q = ops.linear(f"{name}.self_attn.q_proj", "expert_cross_q", [q])
            self.ctx_k = ops.linear(f"{name}.self_attn.k_proj", "expert_cross_kv",
                                    [(w("self_attn.k_proj.weight", kvd, kvd), None)])
            self.ctx_v = ops.linear(f"{name}.self_attn.v_proj", "expert_cross_kv",
                                    [(w("self_attn.v_proj.weight", kvd, kvd), None)])
        else:
            self.qkv = ops.linear(f"{name}.self_attn.qkv", "expert_self_qkv",
                                  [q, (w("self_attn.k_proj.weight", kvd, hidden), None),
                                   (w("self_attn.v_proj.weight", kvd, hidden), None)])
        self.rope = ops.rope(f"{name}.rope", f"expert_{kind}_rope", hd, 10_000.0)
        self.attn = ops.attention(f"{name}.self_attn", f"expert_{kind}_attn", cfg.heads, cfg.kv_heads, hd)
        self.o = ops.linear(f"{name}.self_attn.o_proj", "expert_o", [(w("self_attn.o_proj.weight", hidden, cfg.heads * hd), None)])
        self.norm2 = ops.rms_norm(f"{name}.post_attention_layernorm", "expert_norm",
                                  w("post_attention_layernorm.weight", hidden), cfg.eps)
        self.mlp = ops.mlp(f"{name}.mlp", "expert_mlp", {"gate": w("mlp.gate_proj.weight", inner, hidden),
                                                         "up": w("mlp.up_proj.weight", inner, hidden),
                                                         "down": w("mlp.down_proj.weight", hidden, inner)},
                           "silu_gated", hidden, inner)

    def context(self, vlm_k, vlm_v):
        """Cross layers: the expert's K/V of the VLM layer's keys/values [B, Hkv, P, D] -> same shapes."""
        b, hkv, p, d = vlm_k.shape
        heads = lambda t: t.view(b, p, self.kv_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        k = self.ctx_k(vlm_k.transpose(1, 2).reshape(b, p, hkv * d))
        v = self.ctx_v(vlm_v.transpose(1, 2).reshape(b, p, hkv * d))
        return heads(k), heads(v)

    def forward(self, x, rope_tables, ctx_k, ctx_v, mask):
        """x [B, C, He]; ctx_k/ctx_v [B, Hkv, P, D]; mask bool [B, C, P (+C for self layers)] -> [B, C, He]."""
        b, c, _ = x.shape
        h = self.norm1(x)
        if self.cross:
            q = self.rope(self.q(h).view(b, c, self.heads, self.head_dim), rope_tables).transpose(1, 2)
            k, v = ctx_k, ctx_v
        else:
            q, k, v = self.qkv(h)
            q = self.rope(q.view(b, c, self.heads, self.head_dim), rope_tables).transpose(1, 2)
            k = self.rope(k.view(b, c, self.kv_heads, self.head_dim), rope_tables).transpose(1, 2)
            v = v.view(b, c, self.kv_heads, self.head_dim).transpose(1, 2)
            k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        a = self.attn(q, k, v, mask)
        x = self.o(a.transpose(1, 2).reshape(b, c, -1), residual=x)
        return self.mlp(self.norm2(x), residual=x)

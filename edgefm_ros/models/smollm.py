"""The SmolLM2 (Llama) decoder layers of the VLM, run over the prefix.

SmolVLA consumes the VLM only through its per-layer keys/values: ``prefix_kv`` returns them and skips
the work whose output nothing reads (the last layer's attention output and MLP).
"""
from __future__ import annotations

from torch import nn

from .config import TextConfig


class LlamaLayer(nn.Module):
    def __init__(self, cfg: TextConfig, ops, w, name: str, role: str, rope_theta: float = 10_000.0):
        super().__init__()
        h, hd = cfg.hidden, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, hd
        self.norm1 = ops.rms_norm(f"{name}.input_layernorm", f"{role}_norm", w("input_layernorm.weight", h), cfg.eps)
        self.qkv = ops.linear(f"{name}.self_attn.qkv", f"{role}_qkv",
                              [(w("self_attn.q_proj.weight", cfg.heads * hd, h), None),
                               (w("self_attn.k_proj.weight", cfg.kv_heads * hd, h), None),
                               (w("self_attn.v_proj.weight", cfg.kv_heads * hd, h), None)])
        self.rope = ops.rope(f"{name}.rope", f"{role}_rope", hd, rope_theta)
        self.attn = ops.attention(f"{name}.self_attn", f"{role}_attn", cfg.heads, cfg.kv_heads, hd)
        self.o = ops.linear(f"{name}.self_attn.o_proj", f"{role}_o",
                            [(w("self_attn.o_proj.weight", h, cfg.heads * hd), None)])
        self.norm2 = ops.rms_norm(f"{name}.post_attention_layernorm", f"{role}_norm",
                                  w("post_attention_layernorm.weight", h), cfg.eps)
        self.mlp = ops.mlp(f"{name}.mlp", f"{role}_mlp", {"gate": w("mlp.gate_proj.weight", cfg.inner, h),
                                                          "up": w("mlp.up_proj.weight", cfg.inner, h),
                                                          "down": w("mlp.down_proj.weight", h, cfg.inner)},
                           "silu_gated", h, cfg.inner)

    def qkv_heads(self, x, rope_tables):
        """x [B, L, H] -> q [B, Hq, L, D], k/v [B, Hkv, L, D] (q, k rotated)."""
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x))
        q = self.rope(q.view(b, n, self.heads, self.head_dim), rope_tables).transpose(1, 2)
        k = self.rope(k.view(b, n, self.kv_heads, self.head_dim), rope_tables).transpose(1, 2)
        return q, k, v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)

    def finish(self, x, attn_out):
        """Residual + o_proj + MLP block. attn_out [B, Hq, L, D]."""
        b, _, n, _ = attn_out.shape
        x = self.o(attn_out.transpose(1, 2).reshape(b, n, -1), residual=x)
        return self.mlp(self.norm2(x), residual=x)


class SmolLM(nn.Module):
    """The VLM's text model as SmolVLA uses it: the token embedding and its *first* ``n_layers`` decoder layers
    (``num_vlm_layers`` of SmolVLA's config), no final norm, no LM head; not a language model on its own
    (the autoregressive SmolLM2 is ``llm.CausalLM``)."""

    def __init__(self, cfg: TextConfig, n_layers: int, ops, w):
        super().__init__()
        self.token_embedding = w("embed_tokens.weight", cfg.vocab, cfg.hidden)  # [V, H] weight
        self.layers = nn.ModuleList(LlamaLayer(cfg, ops, w.scoped(f"layers.{i}."), f"vlm.layers.{i}", "vlm")
                                    for i in range(n_layers))
        w("norm.weight", cfg.hidden)  # final norm: its output is never read by SmolVLA (checked, not kept)

    def prefix_kv(self, x, rope_tables, mask):
        """x [B, P, H] prefix embeddings -> per layer (k [B, Hkv, P, D] rotated, v [B, Hkv, P, D])."""
        kv = []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv_heads(x, rope_tables)
            kv.append((k, v))
            if i + 1 < len(self.layers):
                x = layer.finish(x, layer.attn(q, k, v, mask))
        return kv

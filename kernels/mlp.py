"""Feed-forward blocks.

``impl.build(spec, params, weights={...}, act="silu_gated" | "gelu_tanh")``:
  silu_gated: weights {"gate": W [I, H], "up": W [I, H], "down": W [H, I]} (no biases, Llama style)
  gelu_tanh:  weights {"fc1": (W [I, H], b), "fc2": (W [H, I], b)} (SigLIP style)
-> module ``forward(x [..., H]) -> [..., H]``.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from .registry import Impl, OpSpec, register

ACTS = ("silu_gated", "gelu_tanh")


class MlpRef(nn.Module):
    def __init__(self, weights, act: str):
        super().__init__()
        if act not in ACTS:
            raise ValueError(f"unknown MLP activation {act!r}; known: {ACTS}")
        self.act = act
        self.w = dict(weights)

    def forward(self, x):
        w = self.w
        if self.act == "silu_gated":
            return F.linear(F.silu(F.linear(x, w["gate"])) * F.linear(x, w["up"]), w["down"])
        h = F.gelu(F.linear(x, *w["fc1"]), approximate="tanh")
        return F.linear(h, *w["fc2"])


register(Impl("mlp", "ref", lambda spec, params, weights, act: MlpRef(weights, act), reference=True,
              doc="unfused fp32 MLP (Llama gated SiLU or SigLIP GELU-tanh)"))

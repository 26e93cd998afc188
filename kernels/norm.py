"""Normalisation layers.

rms_norm:   ``impl.build(spec, params, weight [H], eps)`` -> module(x [..., H]); Llama semantics: statistics
            in fp32, normalised value cast back to x's dtype, then scaled by the weight.
layer_norm: ``impl.build(spec, params, weight [H], bias [H], eps)`` -> module(x [..., H]).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Impl, register


class RmsNormRef(nn.Module):
    def __init__(self, weight, eps: float):
        super().__init__()
        self.weight, self.eps = weight, eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LayerNormRef(nn.Module):
    def __init__(self, weight, bias, eps: float):
        super().__init__()
        self.weight, self.bias, self.eps = weight, bias, eps

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


register(Impl("rms_norm", "ref", lambda spec, params, weight, eps: RmsNormRef(weight, eps), reference=True))
register(Impl("layer_norm", "ref", lambda spec, params, weight, bias, eps: LayerNormRef(weight, bias, eps),
              reference=True))

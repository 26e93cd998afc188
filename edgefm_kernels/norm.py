"""Normalisation layers.

rms_norm:   ``impl.build(spec, params, weight [H], eps)`` -> module(x [..., H]); Llama semantics: statistics
            in fp32, normalised value cast back to x's dtype, then scaled by the weight.
layer_norm: ``impl.build(spec, params, weight [H], bias [H], eps)`` -> module(x [..., H]).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import bf16_rows, cpu_rows, native
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


class _ParamsLike:
    """Parameters cast once to the dtype of the activations they meet (bf16 stages keep bf16)."""

    def __init__(self, *params):
        self.params = params
        self._cast: dict[torch.dtype, tuple] = {}

    def like(self, x: torch.Tensor) -> tuple:
        got = self._cast.get(x.dtype)
        if got is None:
            got = self._cast[x.dtype] = tuple(p.to(x.dtype).contiguous() for p in self.params)
        return got


class RmsNormFast(nn.Module):
    """RMSNorm that keeps x's dtype end to end (the weight cast to it once): torch's fused rms_norm
    (fp32 statistics, the normalised value in x's dtype) times the weight."""

    def __init__(self, weight, eps: float):
        super().__init__()
        self.p, self.eps = _ParamsLike(weight), eps

    def forward(self, x):
        (w,) = self.p.like(x)
        return w * F.rms_norm(x, (x.shape[-1],), None, self.eps)


class LayerNormFast(nn.Module):
    """F.layer_norm with weight/bias cast once to x's dtype (fp32 statistics inside torch's kernel)."""

    def __init__(self, weight, bias, eps: float):
        super().__init__()
        self.p, self.eps = _ParamsLike(weight, bias), eps

    def forward(self, x):
        w, b = self.p.like(x)
        return F.layer_norm(x, (x.shape[-1],), w, b, self.eps)


register(Impl("rms_norm", "fast", lambda spec, params, weight, eps: RmsNormFast(weight, eps),
              doc="reference math, weight in the activations' dtype (bf16 stages stay bf16)"))
register(Impl("layer_norm", "fast", lambda spec, params, weight, bias, eps: LayerNormFast(weight, bias, eps),
              doc="F.layer_norm with parameters in the activations' dtype"))


class RmsNormAvx512(nn.Module):
    """RMSNorm as one AVX-512 pass per row (cpu_rows.py) in fp32; other activation dtypes are cast in and
    the result back (exact mode, its target, is fp32 throughout)."""

    def __init__(self, weight, eps: float):
        super().__init__()
        self.weight, self.eps = weight.float().contiguous(), eps

    def forward(self, x):
        if x.dtype == torch.float32:
            return cpu_rows.rms_norm(x, self.weight, self.eps)
        return cpu_rows.rms_norm(x.float(), self.weight, self.eps).to(x.dtype)


register(Impl("rms_norm", "avx512", lambda spec, params, weight, eps: RmsNormAvx512(weight, eps),
              check=native.avx512_check(cpu_rows.NAME), doc="one AVX-512 pass per row (csrc/cpu_rows.c), fp32"))


class RmsNormBf16(nn.Module):
    """RMSNorm of bf16 activations as one AVX-512 pass per row (bf16_rows.py), rounded like ``fast``;
    other dtypes are cast in and the result back."""

    def __init__(self, weight, eps: float):
        super().__init__()
        self.weight, self.eps = weight.to(torch.bfloat16).contiguous(), eps

    def forward(self, x):
        if x.dtype == torch.bfloat16:
            return bf16_rows.rms_norm(x, self.weight, self.eps)
        return bf16_rows.rms_norm(x.bfloat16(), self.weight, self.eps).to(x.dtype)


class LayerNormBf16(nn.Module):
    """LayerNorm of bf16 activations, fp32 statistics and parameters, one AVX-512 pass per row."""

    def __init__(self, weight, bias, eps: float):
        super().__init__()
        self.weight, self.bias, self.eps = weight.float().contiguous(), bias.float().contiguous(), eps

    def forward(self, x):
        if x.dtype == torch.bfloat16:
            return bf16_rows.layer_norm(x, self.weight, self.bias, self.eps)
        return bf16_rows.layer_norm(x.bfloat16(), self.weight, self.bias, self.eps).to(x.dtype)


def _check_bf16(spec, params) -> str | None:
    if not spec.hw_profile.startswith("cpu_x86_avx512_bf16"):
        return f"{bf16_rows.NAME} needs an AVX512-BF16 CPU profile, this is {spec.hw_profile!r}"
    return native.unavailable(bf16_rows.NAME)


register(Impl("rms_norm", "bf16", lambda spec, params, weight, eps: RmsNormBf16(weight, eps), precision="bf16",
              check=_check_bf16, doc="one AVX-512 pass per bf16 row (csrc/bf16_rows.c), fp32 statistics"))
register(Impl("layer_norm", "bf16", lambda spec, params, weight, bias, eps: LayerNormBf16(weight, bias, eps),
              precision="bf16", check=_check_bf16,
              doc="one AVX-512 pass per bf16 row (csrc/bf16_rows.c), fp32 statistics and parameters"))

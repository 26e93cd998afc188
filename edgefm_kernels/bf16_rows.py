"""Python side of ``csrc/bf16_rows.c``: bf16 GEMM epilogues and norms as single AVX-512 passes (fast mode).

    gelu_tanh_(y [..., N] bf16)                  # in place, returns y
    silu_glu(y [..., 2I] bf16 (gate | up))       # -> silu(gate) * up [..., I] bf16
    rms_norm(x [..., H] bf16, w [H] bf16, eps)   # -> bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))
    layer_norm(x [..., H] bf16, w [H] f32, b [H] f32, eps)   # -> bf16((x - mean) * rstd * w + b)
    rope(x [B, L, H, D] bf16 (unit last stride), cos, sin [B, L, 1, D/2] f32)   # -> [B, L, H, D] bf16

Computed in fp32 per element, rounded once to bf16 (nearest even). Needs AVX512-BF16 (native.ISA).
"""
from __future__ import annotations

import ctypes

import torch

from . import native

NAME = "bf16_rows"
_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_gelu_tanh_bf16": ([_PTR, _I64, _I32], None),
    "edgefm_silu_glu_bf16": ([_PTR, _I64, _I64, _PTR, _I32], None),
    "edgefm_rms_norm_bf16": ([_PTR, _PTR, _I64, _I64, ctypes.c_float, _PTR, _I32], None),
    "edgefm_layer_norm_bf16": ([_PTR, _PTR, _PTR, _I64, _I64, ctypes.c_float, _PTR, _I32], None),
    "edgefm_rope_bf16": ([_PTR] + [_I64] * 7 + [_PTR, _PTR, _PTR, _I32], None),
}


def _check(y: torch.Tensor) -> None:
    if y.dtype != torch.bfloat16 or y.device.type != "cpu" or not y.is_contiguous():
        raise ValueError(f"the bf16 epilogue kernels take a contiguous bfloat16 CPU tensor, got {y.dtype} on "
                         f"{y.device} (contiguous: {y.is_contiguous()})")


def gelu_tanh_(y: torch.Tensor) -> torch.Tensor:
    _check(y)
    native.bind(NAME, SIGNATURES).edgefm_gelu_tanh_bf16(y.data_ptr(), y.numel(), torch.get_num_threads())
    return y


def silu_glu(y: torch.Tensor) -> torch.Tensor:
    _check(y)
    if y.shape[-1] % 2:
        raise ValueError(f"silu_glu takes [..., 2I] (gate | up), got last dimension {y.shape[-1]}")
    inner = y.shape[-1] // 2
    out = torch.empty(*y.shape[:-1], inner, dtype=torch.bfloat16)
    native.bind(NAME, SIGNATURES).edgefm_silu_glu_bf16(y.data_ptr(), y.numel() // y.shape[-1] if inner else 0, inner,
                                                       out.data_ptr(), torch.get_num_threads())
    return out


def _param(name: str, t: torch.Tensor, h: int, dtype: torch.dtype) -> None:
    if t.dtype != dtype or tuple(t.shape) != (h,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {dtype} [{h}] tensor, got {t.dtype} {tuple(t.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    _check(x)
    h = x.shape[-1]
    _param("rms_norm weight", weight, h, torch.bfloat16)
    y = torch.empty_like(x)
    native.bind(NAME, SIGNATURES).edgefm_rms_norm_bf16(x.data_ptr(), weight.data_ptr(), x.numel() // h if h else 0, h,
                                                       eps, y.data_ptr(), torch.get_num_threads())
    return y


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    _check(x)
    h = x.shape[-1]
    _param("layer_norm weight", weight, h, torch.float32)
    _param("layer_norm bias", bias, h, torch.float32)
    y = torch.empty_like(x)
    native.bind(NAME, SIGNATURES).edgefm_layer_norm_bf16(x.data_ptr(), weight.data_ptr(), bias.data_ptr(),
                                                         x.numel() // h if h else 0, h, eps, y.data_ptr(),
                                                         torch.get_num_threads())
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D] bf16 with unit stride in D (a slice of a fused QKV output is fine); cos/sin
    [B, L, 1, D/2] f32 -> rotated [B, L, H, D] bf16, contiguous (fp32 math, one rounding)."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.dim() != 4:
        raise ValueError(f"rope x must be a 4-d bfloat16 CPU tensor, got {tuple(x.shape)} {x.dtype} on {x.device}")
    b, l, nh, d = x.shape
    if d % 2 or tuple(cos.shape) != (b, l, 1, d // 2) or cos.shape != sin.shape or cos.dtype != torch.float32:
        raise ValueError(f"rope tables must be float32 [B, L, 1, D/2] = {(b, l, 1, d // 2)} for x {tuple(x.shape)}, "
                         f"got {cos.dtype} {tuple(cos.shape)} and {tuple(sin.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((b, l, nh, d), dtype=torch.bfloat16)
    native.bind(NAME, SIGNATURES).edgefm_rope_bf16(x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), b, l, nh, d,
                                                   cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                                                   torch.get_num_threads())
    return out

"""Python side of ``csrc/cpu_rows.c``: fp32 RMSNorm and RoPE as single AVX-512 passes (exact mode's
per-token ops; torch runs each as 4-6 separate kernels).

    y = rms_norm(x [..., H] f32, weight [H] f32, eps)            # -> [..., H] f32
    y = rope(x [B, L, H, D] f32 (unit last stride), cos, sin)     # cos/sin [B, L, 1, D/2] -> [B, L, H, D]

Both compute in fp32 only; the norm/rope impls around them cast other activation dtypes in and out.
"""
from __future__ import annotations

import ctypes

import torch

from . import native

NAME = "cpu_rows"


_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_rms_norm": ([_PTR, _PTR, _I64, _I64, ctypes.c_float, _PTR, _I32], None),
    "edgefm_rope": ([_PTR] + [_I64] * 7 + [_PTR, _PTR, _PTR, _I32], None),
}


def _lib():
    return native.bind(NAME, SIGNATURES)


def _fp32(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(f"{name} must be float32 on CPU for the AVX-512 kernel, got {t.dtype} on {t.device}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] f32, weight [H] f32 (contiguous) -> w * x / sqrt(mean(x^2) + eps), [..., H] f32."""
    _fp32("x", x)
    h = x.shape[-1]
    if tuple(weight.shape) != (h,):
        raise ValueError(f"rms_norm weight must have shape ({h},), got {tuple(weight.shape)}")
    x = x.contiguous()
    y = torch.empty_like(x)
    _lib().edgefm_rms_norm(x.data_ptr(), weight.data_ptr(), x.numel() // h if h else 0, h, eps, y.data_ptr(),
                           torch.get_num_threads())
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D] f32 with unit stride in D (a slice of a fused QKV output is fine); cos/sin
    [B, L, 1, D/2] f32 contiguous -> rotated [B, L, H, D] f32, contiguous."""
    _fp32("x", x)
    b, l, nh, d = x.shape
    if d % 2 or tuple(cos.shape) != (b, l, 1, d // 2) or cos.shape != sin.shape:
        raise ValueError(f"rope tables must be [B, L, 1, D/2] = {(b, l, 1, d // 2)} for x {tuple(x.shape)}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((b, l, nh, d), dtype=torch.float32)
    _lib().edgefm_rope(x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), b, l, nh, d, cos.data_ptr(),
                       sin.data_ptr(), out.data_ptr(), torch.get_num_threads())
    return out

"""Python side of ``csrc/attention.c``: fp32 attention over whole score rows with AVX-512 (exact mode's
vision tower: 1024 x 1024 scores per head, where torch's fp32 flash kernel runs at ~2/3 of GEMM speed).

    out = attention(q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, D], mask [B, Lq, Lk] bool | None)
        # f32, unit stride in D (slices of a fused QKV output are fine), any head size D
        # -> [B, H, Lq, D] f32, a view of a [B, Lq, H, D] buffer (the layout the output projection reads)
"""
from __future__ import annotations

import ctypes

import torch

from . import native

NAME = "attention"

_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_attention_scratch": ([_I64, _I64], _I64),
    "edgefm_attention": ([_PTR, _I64, _I64, _I64] * 3 + [_PTR, _I64, _I64, _I64] + [_I64] * 6
                         + [_PTR, ctypes.c_float, _PTR, _I32], None),
}


def unavailable() -> str | None:
    """Why this kernel cannot run on this machine, or None."""
    return native.unavailable(NAME)


def _lib():
    return native.bind(NAME, SIGNATURES)


def operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype,
             head_dim: int | None = None):
    """The compiled attention kernels' operand checks (ValueError naming the bad value): q [B, H, Lq, D],
    k/v [B, Hkv, Lk, D] 4-d ``dtype`` CPU tensors (D = ``head_dim`` when given), unit stride in D (copied
    otherwise), Hkv dividing H, Lq, Lk, D >= 1, mask bool [B, Lq, Lk] or None.
    -> (q, k, v, mask as uint8 contiguous or None)."""
    def operand(name: str, t: torch.Tensor) -> torch.Tensor:
        if t.dtype != dtype or t.device.type != "cpu" or t.dim() != 4 or head_dim not in (None, t.shape[-1]):
            size = f" with head size {head_dim}" if head_dim else ""
            raise ValueError(f"attention {name} must be a 4-d {str(dtype).removeprefix('torch.')} CPU tensor{size}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")
        return t if t.stride(-1) == 1 else t.contiguous()

    q, k, v = operand("q", q), operand("k", k), operand("v", v)
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    if tuple(k.shape) != (b, hkv, lk, d) or v.shape != k.shape or h % hkv:
        raise ValueError(f"attention shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v "
                         "must be [B, Hkv, Lk, D] with Hkv dividing the query heads")
    if lq < 1 or lk < 1 or d < 1:
        raise ValueError(f"attention needs at least one query, one key and one dim, got Lq={lq}, Lk={lk}, D={d}")
    m = None
    if mask is not None:
        if mask.dtype != torch.bool or tuple(mask.shape) != (b, lq, lk):
            raise ValueError(f"attention mask must be bool [B, Lq, Lk] = {(b, lq, lk)}, got {mask.dtype} "
                             f"{tuple(mask.shape)}")
        m = mask.contiguous().view(torch.uint8)
    return q, k, v, m


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    q, k, v, m = operands(q, k, v, mask, torch.float32)
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    threads = torch.get_num_threads()
    lib = _lib()
    scratch = torch.empty(threads * lib.edgefm_attention_scratch(lk, d), dtype=torch.float32)
    out = torch.empty((b, lq, h, d), dtype=torch.float32).permute(0, 2, 1, 3)  # [B, H, Lq, D] view
    lib.edgefm_attention(q.data_ptr(), *q.stride()[:3], k.data_ptr(), *k.stride()[:3], v.data_ptr(),
                         *v.stride()[:3], out.data_ptr(), *out.stride()[:3], b, h, hkv, lq, lk, d,
                         None if m is None else m.data_ptr(), d ** -0.5, scratch.data_ptr(), threads)
    return out

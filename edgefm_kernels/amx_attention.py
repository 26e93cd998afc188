"""Python side of ``csrc/amx_attention.c``: bf16 attention on Intel AMX tiles (fast mode), head size 64.

    out = attention(q [B, H, Lq, 64], k [B, Hkv, Lk, 64], v [B, Hkv, Lk, 64], mask [B, Lq, Lk] bool | None)
        # bf16, unit stride in D (slices of a fused QKV output are fine)
        # -> [B, H, Lq, 64] bf16, a view of a [B, Lq, H, 64] buffer (the layout the output projection reads)

Q K^T and P V run on the tiles (bf16 products, fp32 sums); the softmax is fp32 and P is rounded to bf16
before P V, as the reference rounds its probabilities to the value dtype. Needs AMX-BF16 (native.ISA);
the process asks the kernel for the tile state once, before the first call.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from . import cpu_attention, native

NAME = "amx_attention"
HEAD_DIM = 64
_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_amx_attention": ([_PTR, _PTR] * 3 + [_PTR] + [_I64] * 5 + [ctypes.c_float, _PTR, _PTR, _PTR, _I32], None),
}


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why this kernel cannot run here (no AMX, no build, the tile state refused), or None."""
    return native.amx_unavailable(NAME, SIGNATURES)


def _strides(t: torch.Tensor) -> ctypes.Array:
    return (ctypes.c_int64 * 3)(*t.stride()[:3])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    q, k, v, m = cpu_attention.operands(q, k, v, mask, torch.bfloat16, HEAD_DIM)
    b, h, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    lkp = (lk + 31) // 32 * 32
    work = torch.empty(2 * b * hkv * lkp * HEAD_DIM, dtype=torch.bfloat16)
    out = torch.empty((b, lq, h, HEAD_DIM), dtype=torch.bfloat16).permute(0, 2, 1, 3)  # [B, H, Lq, D] view
    native.bind(NAME, SIGNATURES).edgefm_amx_attention(
        q.data_ptr(), _strides(q), k.data_ptr(), _strides(k), v.data_ptr(), _strides(v),
        None if m is None else m.data_ptr(), b, h, hkv, lq, lk, HEAD_DIM ** -0.5, out.data_ptr(), _strides(out),
        work.data_ptr(), torch.get_num_threads())
    return out

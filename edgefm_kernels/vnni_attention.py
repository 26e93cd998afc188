"""Python side of ``csrc/vnni_attention.c``: int8 attention on AVX512-VNNI for fast mode on CPUs without AMX
(the vision tower: 1024 x 1024 scores per head, head size 64).

    out = attention(q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, D], mask [B, Lq, Lk] bool | None)
        # f32, unit stride in D, 1 <= D <= 16384, Lk < 65536
        # -> [B, H, Lq, D] f32, a view of a [B, Lq, H, D] buffer (the layout the output projection reads)

Queries per row and keys per key (centred per channel first) in int8 for q k^T; p = exp(s - max) in unsigned
bytes and values per channel (centred) in int8 for p v; fp32 softmax. ``reference`` is the same arithmetic
in PyTorch.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from . import native
from .cpu_attention import operands

NAME = "vnni_attention"
MAX_KEYS = 65535  # int32 sums of 255 * 127 per key
MAX_HEAD = 16384
_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_vnni_attention_scratch": ([_I64, _I64], _I64),
    "edgefm_vnni_attention": ([_PTR, _I64, _I64, _I64] * 3 + [_PTR, _I64, _I64, _I64] + [_I64] * 6
                              + [_PTR, ctypes.c_float, _PTR, _I32], None),
}


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why this kernel cannot run here (no AVX512-VNNI, no build), or None."""
    return native.unavailable(NAME)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    q, k, v, m = operands(q, k, v, mask, torch.float32)
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    if lk > MAX_KEYS or d > MAX_HEAD:
        raise ValueError(f"the int8 attention kernel takes Lk <= {MAX_KEYS} and D <= {MAX_HEAD}, got Lk={lk}, D={d}")
    threads = torch.get_num_threads()
    lib = native.bind(NAME, SIGNATURES)
    per = lib.edgefm_vnni_attention_scratch(lk, d)
    scratch = torch.empty(threads * per + 64, dtype=torch.uint8)
    base = scratch.data_ptr() + (-scratch.data_ptr()) % 64
    out = torch.empty((b, lq, h, d), dtype=torch.float32).permute(0, 2, 1, 3)  # [B, H, Lq, D] view
    lib.edgefm_vnni_attention(q.data_ptr(), *q.stride()[:3], k.data_ptr(), *k.stride()[:3], v.data_ptr(),
                              *v.stride()[:3], out.data_ptr(), *out.stride()[:3], b, h, hkv, lq, lk, d,
                              None if m is None else m.data_ptr(), d ** -0.5, base, threads)
    return out


def _q8(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of x along ``dim`` (values as float) and the scales; all-zero slices stay zero."""
    a = x.abs().amax(dim=dim, keepdim=True)
    s = torch.where(a > 0, a / 127, torch.zeros_like(a))
    inv = torch.where(a > 0, 127 / a, torch.zeros_like(a))
    return torch.round(x * inv), s


def p_bytes(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[B, H, Lq, Lk] float64: the kernel's rounded p = round(255 exp(s - row max)) for q [B, H, Lq, D] and
    k [B, H, Lk, D] (KV heads already repeated), in float64 PyTorch."""
    qq, qs = _q8(q.double(), -1)
    kd = k.double()
    kq, ks = _q8(kd - kd.mean(dim=2, keepdim=True), -1)
    s = (qq @ kq.transpose(2, 3)) * qs * ks.transpose(2, 3) * q.shape[-1] ** -0.5
    if mask is not None:
        s = torch.where(mask[:, None], s, torch.finfo(torch.float32).min)
    return torch.round(torch.exp(s - s.amax(-1, keepdim=True)) * 255)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The kernel's arithmetic in float64 PyTorch (rounding points identical; the kernel rounds in fp32)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.double().repeat_interleave(groups, dim=1)
    p = p_bytes(q, k, mask)
    vm = v.mean(dim=2, keepdim=True)
    vq, vs = _q8(v - vm, 2)
    return (p @ vq) / p.sum(-1, keepdim=True) * vs + vm

"""Attention: softmax(q k^T * scale + mask) v with grouped KV heads.

Contract of every implementation (built by ``impl.build(spec, params)``)::

    kernel(q, k, v, mask)   # q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], Hq % Hkv == 0,
                            # mask bool [B, Lq, Lk] (True = key visible) or None -> [B, Hq, Lq, D]

Masks are built once per chunk by the engine and passed unchanged to every layer, so a kernel that
needs another mask form converts it once and keeps it while the same mask object comes back.

Scale is D**-0.5. A query row with no visible key gets uniform weights over all keys (LeRobot's
``finfo.min`` masking), never NaN: masked tokens then stay finite in later layers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import amx_attention, cpu_attention, native, vnni_attention
from .registry import Impl, OpSpec, register

GQA_MODES = ("repeat", "native")


class EagerAttention:
    """Reference: LeRobot's eager attention (repeat KV, fp32 scores, finfo.min fill, fp32 softmax)."""

    def __call__(self, q, k, v, mask):
        b, hq, lq, d = q.shape
        groups = hq // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q.float(), k.float().transpose(2, 3))  # [B, Hq, Lq, Lk]
        scores *= d ** -0.5
        if mask is not None:
            scores = torch.where(mask[:, None], scores, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v)


class SdpaAttention:
    """torch's fused scaled_dot_product_attention with an additive mask (0 / finfo.min) and GQA."""

    def __init__(self, zero_mask_when_none: bool = False, gqa: str = "repeat"):
        if gqa not in GQA_MODES:
            raise ValueError(f"gqa must be one of {GQA_MODES}, got {gqa!r}")
        self.zero_mask_when_none, self.native_gqa = zero_mask_when_none, gqa == "native"
        self._src, self._dtype, self._add = None, None, None  # last bool mask seen, its additive form

    def additive(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, 1, Lq, Lk] additive form of ``mask``; None for an all-visible CPU mask (SDPA's unmasked
        path: the same result, no mask reads). Not checked on GPUs (no host sync, graph-capturable)."""
        if mask is not self._src or self._dtype != dtype:
            if mask.device.type == "cpu" and bool(mask.all()):
                add = None
            else:
                add = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
                add = add.masked_fill_(~mask, torch.finfo(dtype).min)[:, None]
            self._src, self._dtype, self._add = mask, dtype, add
        return self._add

    def __call__(self, q, k, v, mask):
        if mask is not None:
            mask = self.additive(mask, q.dtype)
        elif self.zero_mask_when_none:
            # transformers' SigLIP passes an all-zero additive mask; SDPA then takes the masked path.
            mask = q.new_zeros(q.shape[0], 1, q.shape[2], k.shape[2])
        groups = q.shape[1] // k.shape[1]
        if groups > 1 and self.native_gqa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _check_heads(spec: OpSpec, params) -> str | None:
    hq, hkv = spec.dims.get("heads", 1), spec.dims.get("kv_heads", 1)
    if hq % hkv:
        return f"{hq} query heads are not a multiple of {hkv} kv heads"
    return None


register(Impl("attention", "eager", lambda spec, params: EagerAttention(), reference=True, check=_check_heads,
              doc="LeRobot's eager attention: fp32 scores, finfo.min mask, fp32 softmax"))
register(Impl("attention", "sdpa", lambda spec, params: SdpaAttention(**params), check=_check_heads,
              param_space={"zero_mask_when_none": (False, True), "gqa": GQA_MODES},
              doc="torch SDPA, additive finfo.min mask; KV heads repeated or grouped inside SDPA (gqa=native)"))


class Fp32KernelAttention:
    """One of our compiled fp32-in, fp32-out attention kernels (``kernel(q, k, v, mask)``); other activation
    dtypes are cast in and the result back."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, q, k, v, mask):
        if q.dtype == torch.float32:
            return self.kernel(q, k, v, mask)
        return self.kernel(q.float(), k.float(), v.float(), mask).to(q.dtype)


def _check_avx512(spec: OpSpec, params) -> str | None:
    return _check_heads(spec, params) or native.avx512_check(cpu_attention.NAME)(spec, params)


register(Impl("attention", "avx512", lambda spec, params: Fp32KernelAttention(cpu_attention.attention),
              check=_check_avx512,
              doc="whole score rows in fp32 with AVX-512 (csrc/attention.c): keys packed per head, 64-key "
                  "blocks shared by all rows of a 48-query block; bool mask, GQA"))


def _check_vnni(spec: OpSpec, params) -> str | None:
    return _check_heads(spec, params) or native.avx512_check(vnni_attention.NAME)(spec, params)


register(Impl("attention", "int8_vnni", lambda spec, params: Fp32KernelAttention(vnni_attention.attention),
              check=_check_vnni, precision="int8",
              doc="int8 q k^T and p v on AVX512-VNNI (csrc/vnni_attention.c): keys centred and quantised per "
                  "key, queries per row, p in bytes, values centred per channel; fp32 softmax over whole rows; "
                  "bool mask, GQA"))


class AmxAttention:
    """bf16 attention on AMX tiles (amx_attention.py, csrc/amx_attention.c), head size 64; other activation
    dtypes are cast in and the result back."""

    def __call__(self, q, k, v, mask):
        if q.dtype == torch.bfloat16:
            return amx_attention.attention(q, k, v, mask)
        return amx_attention.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask).to(q.dtype)


def _check_amx(spec: OpSpec, params) -> str | None:
    if spec.dims.get("head_dim") != amx_attention.HEAD_DIM:
        return f"the AMX attention kernel takes head size {amx_attention.HEAD_DIM}, got {spec.dims.get('head_dim')}"
    if not spec.hw_profile.startswith("cpu_x86_avx512_bf16"):
        return f"the AMX attention kernel needs an AVX512-BF16/AMX CPU profile, this is {spec.hw_profile!r}"
    return _check_heads(spec, params) or amx_attention.unavailable()


register(Impl("attention", "amx", lambda spec, params: AmxAttention(), check=_check_amx, precision="bf16",
              doc="bf16 on Intel AMX tiles (csrc/amx_attention.c): Q K^T and P V on the tiles, fp32 softmax, "
                  "P rounded to bf16; head size 64, bool mask, GQA"))

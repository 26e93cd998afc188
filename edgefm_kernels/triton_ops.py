"""Triton kernels for NVIDIA GPUs: RMSNorm, RoPE and the KV-cache store, one launch each.

Same contracts as norm.py, rope.py and kv.py. Selected by ``cuda_*`` records; on a CPU they run only
under Triton's interpreter (``TRITON_INTERPRET=1``, set before the first use), which is how the tests
check them against the references. The kernels are defined on first use (so importing this module
needs no triton, and the interpreter setting is read when they are made).
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .kv import PlainKV
from .registry import Impl, register


def available() -> str | None:
    """None when the Triton kernels can run here, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton kernels need a CUDA device (or TRITON_INTERPRET=1 on CPU)"
    return None


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        keep = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=keep, other=0.0)
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
        normed = (xf * r).to(x.dtype).to(tl.float32)  # rounded to x's dtype first, as the reference
        tl.store(y_ptr + row * n_cols + cols, (w * normed).to(x.dtype), mask=keep)

    @triton.jit
    def rope(x_ptr, cos_ptr, sin_ptr, y_ptr, heads, n_pos, sxb, sxl, sxh, scb, scl, HALF: tl.constexpr):
        pid = tl.program_id(0)  # one (batch, position, head) row of D values
        h = pid % heads
        bl = pid // heads
        b = bl // n_pos
        p = bl % n_pos
        i = tl.arange(0, HALF)
        base = b * sxb + p * sxl + h * sxh
        x1 = tl.load(x_ptr + base + i)
        x2 = tl.load(x_ptr + base + HALF + i)
        c = tl.load(cos_ptr + b * scb + p * scl + i)
        s = tl.load(sin_ptr + b * scb + p * scl + i)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        y_base = ((b * n_pos + p) * heads + h) * 2 * HALF
        tl.store(y_ptr + y_base + i, (f1 * c - f2 * s).to(x1.dtype))
        tl.store(y_ptr + y_base + HALF + i, (f2 * c + f1 * s).to(x1.dtype))

    @triton.jit
    def kv_store(k_ptr, v_ptr, ck_ptr, cv_ptr, n, capacity, start, D: tl.constexpr):
        pid = tl.program_id(0)  # one (batch*head, token) row
        bh = pid // n
        t = pid % n
        d = tl.arange(0, D)
        src = (bh * n + t) * D + d
        dst = (bh * capacity + start + t) * D + d
        tl.store(ck_ptr + dst, tl.load(k_ptr + src))
        tl.store(cv_ptr + dst, tl.load(v_ptr + src))

    return {"rms_norm": rms_norm, "rope": rope, "kv_store": kv_store, "next_pow2": triton.next_power_of_2}


class TritonRmsNorm(torch.nn.Module):
    """RMSNorm: fp32 statistics, normalised value in x's dtype times the weight (cast once to x's dtype)."""

    def __init__(self, weight, eps: float):
        super().__init__()
        self.weight, self.eps = weight, eps
        self._w: dict = {}

    def forward(self, x):
        w = self._w.get((x.dtype, x.device))
        if w is None:
            w = self._w[(x.dtype, x.device)] = self.weight.to(device=x.device, dtype=x.dtype).contiguous()
        k = _kernels()
        x2 = x.contiguous().view(-1, x.shape[-1])
        y = torch.empty_like(x2)
        k["rms_norm"][(x2.shape[0],)](x2, w, y, x2.shape[1], self.eps, BLOCK=k["next_pow2"](x2.shape[1]))
        return y.view(x.shape)


class TritonRope:
    """Half-split rotation from the reference's (cos, sin) tables [B, L, 1, D/2]; x [B, L, H, D]."""

    def __init__(self, max_wavelength: float = 10_000.0):
        from .rope import RopeRef

        self.ref = RopeRef(max_wavelength)

    def tables(self, positions: torch.Tensor, head_dim: int):
        return self.ref.tables(positions, head_dim)

    def __call__(self, x, tables):
        cos, sin = (t.contiguous() for t in tables)
        b, length, heads, d = x.shape
        if x.stride(-1) != 1:
            x = x.contiguous()
        y = torch.empty((b, length, heads, d), dtype=x.dtype, device=x.device)
        _kernels()["rope"][(b * length * heads,)](
            x, cos, sin, y, heads, length, x.stride(0), x.stride(1), x.stride(2), cos.stride(0), cos.stride(1),
            HALF=d // 2)
        return y


class TritonKV(PlainKV):
    """Plain KV storage whose write stores keys and values in one kernel launch."""

    def alloc(self, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype) -> dict:
        device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the interpreter (tests)
        shape = (batch, kv_heads, capacity, head_dim)
        return {"k": torch.zeros(shape, dtype=dtype, device=device), "v": torch.zeros(shape, dtype=dtype, device=device)}

    def write(self, store: dict, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        b, h, n, d = k.shape
        capacity = store["k"].shape[2]
        if start < 0 or start + n > capacity:
            raise ValueError(f"KV write [{start}, {start + n}) outside the cache capacity {capacity}")
        _kernels()["kv_store"][(b * h * n,)](k.contiguous(), v.contiguous(), store["k"], store["v"], n, capacity,
                                              start, D=d)


def _pow2_head(spec, params) -> str | None:
    d = spec.dims.get("head_dim")
    if d is not None and d & (d - 1):
        return f"the Triton kernels need a power-of-two head_dim, not {d}"
    return available()


register(Impl("rms_norm", "triton", lambda spec, params, weight, eps: TritonRmsNorm(weight, eps),
              hw_prefixes=("cuda",), check=lambda spec, params: available(),
              doc="one Triton program per row, fp32 statistics"))
register(Impl("rope", "triton", lambda spec, params, max_wavelength=10_000.0: TritonRope(max_wavelength),
              hw_prefixes=("cuda",), check=_pow2_head, doc="one Triton program per (batch, position, head)"))
register(Impl("kv", "triton", lambda spec, params: TritonKV(), hw_prefixes=("cuda",), check=_pow2_head,
              doc="plain KV storage, keys and values stored by one Triton launch"))

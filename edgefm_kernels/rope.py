"""Rotary position embedding as SmolVLA applies it (half-split rotation, fp32, wavelength 10000).

``impl.build(spec, params, max_wavelength=10000.0)`` -> kernel with
    kernel.tables(positions [B, L] int, head_dim) -> opaque (cos/sin), computed once per position set
    kernel(x [B, L, H, D], tables) -> [B, L, H, D] in x's dtype
"""
from __future__ import annotations

import torch

from . import bf16_rows, cpu_rows, native
from .registry import Impl, register


class RopeRef:
    def __init__(self, max_wavelength: float = 10_000.0):
        self.max_wavelength = max_wavelength

    def tables(self, positions: torch.Tensor, head_dim: int):
        half = head_dim // 2
        exponents = (2.0 / head_dim) * torch.arange(half, dtype=torch.float32, device=positions.device)
        timescale = self.max_wavelength ** exponents
        radians = positions[..., None].to(torch.float32) / timescale[None, None, :]
        radians = radians[..., None, :]  # [B, L, 1, D/2]
        return torch.cos(radians), torch.sin(radians)

    def __call__(self, x, tables):
        cos, sin = tables
        dtype = x.dtype
        x = x.float()
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        out = torch.empty_like(x)
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:] = x2 * cos + x1 * sin
        return out.to(dtype)


register(Impl("rope", "ref", lambda spec, params, max_wavelength=10_000.0: RopeRef(max_wavelength),
              reference=True))


class RopeFast:
    """The same rotation written straight into the two halves of the output (no rotated copy of x):
    ``out[:D/2] = x1 c - x2 s``, ``out[D/2:] = x2 c + x1 s`` as mul + addcmul each, fp32.

    Reads the reference's (cos, sin) tables; ``-sin`` is made once per tables object (once per chunk).
    Works on strided views (the q/k slices of a fused QKV output) without copying them first.
    """

    def __init__(self, max_wavelength: float = 10_000.0):
        self.ref = RopeRef(max_wavelength)
        self._src, self._neg_sin = None, None

    def tables(self, positions: torch.Tensor, head_dim: int):
        return self.ref.tables(positions, head_dim)

    def __call__(self, x, tables):
        cos, sin = tables
        if tables is not self._src:
            self._src, self._neg_sin = tables, -sin
        h = x.float()
        half = h.shape[-1] // 2
        x1, x2 = h[..., :half], h[..., half:]
        out = torch.empty(h.shape, dtype=torch.float32, device=h.device)
        lo, hi = out[..., :half], out[..., half:]
        torch.mul(x1, cos, out=lo).addcmul_(x2, self._neg_sin)
        torch.mul(x2, cos, out=hi).addcmul_(x1, sin)
        return out if out.dtype == x.dtype else out.to(x.dtype)


register(Impl("rope", "fast", lambda spec, params, max_wavelength=10_000.0: RopeFast(max_wavelength),
              doc="rotation written into the output halves (2 mul + 2 addcmul), fp32, reference tables"))


class RopeAvx512(RopeRef):
    """The rotation as one AVX-512 pass (cpu_rows.py) reading strided q/k slices, fp32 only; bitwise the
    reference (each product and sum rounded on its own). Reference tables; other dtypes computed in fp32."""

    def __call__(self, x, tables):
        if x.dtype == torch.float32:
            return cpu_rows.rope(x, *tables)
        return cpu_rows.rope(x.float(), *tables).to(x.dtype)


register(Impl("rope", "avx512", lambda spec, params, max_wavelength=10_000.0: RopeAvx512(max_wavelength),
              check=native.avx512_check(cpu_rows.NAME), doc="one AVX-512 pass (csrc/cpu_rows.c) over strided q/k, fp32"))


class RopeBf16(RopeRef):
    """The rotation of bf16 q/k as one AVX-512 pass (bf16_rows.py): fp32 math from the reference tables,
    rounded once to bf16 (fast mode: no cast of q/k to fp32 and back); other dtypes are cast in and back."""

    def __call__(self, x, tables):
        if x.dtype == torch.bfloat16:
            return bf16_rows.rope(x, *tables)
        return bf16_rows.rope(x.bfloat16(), *tables).to(x.dtype)


def _check_bf16(spec, params) -> str | None:
    if not spec.hw_profile.startswith("cpu_x86_avx512_bf16"):
        return f"{bf16_rows.NAME} needs an AVX512-BF16 CPU profile, this is {spec.hw_profile!r}"
    return native.unavailable(bf16_rows.NAME)


register(Impl("rope", "bf16", lambda spec, params, max_wavelength=10_000.0: RopeBf16(max_wavelength),
              precision="bf16", check=_check_bf16,
              doc="one AVX-512 pass (csrc/bf16_rows.c) over strided bf16 q/k, fp32 math, one rounding"))

"""Rotary position embedding as SmolVLA applies it (half-split rotation, fp32, wavelength 10000).

``impl.build(spec, params, max_wavelength=10000.0)`` -> kernel with
    kernel.tables(positions [B, L] int, head_dim) -> opaque (cos/sin), computed once per position set
    kernel(x [B, L, H, D], tables) -> [B, L, H, D] in x's dtype
"""
from __future__ import annotations

import torch

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
    """The same rotation as four whole-width ops: ``x * [c, c] + roll(x, D/2) * [-s, s]``, fp32.

    Reads the reference's (cos, sin) tables, so tables made by either impl work; the whole-width
    forms are made once per tables object (once per chunk). Bitwise equal to the reference in fp32.
    """

    def __init__(self, max_wavelength: float = 10_000.0):
        self.ref = RopeRef(max_wavelength)
        self._src, self._full = None, None

    def tables(self, positions: torch.Tensor, head_dim: int):
        return self.ref.tables(positions, head_dim)

    def full(self, tables):
        if tables is not self._src:
            cos, sin = tables
            self._src, self._full = tables, (torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1))
        return self._full

    def __call__(self, x, tables):
        cos, sin = self.full(tables)
        h = x.float()
        out = h * cos + torch.roll(h, x.shape[-1] // 2, dims=-1) * sin
        return out if out.dtype == x.dtype else out.to(x.dtype)


register(Impl("rope", "fast", lambda spec, params, max_wavelength=10_000.0: RopeFast(max_wavelength),
              doc="whole-width rotation (roll + 2 muls + add), fp32, reference tables"))

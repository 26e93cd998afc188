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

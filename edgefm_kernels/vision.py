"""Vision front-end ops: patch embedding and the pixel-shuffle connector.

patch_embed:   ``impl.build(spec, params, weight [C, 3, p, p], bias [C])`` -> module(pixels [B, 3, H, W])
               -> [B, (H/p)*(W/p), C], patches in row-major order.
pixel_shuffle: ``impl.build(spec, params, scale=s)`` -> fn(x [B, N, C]) -> [B, N/s^2, C*s^2]: each
               output token gathers an s x s block of the sqrt(N) x sqrt(N) grid, as Idefics3/SmolVLM do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import BACKENDS, Gemm, backend_check, concat
from .pages import release_pages
from .registry import Impl, register


class PatchEmbedRef(nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.patch = weight.shape[-1]

    def forward(self, pixels):
        out = F.conv2d(pixels, self.weight, self.bias, stride=self.patch)  # [B, C, H/p, W/p]
        return out.flatten(2).transpose(1, 2)


class PixelShuffleRef:
    def __init__(self, scale: int):
        self.scale = scale

    def __call__(self, x):
        b, n, c = x.shape
        side, s = int(round(n ** 0.5)), self.scale
        # grid [B, rows, cols, C] -> fold s columns into channels, then s rows
        x = x.reshape(b, side, side // s, c * s)
        x = x.permute(0, 2, 1, 3).reshape(b, side // s, side // s, c * s * s)
        x = x.permute(0, 2, 1, 3)
        return x.reshape(b, n // (s * s), c * s * s)


register(Impl("patch_embed", "ref", lambda spec, params, weight, bias: PatchEmbedRef(weight, bias), reference=True))
register(Impl("pixel_shuffle", "ref", lambda spec, params, scale: PixelShuffleRef(scale), reference=True))


class PatchEmbedGemm(nn.Module):
    """Non-overlapping patches gathered by a reshape (no im2col copy beyond one permute) -> one GEMM
    against the flattened kernel, in ``dtype``; output in the pixels' dtype."""

    def __init__(self, weight, bias, dtype: torch.dtype, backend: str):
        super().__init__()
        self.patch, self.dtype = weight.shape[-1], dtype
        flat = [(weight.reshape(weight.shape[0], -1), bias)]
        self.gemm = Gemm(lambda: concat(flat, dtype), backend)
        release_pages([weight, bias])

    def forward(self, pixels):
        b, c, h, w = pixels.shape
        p = self.patch
        x = pixels if pixels.dtype == self.dtype else pixels.to(self.dtype)
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)
        y = self.gemm(x)
        return y if y.dtype == pixels.dtype else y.to(pixels.dtype)


register(Impl("patch_embed", "gemm", lambda spec, params, weight, bias: PatchEmbedGemm(
    weight, bias, torch.float32, params.get("backend", "aten")), param_space={"backend": BACKENDS},
    check=backend_check(torch.float32), doc="patches by reshape + one fp32 GEMM"))
register(Impl("patch_embed", "gemm_bf16", lambda spec, params, weight, bias: PatchEmbedGemm(
    weight, bias, torch.bfloat16, params.get("backend", "aten")), param_space={"backend": ("aten", "onednn")},
    precision="bf16", check=backend_check(torch.bfloat16), doc="patches by reshape + one bf16 GEMM"))

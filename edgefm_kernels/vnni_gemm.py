"""Python side of ``csrc/vnni_gemm.c``: an int8 GEMM on AVX512-VNNI for CPUs without AMX, epilogue fused.

    VnniWeight(w [N, K], b [N] | None, post)(x [M, K] fp32, residual [M, out] fp32 | None) -> [M, out] fp32
        post: "none" (x W^T + b), "gelu_tanh" (gelu_tanh(x W^T + b)), "silu_glu" (W = [gate; up], no bias:
        silu(x G^T) * (x U^T)); out = N, or N / 2 for silu_glu

Weights symmetric int8 per output channel, rows of x quantised per row and call (oneDNN's dynamic int8
quantises the whole activation per call with one scale); int32 sums, both scales, the bias, the epilogue
and the residual applied in the kernel.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from . import native
from .amx_gemm import _blocks, kernel_operands, quantize_rows
from .gemm import POSTS

NAME = "vnni_gemm"
POST_IDS = {"none": 0, "silu_glu": 1, "gelu_tanh": 2}
_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_vnni_gemm_scratch": ([_I64, _I64], _I64),
    "edgefm_vnni_gemm": ([_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _I32, _PTR, _I64, _PTR, _PTR, _PTR,
                          _PTR, _I32], None),
}


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why this kernel cannot run here (no AVX512-VNNI, no build), or None."""
    return native.unavailable(NAME)


def pack(w: torch.Tensor, post: str) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (uint8 [blocks, K/4, 32, 4]: q + 128 per block of 32 columns, K groups of 4 values;
    fp32 scales [blocks, 32]); zero weights (128) past N and K."""
    q, scale = quantize_rows(w)
    k = w.shape[1]
    kp = (k + 3) // 4 * 4
    blocks = _blocks(q, post, kp - k).reshape(-1, 32, kp // 4, 4)  # [nb, col, group, 4]
    packed = (blocks.permute(0, 2, 1, 3).to(torch.int16) + 128).to(torch.uint8).contiguous()
    return packed, _blocks(scale, post, 0).reshape(-1, 32).contiguous()


class VnniWeight:
    """A packed int8 weight and its epilogue; ``__call__(x [M, K] fp32, residual) -> [M, out] fp32``."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, post: str = "none"):
        if post not in POSTS:
            raise ValueError(f"unknown VNNI GEMM epilogue {post!r}; known: {tuple(POSTS)}")
        if w.dim() != 2 or w.device.type != "cpu":
            raise ValueError(f"VnniWeight takes a 2-d CPU weight [N, K], got {tuple(w.shape)} on {w.device}")
        if post == "silu_glu" and (b is not None or w.shape[0] % 2):
            raise ValueError(f"silu_glu takes a bias-free stacked gate/up weight [2I, K], got {tuple(w.shape)}"
                             f"{' and a bias' if b is not None else ''}")
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self.k, self.post = w.shape[1], post
        self.out_features = w.shape[0] // 2 if post == "silu_glu" else w.shape[0]
        self.packed, self.scales = pack(w, post)
        self.bias = None if b is None else b.float().contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        residual, y = kernel_operands("VNNI GEMM", x, self.k, torch.float32, residual, self.out_features)
        m = x.shape[0]
        if m == 0:
            return y
        lib = native.bind(NAME, SIGNATURES)
        nb, kg = self.packed.shape[0], self.packed.shape[1]
        scratch = torch.empty(lib.edgefm_vnni_gemm_scratch(m, kg), dtype=torch.int8)
        sx, rs = torch.empty(m, dtype=torch.float32), torch.empty(m, dtype=torch.int32)
        lib.edgefm_vnni_gemm(x.data_ptr(), m, self.k, x.stride(0), self.packed.data_ptr(), self.scales.data_ptr(),
                             nb, kg, None if self.bias is None else self.bias.data_ptr(), POST_IDS[self.post],
                             None if residual is None else residual.data_ptr(), self.out_features, y.data_ptr(),
                             scratch.data_ptr(), sx.data_ptr(), rs.data_ptr(), torch.get_num_threads())
        return y

"""Python side of ``csrc/amx_gemm.c``: GEMM on Intel AMX, bf16 or int8 weights, its epilogue fused (fast mode).

    w = AmxWeight(W [N, K], b [N] | None, post, weights="bf16" | "int8")   # packs W once, in read order
    y = w(x [M, K] bf16, residual=None)                                   # -> [M, N] bf16 ("silu_glu": [M, N/2])

``post``: "none", "gelu_tanh" (on x W^T + b) or "silu_glu" (W stacks gate over up, [2I, K], bias-free);
``residual`` (bf16, the output's shape) is added last, with one rounding for both.
``weights``: "bf16" (bf16 products, fp32 sums) or "int8" (W symmetric per output channel, x quantised per row
and call, symmetric: int8 products, int32 sums, both scales applied in the epilogue). Made first for the
action expert's decode (M = 50 rows, the weight read from DRAM at every Euler step: int8 halves the bytes and
the tile work); with many rows (the vision tower's MLP and QKV, M = 3072) it runs 48 rows a pass with the
tiles kept busy (csrc/amx_gemm.c says how). Needs AMX-BF16 and AMX-INT8 (native.ISA); the process asks the
kernel for the tile state once, before the first call.
"""
from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from . import native

NAME = "amx_gemm"
POSTS = {"none": 0, "silu_glu": 1, "gelu_tanh": 2}
WEIGHTS = {"bf16": (torch.bfloat16, 32, 2), "int8": (torch.int8, 64, 4)}  # dtype, K step, K values per 32 bits
_I64, _PTR, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "edgefm_amx_gemm": ([_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _I32, _PTR, _I64, _PTR, _I32], _I32),
}


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why this kernel cannot run here (no AMX, no build, the tile state refused), or None."""
    return native.amx_unavailable(NAME, SIGNATURES)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] float -> (int8 [N, K], fp32 scales [N]) with W ~ q * scale, |q| <= 127 (1 for a zero row)."""
    w = w.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def kernel_operands(what: str, x: torch.Tensor, k: int, dtype: torch.dtype, residual: torch.Tensor | None,
                    n_out: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Our compiled GEMMs' call checks (ValueError naming the bad value): x [M, k] ``dtype`` with unit column
    stride, residual [M, n_out] ``dtype`` or None. -> (residual contiguous or None, y [M, n_out] ``dtype``)."""
    name = str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32")
    if x.dtype != dtype or x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"{what} input must be {name} [M, {k}] with unit column stride, got {x.dtype} "
                         f"{tuple(x.shape)} strides {x.stride()}")
    m = x.shape[0]
    if residual is not None:
        if residual.dtype != dtype or tuple(residual.shape) != (m, n_out):
            raise ValueError(f"{what} residual must be {name} [{m}, {n_out}], got {residual.dtype} "
                             f"{tuple(residual.shape)}")
        residual = residual.contiguous()
    return residual, torch.empty((m, n_out), dtype=dtype)


def _blocks(t: torch.Tensor, post: str, pad_k: int) -> torch.Tensor:
    """[N, K'] (or [N] with pad_k = 0) -> [blocks, 2, 16, K' + pad_k]: a block is 32 columns (tile t: 16 t ..),
    or for "silu_glu" 16 gate rows and the same 16 up rows; zero past N."""
    t = t if t.dim() == 2 else t[:, None]
    if post == "silu_glu":
        half = t.shape[0] // 2
        ip = (half + 15) // 16 * 16
        g, u = (F.pad(h, (0, pad_k, 0, ip - half)) for h in t.chunk(2))
        return torch.stack([g.view(ip // 16, 16, -1), u.view(ip // 16, 16, -1)], dim=1)
    np_ = (t.shape[0] + 31) // 32 * 32
    return F.pad(t, (0, pad_k, 0, np_ - t.shape[0])).view(np_ // 32, 2, 16, -1)


def pack(w: torch.Tensor, post: str, weights: str = "bf16") -> tuple[torch.Tensor, torch.Tensor | None]:
    """W [N, K] -> (tiles [blocks, 2, Kp/step, step/v, 16, v], scales [blocks, 2, 16] fp32 | None): block, tile,
    K step, K group, column, group member (v = 2 bf16 or 4 int8 values per 32-bit lane: the VNNI layout);
    zero past N and K (K padded to a multiple of the step: 32 bf16, 64 int8)."""
    n, k = w.shape
    if post == "silu_glu" and n % 2:
        raise ValueError(f"silu_glu takes a stacked gate/up weight [2I, K], got {n} rows")
    dtype, step, v = WEIGHTS[weights]
    kp = (k + step - 1) // step * step
    if weights == "int8":
        q, scale = quantize_rows(w)
        scales = _blocks(scale, post, 0).reshape(-1, 2, 16).contiguous()
    else:
        q, scales = w.to(dtype), None
    tiles = _blocks(q, post, kp - k)  # [nb, t, col, kp]
    nb = tiles.shape[0]
    # [nb, t, col, ks, r, i] -> [nb, t, ks, r, col, i]: each tile's K steps one contiguous run
    return tiles.view(nb, 2, 16, kp // step, step // v, v).permute(0, 1, 3, 4, 2, 5).contiguous(), scales


class AmxWeight:
    """A packed weight and its epilogue; ``__call__(x [M, K] bf16) -> [M, out] bf16``."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, post: str = "none", weights: str = "bf16"):
        if post not in POSTS:
            raise ValueError(f"unknown AMX GEMM epilogue {post!r}; known: {tuple(POSTS)}")
        if weights not in WEIGHTS:
            raise ValueError(f"unknown AMX GEMM weight type {weights!r}; known: {tuple(WEIGHTS)}")
        if w.dim() != 2 or w.device.type != "cpu":
            raise ValueError(f"AmxWeight takes a 2-d CPU weight [N, K], got {tuple(w.shape)} on {w.device}")
        if post == "silu_glu" and b is not None:
            raise ValueError("silu_glu takes a bias-free gate/up weight")
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self.k = w.shape[1]
        self.out_features = w.shape[0] // 2 if post == "silu_glu" else w.shape[0]
        self.post, self.weights = post, weights
        self.packed, self.scales = pack(w, post, weights)
        self.bias = None if b is None else b.float().contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        residual, y = kernel_operands("AMX GEMM", x, self.k, torch.bfloat16, residual, self.out_features)
        m = x.shape[0]
        if m == 0:
            return y
        nb, ksteps = self.packed.shape[0], self.packed.shape[2]
        rc = native.bind(NAME, SIGNATURES).edgefm_amx_gemm(
            x.data_ptr(), m, self.k, x.stride(0), self.packed.data_ptr(),
            None if self.scales is None else self.scales.data_ptr(), nb, ksteps * WEIGHTS[self.weights][1],
            None if self.bias is None else self.bias.data_ptr(), POSTS[self.post],
            None if residual is None else residual.data_ptr(), self.out_features, y.data_ptr(),
            torch.get_num_threads())
        if rc:
            raise MemoryError(f"amx_gemm could not allocate its {m}-row input buffer")
        return y

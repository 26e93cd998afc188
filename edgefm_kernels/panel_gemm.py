"""Python side of ``csrc/panel_gemm.c``: an fp32 ``y = x W^T + b`` whose weight is packed once into 32-column
panels and streamed with prefetch (the action expert's decode GEMMs: ~50 rows, weights cold in DRAM).

    pw = PanelWeight(W [N, K] f32, b [N] | None)
    y = pw(x [M, K] f32)                 # -> [M, N] f32, threads = torch.get_num_threads()
    glu = PanelGlu(W_gate [I, K], W_up [I, K])
    h = glu(x [M, K] f32)                # -> silu(x W_gate^T) * (x W_up^T) [M, I] f32, one pass
"""
from __future__ import annotations

import ctypes

import torch

from . import native

NAME = "panel_gemm"
PANEL = 32


SIGNATURES = {
    "edgefm_panel_size": ([ctypes.c_int64] * 2, ctypes.c_int64),
    "edgefm_panel_pack": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p], None),
    "edgefm_panel_gemm": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int], None),
    "edgefm_panel_glu": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int], None),
}


def unavailable() -> str | None:
    """Why the panel GEMM cannot run on this machine, or None."""
    return native.unavailable(NAME)


def _lib():
    return native.bind(NAME, SIGNATURES)


def _check_weight(w: torch.Tensor) -> None:
    if w.dtype != torch.float32 or w.device.type != "cpu" or w.dim() != 2:
        raise ValueError(f"the panel GEMM takes a 2-D fp32 CPU weight, got {tuple(w.shape)} {w.dtype} on {w.device}")


def _pack(lib, w: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> panels [ceil(N/32) * K * 32] f32, 64-byte aligned."""
    n, k = w.shape
    out = torch.empty(lib.edgefm_panel_size(n, k), dtype=torch.float32)
    if out.data_ptr() % 64:  # the kernel uses aligned loads
        raise RuntimeError("torch returned a weight buffer that is not 64-byte aligned")
    lib.edgefm_panel_pack(w.contiguous().data_ptr(), n, k, out.data_ptr())
    return out


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"panel GEMM expects x [M, {k}] float32, got {tuple(x.shape)} {x.dtype}")
    return x.contiguous()


class PanelWeight:
    """W [N, K] (and b [N]) packed into panels [ceil(N/32), K, 32] (bias padded to match), fp32 on CPU."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None):
        _check_weight(w)
        self.n, self.k = w.shape
        self.panels = _pack(_lib(), w)
        self.bias = None
        if b is not None:
            if tuple(b.shape) != (self.n,):
                raise ValueError(f"bias must have shape ({self.n},), got {tuple(b.shape)}")
            self.bias = torch.zeros(self.panels.numel() // self.k, dtype=torch.float32)
            self.bias[: self.n] = b.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] f32 -> [M, N] f32."""
        x = _rows(x, self.k)
        m = x.shape[0]
        y = torch.empty(m, self.n, dtype=torch.float32)
        if m:
            _lib().edgefm_panel_gemm(x.data_ptr(), m, self.k, self.panels.data_ptr(), self.n,
                                     None if self.bias is None else self.bias.data_ptr(), y.data_ptr(),
                                     torch.get_num_threads())
        return y


class PanelGlu:
    """The gated MLP's first half, ``silu(x W_gate^T) * (x W_up^T)``: gate and up panels packed interleaved
    (pair j = gate columns 32j.. then the same up columns), so one thread computes both and applies SiLU
    and the product to its own cached results; exp is the kernel's own (~1 ulp), fp32 throughout."""

    def __init__(self, w_gate: torch.Tensor, w_up: torch.Tensor):
        for w in (w_gate, w_up):
            _check_weight(w)
        if w_gate.shape != w_up.shape:
            raise ValueError(f"gate and up weights differ in shape: {tuple(w_gate.shape)} vs {tuple(w_up.shape)}")
        self.n, self.k = w_gate.shape
        pairs = (self.n + PANEL - 1) // PANEL
        gate = _pack(_lib(), w_gate).view(pairs, 1, -1)
        up = _pack(_lib(), w_up).view(pairs, 1, -1)
        self.panels = torch.cat([gate, up], dim=1).view(-1)  # [pairs, (gate, up), K * 32]
        del gate, up
        if self.panels.data_ptr() % 64:
            raise RuntimeError("torch returned a weight buffer that is not 64-byte aligned")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] f32 -> [M, I] f32."""
        x = _rows(x, self.k)
        m = x.shape[0]
        pairs = (self.n + PANEL - 1) // PANEL
        tmp = torch.empty(m, 2 * pairs * PANEL, dtype=torch.float32)
        h = torch.empty(m, self.n, dtype=torch.float32)
        if m:
            _lib().edgefm_panel_glu(x.data_ptr(), m, self.k, self.panels.data_ptr(), self.n, tmp.data_ptr(),
                                    h.data_ptr(), torch.get_num_threads())
        return h

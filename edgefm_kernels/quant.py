"""int8 linears and MLPs on CPU: weights quantised once at build, symmetric, per output channel.

  int8_dyn  torch's dynamic quantised linear (oneDNN: VNNI / AMX-INT8): activations quantised per
            call (per tensor, asymmetric uint8), fp32 in and out
  int8_wo   weight-only: int8 weights, bf16 activations, dequantised inside the GEMM
            (torch._weight_int8pack_mm), bf16 out
  int8_amx  our AMX kernel (amx_gemm.py, weights="int8"): bf16 activations quantised per row and call
            (symmetric), int8 tile products, int32 sums, scales, bias and epilogue applied in the kernel,
            bf16 out; made for decode (M = 50), where it reads half the bytes of bf16 weights
  int8_vnni our AVX512-VNNI kernel (vnni_gemm.py) for CPUs without AMX: fp32 activations quantised per row
            and call, int32 sums, scales, bias, epilogue and residual applied in the kernel, fp32 out
Same build/call contracts as linear.py and mlp.py; outputs in x's dtype.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch

from . import amx_gemm, vnni_gemm
from .amx_gemm import quantize_rows
from .gemm import POSTS, epilogue, out_features
from .linear import LinearGroupFused
from .mlp import MlpFused
from .registry import Impl, register

MODES = ("int8_dyn", "int8_wo", "int8_amx", "int8_vnni")
WO_K_MULTIPLE = 16  # _weight_int8pack_mm on CPU


@contextmanager
def _quant_engine(name: str):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


class QGemm:
    """Quantised ``y = x W^T + b`` and its epilogue (gemm.POSTS): ``make() -> (W fp32, b)``."""

    def __init__(self, make, post: str, mode: str):
        if mode not in MODES:
            raise ValueError(f"unknown int8 mode {mode!r}; known: {MODES}")
        if post not in POSTS:
            raise ValueError(f"unknown GEMM epilogue {post!r}; known: {POSTS}")
        w, b = make()
        if mode == "int8_wo" and w.shape[1] % WO_K_MULTIPLE:
            # torch's CPU kernel aborts the process (no exception) for other widths
            raise ValueError(f"int8_wo needs in-features divisible by {WO_K_MULTIPLE}, got {w.shape[1]}")
        self.mode, self.post, self.out_features = mode, post, out_features(w, post)
        if mode == "int8_amx":  # quantised and packed by the kernel's module
            self.kernel = amx_gemm.AmxWeight(w, b, post, weights="int8")
            return
        if mode == "int8_vnni":
            self.kernel = vnni_gemm.VnniWeight(w, b, post)
            return
        q, scale = quantize_rows(w)
        if mode == "int8_dyn":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # quantized tensor creation is deprecated, still the API
                qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
            with _quant_engine("onednn"):
                self.packed = torch.ops.quantized.linear_prepack(qw, None if b is None else b.float())
        else:
            self.q, self.scale = q, scale.to(torch.bfloat16)
            self.b = None if b is None else b.to(torch.bfloat16)

    @property
    def takes_residual(self) -> bool:
        """``__call__(x, residual)`` adds the residual inside the kernel (int8_amx, int8_vnni)."""
        return self.mode in ("int8_amx", "int8_vnni")

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if residual is not None and not self.takes_residual:
            raise ValueError(f"int8 mode {self.mode!r} does not add a residual; add it after the call")
        if self.takes_residual:
            r2 = None if residual is None else residual.reshape(-1, self.out_features)
            return self.kernel(x2, r2).view(*lead, self.out_features)
        if self.mode == "int8_dyn":
            y = torch.ops.quantized.linear_dynamic(x2.float(), self.packed, False)
        else:
            y = torch._weight_int8pack_mm(x2.to(torch.bfloat16), self.q, self.scale)
            if self.b is not None:
                y = y + self.b
        return epilogue(y, self.post).view(*lead, self.out_features)


def _xdtype(mode: str) -> torch.dtype:
    return torch.float32 if mode in ("int8_dyn", "int8_vnni") else torch.bfloat16


def _check(mode: str):
    def check(spec, params) -> str | None:
        if not spec.hw_profile.startswith("cpu"):
            return f"the int8 CPU kernels do not run on {spec.hw_profile!r}"
        if mode == "int8_amx":
            return amx_gemm.unavailable()
        if mode == "int8_vnni":
            return vnni_gemm.unavailable()
        if mode == "int8_dyn" and "onednn" not in torch.backends.quantized.supported_engines:
            return "torch has no oneDNN quantised engine"
        if mode == "int8_wo":
            widths = [spec.dims[k] for k in ("in", "hidden", "inner") if k in spec.dims]
            if not widths or any(w % WO_K_MULTIPLE for w in widths):
                return f"int8_wo needs GEMM input widths divisible by {WO_K_MULTIPLE}, this op has {widths or 'none given'}"
        return None
    return check


def _linear(mode: str):
    return lambda spec, params, weights: LinearGroupFused(
        weights, _xdtype(mode), lambda make, post: QGemm(make, post, mode), weight_dtype=torch.float32)


def _mlp(mode: str):
    def build(spec, params, weights, act):
        dtype = torch.bfloat16 if mode == "int8_amx" else torch.float32
        return MlpFused(weights, act, dtype, lambda make, post: QGemm(make, post, mode), weight_dtype=torch.float32)
    return build


for _mode, _doc in (("int8_dyn", "dynamic int8 (activations quantised per call, oneDNN VNNI/AMX)"),
                    ("int8_wo", "int8 weights, bf16 activations (_weight_int8pack_mm)"),
                    ("int8_amx", "our AMX int8 GEMM, activations per row, epilogue fused, bf16 in and out"),
                    ("int8_vnni", "our AVX512-VNNI int8 GEMM, activations per row, epilogue fused, fp32 in and out")):
    register(Impl("linear", _mode, _linear(_mode), precision="int8", check=_check(_mode), doc=_doc))
    register(Impl("mlp", _mode, _mlp(_mode), precision="int8", check=_check(_mode), doc=_doc))

"""fp8 (e4m3) linears for NVIDIA GPUs with fp8 tensor cores (sm89, sm90 and later).

Weights are quantised once per output channel, activations per token on every call; the GEMM is
``torch._scaled_mm`` with row-wise scales and a bf16 output, cast back to x's dtype. Same contract
as linear.py (a fused group, outputs split as views). Selected by ``cuda_sm90`` records; verified on
the GPU by scripts/device_check.sh (no fp8 GEMM exists on CPU, so nothing here runs in CPU tests).
"""
from __future__ import annotations

import torch
from torch import nn

from .gemm import concat
from .linear import one_output
from .registry import Impl, register

FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_SM = 89


def sm_of(hw_profile: str) -> int | None:
    """cuda_sm90 -> 90; None for other profiles."""
    if not hw_profile.startswith("cuda_sm"):
        return None
    digits = hw_profile[len("cuda_sm"):].split("_")[0]
    return int(digits) if digits.isdigit() else None


def quantize_fp8(t: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """t -> (e4m3 values, fp32 scales along ``dim`` kept as size-1) with t ~ q * scale."""
    scale = (t.abs().amax(dim=dim, keepdim=True).float() / FP8_MAX).clamp_min(1e-12)
    return (t.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


class LinearGroupFp8(nn.Module):
    def __init__(self, weights):
        super().__init__()
        sources = list(weights)
        self.sizes = [w.shape[0] for w, _ in sources]
        w, b = concat(sources, torch.float32)
        device = "cuda" if torch.cuda.is_available() else w.device
        q, scale = quantize_fp8(w.to(device), dim=1)  # [N, K], [N, 1]
        self.w_t, self.w_scale = q.t(), scale.t().contiguous()  # [K, N] column-major, [1, N]
        self.b = None if b is None else b.to(device=device, dtype=torch.bfloat16)

    def forward(self, x, residual=None):
        if residual is not None:
            one_output(self.sizes)
            return residual + self.forward(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = quantize_fp8(x2, dim=1)  # per token: [M, K], [M, 1]
        y = torch._scaled_mm(xq, self.w_t, scale_a=xs, scale_b=self.w_scale, bias=self.b, out_dtype=torch.bfloat16)
        y = y.view(*lead, -1).to(x.dtype)
        return y if len(self.sizes) == 1 else tuple(y.split(self.sizes, dim=-1))


def _check(spec, params) -> str | None:
    sm = sm_of(spec.hw_profile)
    if sm is None or sm < MIN_SM:
        return f"fp8 tensor-core GEMMs need sm{MIN_SM}+, this is {spec.hw_profile!r}"
    d_in = spec.dims.get("in")
    if d_in is None or d_in % 16:
        return f"fp8 GEMMs need in-features divisible by 16, got {d_in}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


register(Impl("linear", "fp8", lambda spec, params, weights: LinearGroupFp8(weights), hw_prefixes=("cuda",),
              precision="fp8", check=_check,
              doc="e4m3 weights (per channel) and activations (per token), torch._scaled_mm, bf16 out"))

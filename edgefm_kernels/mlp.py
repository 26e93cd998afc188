"""Feed-forward blocks.

``impl.build(spec, params, weights={...}, act="silu_gated" | "gelu_tanh")``:
  silu_gated: weights {"gate": W [I, H], "up": W [I, H], "down": W [H, I]} (no biases, Llama style)
  gelu_tanh:  weights {"fc1": (W [I, H], b), "fc2": (W [H, I], b)} (SigLIP style)
-> module ``forward(x [..., H], residual=None) -> [..., H]``: ``residual + mlp(x)`` when a residual is given
(our AMX GEMMs add it in their epilogue; the others after the block).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import BACKENDS, BF16_BACKENDS, EPILOGUES, backend_check, concat, gemm_factory, with_residual
from .pages import release_pages
from .registry import Impl, register

ACTS = ("silu_gated", "gelu_tanh")


class MlpRef(nn.Module):
    def __init__(self, weights, act: str):
        super().__init__()
        if act not in ACTS:
            raise ValueError(f"unknown MLP activation {act!r}; known: {ACTS}")
        self.act = act
        self.w = dict(weights)

    def forward(self, x, residual=None):
        w = self.w
        if self.act == "silu_gated":
            y = F.linear(F.silu(F.linear(x, w["gate"])) * F.linear(x, w["up"]), w["down"])
        else:
            y = F.linear(F.gelu(F.linear(x, *w["fc1"]), approximate="tanh"), *w["fc2"])
        return y if residual is None else residual + y


register(Impl("mlp", "ref", lambda spec, params, weights, act: MlpRef(weights, act), reference=True,
              doc="unfused fp32 MLP (Llama gated SiLU or SigLIP GELU-tanh)"))


class MlpFused(nn.Module):
    """gate/up as one GEMM with SiLU-and-product as its epilogue, or fc1 with its GELU-tanh, in ``dtype``.

    ``gemm(make, post)`` makes each GEMM (``gemm.Gemm`` with a backend, or a quantised one); x may
    come in any float dtype: it is cast to ``dtype`` and the output back to x's dtype.
    """

    def __init__(self, weights, act: str, dtype: torch.dtype, gemm, weight_dtype: torch.dtype | None = None):
        super().__init__()
        if act not in ACTS:
            raise ValueError(f"unknown MLP activation {act!r}; known: {ACTS}")
        w = dict(weights)
        self.dtype = dtype
        wd = weight_dtype or dtype
        if act == "silu_gated":
            pair = [(w["gate"], None), (w["up"], None)]
            self.first = gemm(lambda: concat(pair, wd), "silu_glu")
            self.second = gemm(lambda: concat([(w["down"], None)], wd), "none")
            sources = [w["gate"], w["up"], w["down"]]
        else:
            self.first = gemm(lambda: concat([w["fc1"]], wd), "gelu_tanh")
            self.second = gemm(lambda: concat([w["fc2"]], wd), "none")
            sources = [*w["fc1"], *w["fc2"]]
        release_pages([t for t in sources if t is not None])

    def forward(self, x, residual=None):
        h = self.first(x if x.dtype == self.dtype else x.to(self.dtype))
        return with_residual(self.second, h, residual, self.dtype, out_dtype=x.dtype)


def _fused(dtype: torch.dtype):
    return lambda spec, params, weights, act: MlpFused(weights, act, dtype, gemm_factory(params))


register(Impl("mlp", "fused", _fused(torch.float32), param_space={"backend": BACKENDS},
              check=backend_check(torch.float32),
              doc="fp32; gate/up one GEMM, or GELU fused into fc1 (oneDNN)"))
register(Impl("mlp", "bf16", _fused(torch.bfloat16), param_space={"backend": BF16_BACKENDS, "epilogue": EPILOGUES},
              precision="bf16", check=backend_check(torch.bfloat16),
              doc="bf16 weights and compute, gate/up one GEMM / GELU fused (oneDNN), or the SiLU-GLU / GELU "
                  "pass of csrc/bf16_rows.c after the GEMM (epilogue=avx512)"))

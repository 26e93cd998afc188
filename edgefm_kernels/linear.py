"""Linear projections, as groups that share one input: ``y_i = x W_i^T + b_i``.

``impl.build(spec, params, weights=[(W [out_i, in], b [out_i] | None), ...])`` -> module whose
``forward(x [..., in], residual=None)`` returns one tensor per weight (a tuple when there are several), in x's
dtype; a one-weight group takes ``residual`` [..., out] and returns ``residual + y`` (our AMX GEMMs add it in
their epilogue, the others after).
Grouping is what lets a fused implementation run Q/K/V or gate/up as one GEMM. Outputs may be views
(of one fused GEMM result) with a unit stride in the last dimension.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import BACKENDS, BF16_BACKENDS, backend_check, concat, gemm_factory, with_residual
from .pages import release_pages
from .registry import Impl, register

Weights = Sequence[tuple[torch.Tensor, "torch.Tensor | None"]]


def _unpack(outs: list[torch.Tensor]):
    return outs[0] if len(outs) == 1 else tuple(outs)


def one_output(sizes: Sequence) -> None:
    """A residual goes with a one-weight group only (``sizes``: one entry per weight)."""
    if len(sizes) != 1:
        raise ValueError(f"a residual is added to a one-weight linear, this group has {len(sizes)} outputs")


class LinearGroupRef(nn.Module):
    """Reference: one F.linear per weight, weights used as given (memory-mapped, never copied)."""

    def __init__(self, weights: Weights):
        super().__init__()
        self.weights = [w for w, _ in weights]
        self.biases = [b for _, b in weights]

    def forward(self, x, residual=None):
        if residual is not None:
            one_output(self.weights)
            return residual + F.linear(x, self.weights[0], self.biases[0])
        return _unpack([F.linear(x, w, b) for w, b in zip(self.weights, self.biases)])


register(Impl("linear", "ref", lambda spec, params, weights: LinearGroupRef(weights), reference=True,
              doc="one F.linear per weight, fp32"))


class LinearGroupFused(nn.Module):
    """The group's weights concatenated once -> one GEMM -> outputs split (views).

    ``gemm(make, post)`` makes the GEMM from ``make() -> (W, b)`` (weights in ``weight_dtype``, default
    ``dtype``); x may come in any float dtype: it is cast to ``dtype`` and the outputs back to x's dtype.
    """

    def __init__(self, weights: Weights, dtype: torch.dtype, gemm, weight_dtype: torch.dtype | None = None):
        super().__init__()
        sources = list(weights)
        self.sizes = [w.shape[0] for w, _ in sources]
        self.dtype = dtype
        self.gemm = gemm(lambda: concat(sources, weight_dtype or dtype), "none")
        release_pages([t for pair in sources for t in pair if t is not None])

    def forward(self, x, residual=None):
        if residual is not None:
            one_output(self.sizes)
        y = with_residual(self.gemm, x, residual, self.dtype)
        return y if len(self.sizes) == 1 else tuple(y.split(self.sizes, dim=-1))


def _fused(dtype: torch.dtype):
    return lambda spec, params, weights: LinearGroupFused(weights, dtype, gemm_factory(params))


register(Impl("linear", "fused", _fused(torch.float32), param_space={"backend": BACKENDS},
              check=backend_check(torch.float32),
              doc="fp32; the group's weights concatenated once -> one GEMM (aten | MKL packed | oneDNN packed)"))
register(Impl("linear", "bf16", _fused(torch.bfloat16), param_space={"backend": BF16_BACKENDS},
              precision="bf16", check=backend_check(torch.bfloat16),
              doc="bf16 weights and compute (AMX/AVX512-BF16 through oneDNN), fused group, output in x's dtype"))

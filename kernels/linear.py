"""Linear projections, as groups that share one input: ``y_i = x W_i^T + b_i``.

``impl.build(spec, params, weights=[(W [out_i, in], b [out_i] | None), ...])`` -> module whose
``forward(x [..., in])`` returns one tensor per weight (a tuple when there are several), in x's dtype.
Grouping is what lets a fused implementation run Q/K/V or gate/up as one GEMM.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Impl, register

Weights = Sequence[tuple[torch.Tensor, "torch.Tensor | None"]]


def _unpack(outs: list[torch.Tensor]):
    return outs[0] if len(outs) == 1 else tuple(outs)


class LinearGroupRef(nn.Module):
    """Reference: one F.linear per weight, weights used as given (memory-mapped, never copied)."""

    def __init__(self, weights: Weights):
        super().__init__()
        self.weights = [w for w, _ in weights]
        self.biases = [b for _, b in weights]

    def forward(self, x):
        return _unpack([F.linear(x, w, b) for w, b in zip(self.weights, self.biases)])


register(Impl("linear", "ref", lambda spec, params, weights: LinearGroupRef(weights), reference=True,
              doc="one F.linear per weight, fp32"))

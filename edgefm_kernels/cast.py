"""Activation dtype of a model part: the precision each phase runs in.

``impl.build(spec, params)`` -> fn(x) -> x in the part's activation dtype. The engine applies one at
the entry of each part (layer roles ``vision_act``, ``vlm_act``: prefill; ``expert_act``: decode)
and casts the part's outputs back to fp32; every op implementation returns its input's dtype, so
the whole part then runs in that dtype. The reference is fp32 (LeRobot's numerics).
"""
from __future__ import annotations

import torch

from .registry import Impl, register


class Cast:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.dtype == self.dtype else x.to(self.dtype)


register(Impl("cast", "fp32", lambda spec, params: Cast(torch.float32), reference=True,
              doc="fp32 activations"))
register(Impl("cast", "bf16", lambda spec, params: Cast(torch.bfloat16), precision="bf16",
              doc="bf16 activations: every op of the part receives and returns bf16"))

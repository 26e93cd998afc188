"""Training-time image augmentation over the simulator's camera conditions (on the fly, in the batcher).

``ConditionAugment`` draws one random condition of random severity per sample (``sim.conditions.
random_condition``: clean with a fixed share, else blur, under/over-exposure, sensor noise or heavy JPEG over
a range that covers the evaluation severities) and applies it to every camera of that sample, as one episode's
condition reaches both cameras. It works on the dataset's uint8 frames at their stored resolution, before the
model's resize, where a camera driver's degradation would happen.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from edgefm_ros.sim.conditions import random_condition

from .recipe import AUGMENTATIONS


class ConditionAugment:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng([seed, 0x617567])  # its own stream: batch order stays the recipe's

    def __call__(self, frames: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{camera: uint8 [B, H, W, 3]} -> the same, each sample under its own random condition."""
        keys = list(frames)
        n = len(frames[keys[0]])
        out = {k: np.empty_like(frames[k]) for k in keys}
        for i in range(n):
            cond = random_condition(self.rng)
            for k in keys:
                out[k][i] = cond.apply(frames[k][i], self.rng)
        return out


def make_augment(kind: str, seed: int) -> ConditionAugment | None:
    """``kind``: "none" -> None; "conditions" -> ConditionAugment(seed)."""
    if kind not in AUGMENTATIONS:
        raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {kind!r}")
    return ConditionAugment(seed) if kind == "conditions" else None

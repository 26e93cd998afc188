"""Per-request Pareto frontier over (quality up, latency down, energy down)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from edgefm_ros.types import CandidatePrediction


def dominates(a: CandidatePrediction, b: CandidatePrediction) -> bool:
    """a is at least as good as b on all three objectives and better on one."""
    ge = a.quality >= b.quality and a.latency_s <= b.latency_s and a.energy_j <= b.energy_j
    gt = a.quality > b.quality or a.latency_s < b.latency_s or a.energy_j < b.energy_j
    return ge and gt


def frontier(preds: Sequence[CandidatePrediction]) -> np.ndarray:
    """bool (n,): True for candidates no other candidate dominates (infinite costs never are on it
    unless nothing is finite)."""
    finite = np.array([np.isfinite(p.latency_s) and np.isfinite(p.energy_j) for p in preds], dtype=bool)
    pool = [i for i in range(len(preds)) if finite[i]] or list(range(len(preds)))
    mask = np.zeros(len(preds), dtype=bool)
    for i in pool:
        mask[i] = not any(dominates(preds[j], preds[i]) for j in pool if j != i)
    return mask


def best(preds: Sequence[CandidatePrediction], allowed: np.ndarray) -> int | None:
    """Index of the highest quality among ``allowed`` (ties: lower latency, then lower energy)."""
    idx = [i for i in range(len(preds)) if allowed[i]]
    if not idx:
        return None
    return min(idx, key=lambda i: (-preds[i].quality, preds[i].latency_s, preds[i].energy_j))


def placement_frontier(preds: Sequence[CandidatePrediction], allowed: np.ndarray) -> np.ndarray:
    """bool (n,): the frontier of each placement among ``allowed``, computed per placement, so the edge
    candidates are never ruled out by the cloud's costs (the policy compares placements on quality)."""
    front = np.zeros(len(preds), dtype=bool)
    for placement in sorted({p.placement for p in preds}):
        idx = [i for i, p in enumerate(preds) if allowed[i] and p.placement == placement]
        if idx:
            front[idx] = frontier([preds[i] for i in idx])
    return front

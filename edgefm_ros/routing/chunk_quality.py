"""The quality of an action chunk: the label the router's predictor is calibrated on.

Shadow mode (placement/shadow.py) scores every edge chunk it logs with it, and ``edgefm-router calibrate``
fits the predictor to those scores, so the definition belongs with the router that learns from it.

There is no success label at inference time, so quality is agreement with the chunk of the *reference
configuration* (``policy.cloud_only``, by default the first cloud candidate; pick the configuration you
trust most) for the same observation and noise:

    e = sqrt( mean over the first H rows t and joints j of ((a[t, j] - r[t, j]) / s[j])^2 )
    quality = exp(-(e / tolerance)^2)

``s`` is a per-joint scale (use the dataset's action standard deviation, e.g. the unnormaliser's
``std``; default 1, for actions already in comparable units); ``H`` is the horizon actually executed
before the next chunk replaces this one (default: the whole chunk). Identical chunks score 1, an
RMS error of one ``tolerance`` (default 0.5 standard deviations) scores exp(-1) = 0.37, two score
0.02. The reference itself scores 1 by definition. Both chunks must come from the same
observation and the same flow-matching noise, otherwise noise is scored as disagreement.
"""
from __future__ import annotations

import math

import numpy as np


def chunk_error(actions: np.ndarray, reference: np.ndarray, scale: float | np.ndarray = 1.0,
                horizon: int | None = None) -> float:
    """Normalised RMS error e of the module docstring. actions, reference: (chunk, action_dim)."""
    a, r = np.asarray(actions, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.ndim != 2 or a.shape != r.shape:
        raise ValueError(f"chunk shapes must be equal (chunk, action_dim), got {a.shape} and {r.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(r))):
        raise ValueError("chunks hold non-finite values")
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), (a.shape[1],))
    if not np.all(s > 0):
        raise ValueError(f"scale must be > 0 per joint, got {np.asarray(scale).tolist()}")
    h = a.shape[0] if horizon is None else horizon
    if not 1 <= h <= a.shape[0]:
        raise ValueError(f"horizon must be in [1, {a.shape[0]}], got {horizon}")
    return float(np.sqrt(np.mean(((a[:h] - r[:h]) / s) ** 2)))


def chunk_quality(actions: np.ndarray, reference: np.ndarray, scale: float | np.ndarray = 1.0,
                  tolerance: float = 0.5, horizon: int | None = None) -> float:
    """exp(-(e / tolerance)^2) in (0, 1]: 1 for identical chunks (module docstring)."""
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    return math.exp(-(chunk_error(actions, reference, scale, horizon) / tolerance) ** 2)

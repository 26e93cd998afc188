"""Synthetic request logs generated from known coefficients (to test calibration and evaluation).

Per request: features drawn over their whole range (visual uniform, text on their natural grid),
a link (bandwidth log-uniform in [2, 200] Mbps, RTT uniform in [10, 150] ms) and, for every
candidate, the observed quality drawn from the true model q = sigmoid(beta . phi(x)): a Bernoulli
success, or the probability itself with ``soft=True``. Latency and energy are the cost model's
prediction times log-normal noise (sigma ``noise``); cloud bytes are ``resolution^2 * cameras *
bytes_per_pixel(jpeg_quality)`` with a random content factor.
"""
from __future__ import annotations

import math

import numpy as np

from edgefm_ros.routing.config import RouterConfig
from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.routing.link import LinkSnapshot
from edgefm_ros.routing.log import LogRecord
from edgefm_ros.routing.predictor import coefficient_matrix, design, predict_costs, sigmoid


def random_features(rng: np.random.Generator, n: int) -> np.ndarray:
    """float64 (n, 10) spread over each feature's range."""
    x = np.empty((n, len(FEATURE_NAMES)))
    x[:, 0] = rng.uniform(0.0, 1.0, n)  # blur
    x[:, 1] = rng.uniform(-1.0, 1.0, n)  # exposure
    x[:, 2] = rng.uniform(0.0, 1.0, n)  # jpeg
    x[:, 3] = rng.uniform(0.0, 1.0, n)  # detail
    x[:, 4] = rng.integers(1, 33, n) / 32.0  # text_length
    x[:, 5] = rng.uniform(0.0, 0.6, n)  # text_entity
    x[:, 6] = rng.choice([0.0, 0.5, 1.0], n)  # text_question
    x[:, 7] = rng.uniform(0.0, 0.6, n)  # text_lexical
    x[:, 8] = rng.integers(0, 4, n) / 3.0  # text_reasoning
    x[:, 9] = rng.integers(0, 4, n) / 3.0  # text_deictic
    return x


def jpeg_bytes_per_pixel(quality: int) -> float:
    """Rough bytes a pixel of a natural image takes at a JPEG quality (0: raw RGB)."""
    return 3.0 if quality == 0 else 0.05 + 0.004 * quality + 2e-6 * quality ** 3


def synth_records(cfg: RouterConfig, n_requests: int, rng: np.random.Generator, soft: bool = False,
                  noise: float = 0.1, deadline_s: float | None = None) -> list[LogRecord]:
    if n_requests < 1:
        raise ValueError(f"n_requests must be >= 1, got {n_requests}")
    feats = random_features(rng, n_requests)
    probs = sigmoid(design(feats) @ coefficient_matrix(cfg).T)  # (n, n_candidates)
    deadline = cfg.policy.default_deadline_s if deadline_s is None else deadline_s
    out = []
    for i in range(n_requests):
        n_cam = int(rng.integers(1, 3))
        link = LinkSnapshot(bandwidth_mbps=float(math.exp(rng.uniform(math.log(2), math.log(200)))),
                            rtt_s=float(rng.uniform(0.01, 0.15)))
        content = float(rng.uniform(0.6, 1.6))
        for j, c in enumerate(cfg.candidates):
            nbytes = 0
            if c.placement == "cloud":
                nbytes = int(content * n_cam * c.resolution ** 2 * 0.75 * jpeg_bytes_per_pixel(c.jpeg_quality))
            lat, en = predict_costs(c, cfg.cost, n_cam, nbytes, link)
            jitter = float(np.exp(rng.normal(0.0, noise)))
            q = float(probs[i, j]) if soft else float(rng.random() < probs[i, j])
            out.append(LogRecord(request_id=f"r{i:06d}", candidate=c.name, features=tuple(feats[i]), quality=q,
                                 latency_s=lat * jitter, energy_j=en * jitter, placement=c.placement,
                                 stamp=float(i), n_cameras=n_cam, upload_bytes=nbytes,
                                 bandwidth_mbps=link.bandwidth_mbps, rtt_s=link.rtt_s, deadline_s=deadline,
                                 served=True, source="synthetic"))
    return out

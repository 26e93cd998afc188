"""LeRobot's feature statistics: vectors per dimension (mean, std (population), min, max, count, q01..q99),
camera frames per channel on [0, 1] with shape [3, 1, 1], from a sample of frames downsampled to about 150
pixels a side (as LeRobot's compute_episode_stats samples them)."""
from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
IMAGE_SIDE = 150  # downsample frames to about this many pixels a side for the statistics
FRAMES_PER_EPISODE = 100  # at most this many frames of an episode feed the image statistics


def vector_stats(x: np.ndarray) -> dict[str, list]:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    for q in QUANTILES:
        out[f"q{int(round(q * 100)):02d}"] = np.quantile(x, q, axis=0)
    res = {k: v.tolist() for k, v in out.items()}
    res["count"] = [int(len(x))]
    return res


def sample_positions(length: int, per_episode: int = FRAMES_PER_EPISODE) -> np.ndarray:
    """Which frames of an episode of ``length`` feed the image statistics (evenly spaced, deterministic)."""
    if length <= per_episode:
        return np.arange(length)
    return np.unique(np.round(np.linspace(0, length - 1, per_episode)).astype(np.int64))


class ImageMoments:
    """Per-channel running moments of sampled frames (float64 on [0, 1])."""

    def __init__(self) -> None:
        self.frames = 0
        self.n = 0
        self.s = np.zeros(3)
        self.ss = np.zeros(3)
        self.lo = np.full(3, np.inf)
        self.hi = np.full(3, -np.inf)
        self._q: list[np.ndarray] = []

    def add(self, rgb: np.ndarray) -> None:
        h, w = rgb.shape[:2]
        step = max(1, int(round(max(h, w) / IMAGE_SIDE)))
        px = rgb[::step, ::step].reshape(-1, 3).astype(np.float64) / 255.0
        self.frames += 1
        self.n += len(px)
        self.s += px.sum(0)
        self.ss += (px * px).sum(0)
        self.lo = np.minimum(self.lo, px.min(0))
        self.hi = np.maximum(self.hi, px.max(0))
        self._q.append(np.stack([np.quantile(px, q, axis=0) for q in QUANTILES]))

    def stats(self) -> dict[str, list]:
        if self.n == 0:
            raise ValueError("no frames were sampled for the image statistics")
        mean = self.s / self.n
        std = np.sqrt(np.maximum(self.ss / self.n - mean ** 2, 0.0))
        shape = lambda v: np.asarray(v).reshape(3, 1, 1).tolist()  # noqa: E731
        out = {"min": shape(self.lo), "max": shape(self.hi), "mean": shape(mean), "std": shape(std)}
        q = np.mean(np.stack(self._q), axis=0)  # [len(QUANTILES), 3]: mean of the per-frame quantiles
        for i, qq in enumerate(QUANTILES):
            out[f"q{int(round(qq * 100)):02d}"] = shape(q[i])
        out["count"] = [self.frames]
        return out

"""Synthetic but realistic robot streams (numpy only): a moving scene seen by several cameras, smooth
joint trajectories, a few instructions."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
TASKS = ("Pick up the red cube and place it in the blue bowl.", "Push the green block to the left.",
         "Open the drawer.")


@dataclass(frozen=True)
class SceneConfig:
    width: int = 160
    height: int = 120
    cameras: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if not (16 <= self.width <= 4096 and 16 <= self.height <= 4096):
            raise ValueError(f"image size must be within 16..4096, got {self.width}x{self.height}")
        if not 1 <= self.cameras <= 8:
            raise ValueError(f"cameras must be in 1..8, got {self.cameras}")


class Scene:
    """A table with a moving red cube and a blue bowl; camera i sees it from its own offset and zoom."""

    def __init__(self, cfg: SceneConfig):
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        h, w = cfg.height, cfg.width
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        self._yy, self._xx = yy / h, xx / w  # (H, W) in [0, 1)
        self._base = []
        for i in range(cfg.cameras):
            tint = rng.uniform(0.6, 1.0, size=3).astype(np.float32)
            bg = (0.35 + 0.3 * self._yy[..., None] + 0.1 * np.sin(6.0 * self._xx[..., None] + i)) * tint
            self._base.append((np.clip(bg, 0, 1) * 255).astype(np.uint8))  # (H, W, 3)
        self._noise_rng = np.random.default_rng(cfg.seed + 1)

    def frame(self, cam: int, t: float) -> np.ndarray:
        """uint8 (H, W, 3) RGB of camera ``cam`` at time ``t``."""
        img = self._base[cam].copy()
        ph = 0.7 * cam
        cube = (0.5 + 0.3 * np.cos(0.8 * t + ph), 0.55 + 0.2 * np.sin(1.1 * t + ph))  # (x, y) in [0, 1]
        bowl = (0.25 + 0.1 * cam, 0.7)
        self._disk(img, bowl, 0.12, (40, 60, 200))
        self._box(img, cube, 0.08 / (1 + 0.3 * cam), (210, 40, 40))
        noise = self._noise_rng.integers(-4, 5, size=img.shape, dtype=np.int16)
        return np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8)

    def _box(self, img, c, r, color) -> None:
        m = (np.abs(self._xx - c[0]) < r) & (np.abs(self._yy - c[1]) < r * self.cfg.width / self.cfg.height)
        img[m] = color

    def _disk(self, img, c, r, color) -> None:
        m = (self._xx - c[0]) ** 2 + ((self._yy - c[1]) * self.cfg.height / self.cfg.width) ** 2 < r * r
        img[m] = color


def joint_positions(t: float, n: int = len(JOINTS)) -> np.ndarray:
    """Smooth joint positions (radians) at time t -> float64 (n,)."""
    k = np.arange(n)
    return 0.4 * np.sin(0.5 * t * (1 + 0.2 * k) + k) + 0.05 * k


def joint_velocities(t: float, n: int = len(JOINTS)) -> np.ndarray:
    k = np.arange(n)
    return 0.4 * 0.5 * (1 + 0.2 * k) * np.cos(0.5 * t * (1 + 0.2 * k) + k)


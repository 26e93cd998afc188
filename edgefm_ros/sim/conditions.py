"""Camera conditions: what a real camera and its link do to a frame, drawn per episode from its seed.

    cond = draw_condition("mixed", "push", 1003)       # the episode's condition (same task and seed, same one)
    cam = ConditionedCamera(cond, seed=1003)           # applies it to every frame, where a camera driver would
    images = cam(env.render())                         # {camera: uint8 [H, W, 3]}

A condition is a small frozen config with ``apply(img, rng) -> img`` on one uint8 RGB frame at the camera's
resolution (before any model resizes it). Both cameras of an episode get the same condition (one lighting,
one link); per-frame randomness (sensor noise) comes from a generator seeded by the episode, so a seed's
frames are reproducible in every executor. Sizes (blur) are fractions of the image width, so a condition
means the same at any camera resolution.

Condition sets name the shares episodes are drawn with: ``clean`` (all clean), ``degraded`` (the five
degradations in equal shares) and ``mixed`` (the routing default: 40% clean, 12% each degradation).

``augment(img, rng)`` is the training-time counterpart: a random condition of random severity (a range that
covers the evaluation severities), for policies trained to withstand them.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Mapping, Union

import numpy as np


def _check_uint8(img: np.ndarray) -> np.ndarray:
    a = np.asarray(img)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"camera frame must be uint8 [H, W, 3], got {a.dtype} {a.shape}")
    return a


@dataclass(frozen=True)
class Clean:
    """The frame as rendered."""

    name: str = "clean"

    def apply(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _check_uint8(img).copy()


@dataclass(frozen=True)
class DefocusBlur:
    """An out-of-focus lens: Gaussian blur with sigma = ``sigma_frac`` x image width."""

    name: str = "blur"
    sigma_frac: float = 0.035

    def __post_init__(self) -> None:
        if not (0 < self.sigma_frac < 0.25):
            raise ValueError(f"DefocusBlur.sigma_frac must be in (0, 0.25), got {self.sigma_frac!r}")

    def apply(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        import cv2

        a = _check_uint8(img)
        sigma = self.sigma_frac * a.shape[1]
        return cv2.GaussianBlur(a, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REFLECT)


@dataclass(frozen=True)
class Exposure:
    """Wrong exposure: linear gain on the light (clipped at white), then the display gamma is unchanged.
    gain < 1 under-exposes (dark, quantised shadows), gain > 1 over-exposes (bright parts clip)."""

    name: str = "exposure"
    gain: float = 1.0

    def __post_init__(self) -> None:
        if not (0.02 <= self.gain <= 20 and self.gain != 1.0):
            raise ValueError(f"Exposure.gain must be in [0.02, 20] and not 1, got {self.gain!r}")

    def apply(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        a = _check_uint8(img).astype(np.float32) / 255.0
        lin = np.power(a, 2.2) * self.gain  # sRGB-ish decode, scale the light, re-encode
        out = np.power(np.clip(lin, 0.0, 1.0), 1 / 2.2) * 255.0
        return np.rint(out).astype(np.uint8)


@dataclass(frozen=True)
class SensorNoise:
    """A noisy sensor (high gain, low light): independent Gaussian noise per pixel and channel, std
    ``std`` in 8-bit levels, fresh every frame."""

    name: str = "noise"
    std: float = 40.0

    def __post_init__(self) -> None:
        if not (0 < self.std <= 128):
            raise ValueError(f"SensorNoise.std must be in (0, 128] levels, got {self.std!r}")

    def apply(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        a = _check_uint8(img).astype(np.float32)
        a += rng.standard_normal(a.shape, dtype=np.float32) * np.float32(self.std)
        return np.clip(np.rint(a), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class JpegWire:
    """A starved link: the frame travels as a JPEG of quality ``quality`` (OpenCV's libjpeg, 4:2:0)."""

    name: str = "jpeg"
    quality: int = 6

    def __post_init__(self) -> None:
        if not (isinstance(self.quality, int) and 1 <= self.quality <= 100):
            raise ValueError(f"JpegWire.quality must be an int in [1, 100], got {self.quality!r}")

    def apply(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        import cv2

        a = _check_uint8(img)
        ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(a[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        return np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1])


Condition = Union[Clean, DefocusBlur, Exposure, SensorNoise, JpegWire]

# The evaluation conditions (their names are what reports and routing logs carry).
CONDITIONS: dict[str, Condition] = {c.name: c for c in (
    Clean(),
    DefocusBlur("blur", sigma_frac=0.035),
    Exposure("dark", gain=0.06),
    Exposure("bright", gain=6.0),
    SensorNoise("noise", std=40.0),
    JpegWire("jpeg", quality=6),
)}
DEGRADED = tuple(n for n in CONDITIONS if n != "clean")


@dataclass(frozen=True)
class ConditionSet:
    """A named distribution over CONDITIONS: ``shares`` = ((condition name, share), ...), shares sum to 1."""

    name: str
    shares: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        names = [n for n, _ in self.shares]
        bad = [n for n in names if n not in CONDITIONS]
        if bad or not names or len(set(names)) != len(names):
            raise ValueError(f"ConditionSet {self.name!r}: conditions {names!r} must be distinct names from "
                             f"{sorted(CONDITIONS)}")
        p = [s for _, s in self.shares]
        if any(not (s > 0 and math.isfinite(s)) for s in p) or abs(sum(p) - 1.0) > 1e-9:
            raise ValueError(f"ConditionSet {self.name!r}: shares {p!r} must be positive and sum to 1")

    def share(self, condition: str) -> float:
        return dict(self.shares).get(condition, 0.0)


CONDITION_SETS: dict[str, ConditionSet] = {s.name: s for s in (
    ConditionSet("clean", (("clean", 1.0),)),
    ConditionSet("degraded", tuple((n, 1.0 / len(DEGRADED)) for n in DEGRADED)),
    ConditionSet("mixed", (("clean", 0.4),) + tuple((n, 0.6 / len(DEGRADED)) for n in DEGRADED)),
)}
DEFAULT_ROUTING_SET = "mixed"

_DRAW_SALT = zlib.crc32(b"edgefm camera condition")  # the draw is independent of the layout's generator
_FRAME_SALT = zlib.crc32(b"edgefm camera frames")


def get_condition_set(name: str) -> ConditionSet:
    try:
        return CONDITION_SETS[name]
    except KeyError:
        raise ValueError(f"unknown condition set {name!r}; sets: {sorted(CONDITION_SETS)}") from None


def get_condition(name: str) -> Condition:
    try:
        return CONDITIONS[name]
    except KeyError:
        raise ValueError(f"unknown camera condition {name!r}; conditions: {sorted(CONDITIONS)}") from None


def draw_condition(condition_set: str, task: str, seed: int) -> Condition:
    """The condition of ``task``'s episode ``seed`` under ``condition_set`` (deterministic; the task enters the
    draw so that one seed's episodes of different tasks are not all under the same condition)."""
    cs = get_condition_set(condition_set)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if len(cs.shares) == 1:
        return CONDITIONS[cs.shares[0][0]]
    u = np.random.default_rng([_DRAW_SALT, zlib.crc32(task.encode()), int(seed)]).random()
    edges = np.cumsum([s for _, s in cs.shares])
    return CONDITIONS[cs.shares[min(int(np.searchsorted(edges, u, side="right")), len(edges) - 1)][0]]


class ConditionedCamera:
    """Applies one episode's condition to every frame: {camera: uint8 [H, W, 3]} -> the same, degraded.
    Per-frame randomness is drawn from a generator seeded by the episode's seed."""

    def __init__(self, condition: Condition, seed: int):
        self.condition = condition
        self.rng = np.random.default_rng([_FRAME_SALT, int(seed)])

    @property
    def name(self) -> str:
        return self.condition.name

    def __call__(self, images: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if isinstance(self.condition, Clean):
            return dict(images)
        return {c: self.condition.apply(img, self.rng) for c, img in images.items()}


# Training augmentation: severities drawn around and beyond the evaluation ones.
AUG_CLEAN_SHARE = 0.3


def random_condition(rng: np.random.Generator) -> Condition:
    """A condition of random kind and severity for training (clean with AUG_CLEAN_SHARE)."""
    if rng.random() < AUG_CLEAN_SHARE:
        return CONDITIONS["clean"]
    kind = int(rng.integers(5))
    if kind == 0:
        return DefocusBlur("blur", sigma_frac=float(rng.uniform(0.01, 0.05)))
    if kind == 1:
        return Exposure("dark", gain=float(np.exp(rng.uniform(np.log(0.04), np.log(0.4)))))
    if kind == 2:
        return Exposure("bright", gain=float(np.exp(rng.uniform(np.log(2.0), np.log(9.0)))))
    if kind == 3:
        return SensorNoise("noise", std=float(rng.uniform(10.0, 55.0)))
    return JpegWire("jpeg", quality=int(rng.integers(3, 30)))


def augment(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One training frame under a random condition (see ``random_condition``)."""
    return random_condition(rng).apply(img, rng)

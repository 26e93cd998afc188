"""Values passed between modules: frozen dataclasses, no ROS, no torch.

Shapes and dtypes are part of the contract and are checked at construction, so a malformed value
fails where it is made, with the bad value named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

SOURCES = ("edge", "cloud", "edge-fallback")


@dataclass(frozen=True)
class Observation:
    """One robot observation, in raw (unnormalised) units.

    images: camera key (the model's feature key, e.g. ``observation.images.camera1``) ->
        uint8 (H, W, 3) RGB, or float32 (3, H, W) in [0, 1] (LeRobot's layout).
    state: float32 (state_dim,) raw joint state in the model's state order.
    task: the instruction text.
    stamp: observation time in seconds (ROS time of the newest sensor message used).
    missing: camera keys the robot declares absent (their padding mask becomes False).
    """

    images: Mapping[str, np.ndarray]
    state: np.ndarray
    task: str
    stamp: float = 0.0
    missing: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        state = np.asarray(self.state)
        if state.ndim != 1:
            raise ValueError(f"Observation.state must be 1-D, got shape {state.shape}")
        if not np.all(np.isfinite(state)):
            raise ValueError(f"Observation.state holds non-finite values: {state.tolist()}")
        if not isinstance(self.task, str):
            raise ValueError(f"Observation.task must be a str, got {type(self.task).__name__}")


@dataclass(frozen=True)
class ActionChunk:
    """A chunk of actions in raw (unnormalised) units.

    actions: float32 (chunk_size, action_dim), row i is meant for time stamp + i * dt.
    """

    actions: np.ndarray
    dt: float
    stamp: float
    source: str = "edge"
    model: str = ""
    joint_names: tuple[str, ...] = ()
    seq: int = 0
    inference_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def __post_init__(self) -> None:
        a = np.asarray(self.actions)
        if a.ndim != 2:
            raise ValueError(f"ActionChunk.actions must be (chunk, action_dim), got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError("ActionChunk.actions holds non-finite values")
        if self.source not in SOURCES:
            raise ValueError(f"ActionChunk.source must be one of {SOURCES}, got {self.source!r}")
        if not (self.dt > 0 and math.isfinite(self.dt)):
            raise ValueError(f"ActionChunk.dt must be a positive number, got {self.dt!r}")
        if self.joint_names and len(self.joint_names) != a.shape[1]:
            raise ValueError(
                f"ActionChunk.joint_names has {len(self.joint_names)} names for action_dim {a.shape[1]}")

    @property
    def chunk_size(self) -> int:
        return int(np.asarray(self.actions).shape[0])

    @property
    def action_dim(self) -> int:
        return int(np.asarray(self.actions).shape[1])


@dataclass(frozen=True)
class CandidatePrediction:
    """The router's prediction for one candidate configuration."""

    name: str
    placement: str  # "edge" | "cloud"
    quality: float  # calibrated probability of success, [0, 1]
    latency_s: float
    energy_j: float


@dataclass(frozen=True)
class RouteDecision:
    """What the router decided for one request, and why."""

    target: str  # "edge" | "cloud"
    candidate: str  # name of the chosen candidate
    reason: str  # which rule decided
    stamp: float = 0.0
    feature_names: tuple[str, ...] = ()
    features: tuple[float, ...] = ()
    predictions: tuple[CandidatePrediction, ...] = ()
    guard_open: bool = False  # True while the bandwidth guard forces edge-only
    bandwidth_mbps: float = float("nan")
    rtt_s: float = float("nan")
    params: Mapping[str, object] = field(default_factory=dict)  # e.g. jpeg_quality, resolution

    def __post_init__(self) -> None:
        if self.target not in ("edge", "cloud"):
            raise ValueError(f"RouteDecision.target must be 'edge' or 'cloud', got {self.target!r}")
        if len(self.feature_names) != len(self.features):
            raise ValueError(
                f"RouteDecision has {len(self.feature_names)} feature names for {len(self.features)} features")

"""The VLA node's sensor cache without ROS: latest frame per camera, latest joint state, current task;
assembled into an ``Observation`` or refused with a reason (stale, missing camera, no state, no task).

Frames are stored as received (raw RGB arrays or compressed bytes) and decoded only when a chunk is
computed, on the worker thread.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from edgefm_ros.sensors.camera import decode_compressed, resize_rgb
from edgefm_ros.types import Observation


@dataclass(frozen=True)
class Frame:
    stamp: float  # capture time (header stamp), seconds
    rgb: np.ndarray | None = None  # uint8 (H, W, 3), raw transport
    compressed: bytes | None = None  # compressed transport, decoded on use
    fmt: str = ""


@dataclass(frozen=True)
class Snapshot:
    """The latest sensor data at the moment a chunk was requested."""

    frames: Mapping[str, Frame]
    state: np.ndarray | None  # float32 (state_dim,)
    state_stamp: float
    task: str
    taken: float  # when the snapshot was taken, seconds


@dataclass(frozen=True)
class Refusal:
    reason: str  # e.g. "stale_camera", "missing_camera", "no_state", "stale_state", "no_task", "bad_image"
    detail: str


@dataclass
class SensorCache:
    camera_keys: tuple[str, ...]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.frames: dict[str, Frame] = {}
        self.state: np.ndarray | None = None
        self.state_stamp = float("nan")
        self.task = ""
        self.task_stamp = float("nan")

    def put_frame(self, key: str, frame: Frame) -> None:
        with self.lock:
            self.frames[key] = frame

    def put_state(self, state: np.ndarray, stamp: float) -> None:
        with self.lock:
            self.state, self.state_stamp = state, stamp

    def put_task(self, task: str, stamp: float) -> None:
        with self.lock:
            self.task, self.task_stamp = task, stamp

    def snapshot(self, now: float) -> Snapshot:
        with self.lock:
            return Snapshot(dict(self.frames), self.state, self.state_stamp, self.task, now)


def assemble(snap: Snapshot, *, required: tuple[str, ...], model_keys: tuple[str, ...],
             image_hw: Mapping[str, tuple[int, int]], max_age_s: float, now: float,
             resize: bool = True, decode: Callable[[str, bytes], np.ndarray] = decode_compressed
             ) -> Observation | Refusal:
    """An Observation for the model, or the first reason it cannot be made.

    required: camera keys that must be present and fresh; other configured cameras that are absent or stale
    are declared ``missing`` (masked), as are model cameras no topic feeds.
    image_hw: model camera key -> (H, W) the model expects (frames are resized when ``resize``).
    """
    if not snap.task.strip():
        return Refusal("no_task", "no instruction received yet")
    if snap.state is None:
        return Refusal("no_state", "no joint state received yet")
    if not now - snap.state_stamp <= max_age_s:
        return Refusal("stale_state", f"joint state is {now - snap.state_stamp:.3f}s old (max {max_age_s:g}s)")
    images: dict[str, np.ndarray] = {}
    missing: list[str] = []
    newest = snap.state_stamp
    for key in model_keys:
        f = snap.frames.get(key)
        age = now - f.stamp if f is not None else float("inf")
        if f is None or not age <= max_age_s:
            if key in required:
                if f is None:
                    return Refusal("missing_camera", f"no frame from camera {key!r} yet")
                return Refusal("stale_camera", f"camera {key!r} frame is {age:.3f}s old (max {max_age_s:g}s)")
            missing.append(key)
            continue
        try:
            rgb = f.rgb if f.compressed is None else decode(f.fmt, f.compressed)
        except ValueError as e:
            return Refusal("bad_image", f"camera {key!r}: {e}")
        hw = image_hw.get(key)
        if hw is not None and rgb.shape[:2] != tuple(hw):
            if not resize:
                return Refusal("bad_image", f"camera {key!r} frame is {rgb.shape[0]}x{rgb.shape[1]}, "
                                            f"the model expects {hw[0]}x{hw[1]} (resize_images is false)")
            rgb = resize_rgb(rgb, hw[0], hw[1])
        images[key] = rgb
        newest = max(newest, f.stamp)
    if not images:
        return Refusal("missing_camera", "no camera frame is usable")
    return Observation(images=images, state=snap.state, task=snap.task, stamp=newest, missing=tuple(missing))


class RefusalCounter:
    """Counts refusals by reason and keeps the last detail for diagnostics."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.last = ""

    def add(self, r: Refusal) -> None:
        self.counts[r.reason] += 1
        self.last = f"{r.reason}: {r.detail}"

    @property
    def total(self) -> int:
        return sum(self.counts.values())

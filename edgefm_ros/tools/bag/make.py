"""``edgefm-bag make``: a rosbag2 bag of synthetic robot sensor streams.

Cameras at 30 Hz (raw sensor_msgs/Image and JPEG sensor_msgs/CompressedImage, as image_transport
publishes them), joint states at 100 Hz (names in the robot's order plus one joint the model does not
use), and the instruction (std_msgs/String, offered transient-local) changing over the recording.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import StoragePlugin, Writer

from edgefm_ros.sensors.camera import encode_jpeg
from edgefm_ros.tools.bag.synth import JOINTS, TASKS, Scene, SceneConfig, joint_positions, joint_velocities
from edgefm_ros.tools.bag.typestore import make_typestore

TRANSPORTS = ("raw", "compressed", "both")
STORAGES = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}
EXTRA_JOINT = "base_yaw"  # in joint_states, not in the model's state


@dataclass(frozen=True)
class MakeConfig:
    out: str
    duration_s: float = 10.0
    cameras: int = 2
    width: int = 160
    height: int = 120
    camera_hz: float = 30.0
    joint_hz: float = 100.0
    transport: str = "both"
    jpeg_quality: int = 85
    storage: str = "sqlite3"
    tasks: int = 2  # distinct instructions over the recording
    start_time: float = 0.0  # bag time of the first message (seconds); 0: now
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0 < self.duration_s <= 3600 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration_s must be in (0, 3600], got {self.duration_s!r}")
        for name in ("camera_hz", "joint_hz"):
            v = getattr(self, name)
            if not 0.1 <= v <= 1000:
                raise ValueError(f"{name} must be in [0.1, 1000], got {v!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {self.storage!r}")
        if not 1 <= self.tasks <= len(TASKS):
            raise ValueError(f"tasks must be in 1..{len(TASKS)}, got {self.tasks}")
        if Path(self.out).exists():
            raise ValueError(f"output bag {self.out} already exists")
        SceneConfig(self.width, self.height, self.cameras, self.seed)


def camera_topics(i: int) -> tuple[str, str]:
    return f"/camera{i + 1}/image_raw", f"/camera{i + 1}/image_raw/compressed"


def published_joint_order() -> tuple[str, ...]:
    """The order the synthetic robot publishes: rotated, with an extra joint first (exercises the mapping)."""
    return (EXTRA_JOINT,) + JOINTS[2:] + JOINTS[:2]


def _qos(durability: QosDurability, depth: int) -> Qos:
    zero = QosTime(0, 0)
    return Qos(QosHistory.KEEP_LAST, depth, QosReliability.RELIABLE, durability, zero, zero,
               QosLiveliness.AUTOMATIC, zero, False)


def _stream(hz: float, duration: float, kind: str, index: int):
    return ((k / hz, kind, index) for k in range(int(duration * hz)))


def _events(cfg: MakeConfig):
    """(time offset s, kind, index) in time order."""
    streams = [_stream(cfg.camera_hz, cfg.duration_s, "camera", i) for i in range(cfg.cameras)]
    streams.append(_stream(cfg.joint_hz, cfg.duration_s, "joints", 0))
    n = cfg.tasks
    streams.append(((j * cfg.duration_s / n, "task", j) for j in range(n)))
    return heapq.merge(*streams)


def make_bag(cfg: MakeConfig) -> dict[str, int]:
    """Write the bag; returns message counts per topic."""
    ts = make_typestore()
    T = ts.types
    scene = Scene(SceneConfig(cfg.width, cfg.height, cfg.cameras, cfg.seed))
    t0 = cfg.start_time or time.time()
    names = published_joint_order()
    perm = [JOINTS.index(n) if n in JOINTS else -1 for n in names]
    counts: dict[str, int] = {}
    tasks = TASKS[: cfg.tasks]

    def header(t: float, frame: str):
        ns = int(round(t * 1e9))
        return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                                        frame_id=frame)

    with Writer(cfg.out, version=9, storage_plugin=STORAGES[cfg.storage]) as w:
        conns = {}

        def conn(topic, msgtype, durability=QosDurability.VOLATILE, depth=10):
            if topic not in conns:
                conns[topic] = w.add_connection(topic, msgtype, typestore=ts,
                                                offered_qos_profiles=[_qos(durability, depth)])
            return conns[topic]

        def write(topic, msgtype, msg, t, **kw):
            w.write(conn(topic, msgtype, **kw), int(round(t * 1e9)), ts.serialize_cdr(msg, msgtype))
            counts[topic] = counts.get(topic, 0) + 1

        for dt, kind, i in _events(cfg):
            t = t0 + dt
            if kind == "camera":
                rgb = scene.frame(i, dt)  # (H, W, 3)
                raw_topic, jpg_topic = camera_topics(i)
                frame_id = f"camera{i + 1}_optical_frame"
                if cfg.transport in ("raw", "both"):
                    msg = T["sensor_msgs/msg/Image"](header=header(t, frame_id), height=cfg.height, width=cfg.width,
                                                     encoding="rgb8", is_bigendian=0, step=cfg.width * 3,
                                                     data=rgb.reshape(-1))
                    write(raw_topic, "sensor_msgs/msg/Image", msg, t)
                if cfg.transport in ("compressed", "both"):
                    jpg = np.frombuffer(encode_jpeg(rgb, cfg.jpeg_quality), dtype=np.uint8)
                    msg = T["sensor_msgs/msg/CompressedImage"](header=header(t, frame_id), data=jpg,
                                                               format="rgb8; jpeg compressed bgr8")
                    write(jpg_topic, "sensor_msgs/msg/CompressedImage", msg, t)
            elif kind == "joints":
                q, v = joint_positions(dt), joint_velocities(dt)
                pos = np.array([q[j] if j >= 0 else 0.1 * math.sin(dt) for j in perm], dtype=np.float64)
                vel = np.array([v[j] if j >= 0 else 0.1 * math.cos(dt) for j in perm], dtype=np.float64)
                msg = T["sensor_msgs/msg/JointState"](header=header(t, "base_link"), name=list(names),
                                                      position=pos, velocity=vel,
                                                      effort=np.zeros(len(names), dtype=np.float64))
                write("/joint_states", "sensor_msgs/msg/JointState", msg, t)
            else:
                write("/instruction", "std_msgs/msg/String", T["std_msgs/msg/String"](data=tasks[i]), t,
                      durability=QosDurability.TRANSIENT_LOCAL, depth=1)
    return counts


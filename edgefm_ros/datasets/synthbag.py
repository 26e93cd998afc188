"""A synthetic recording of this package's own topics, as ``edgefm-bag record`` stores them while sim_node
runs a few episodes: cameras (sensor_msgs/Image rgb8 or JPEG CompressedImage), /joint_states (JointState,
ee_x ee_y ee_z gripper), the command action_node publishes (/edgefm/command, JointTrajectory), the latched
instruction and the episode events (std_msgs/String JSON: start, then success or timeout). For tests and
the converter's benchmark; a few knobs make bad recordings on purpose.

    write_synthetic_bag(SynthConfig("demo_bag", episodes=(("reach", 3.0), ("push", 2.5)), storage="mcap"))
"""
from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer

from .bagread import typestore
from .mapping import SIM_JOINTS

STORAGES = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}
TASK_TEXT = {"reach": "Reach the red target.", "push": "Push the puck to the goal.",
             "drawer-open": "Open the drawer."}
COMMAND_TYPES = ("joint_trajectory", "float64_multi_array", "joint_state")


@dataclass(frozen=True)
class SynthConfig:
    out: str
    episodes: tuple[tuple[str, float], ...] = (("reach", 2.0), ("push", 2.0))  # (task, seconds)
    storage: str = "sqlite3"
    cameras: tuple[str, ...] = ("scene", "wrist")
    height: int = 48
    width: int = 64
    camera_hz: float = 30.0
    state_hz: float = 100.0
    command_hz: float = 20.0
    transport: str = "raw"  # raw | compressed (JPEG)
    jpeg_quality: int = 90
    settle_s: float = 0.5  # between episodes the streams go on (sim_node holds the arm)
    pause_s: float = 0.0  # then nothing at all is published for this long (a paused recording)
    events: bool = True
    instruction: bool = True
    command_type: str = "joint_trajectory"
    latency_ms: float = 2.0  # receive time = stamp + this (+ up to 1 ms of jitter)
    start_s: float = 1_700_000_000.0  # the first stamp
    seed: int = 0
    frame_code: bool = False  # each frame one flat colour that encodes its message's ordinal (frame_code_of)
    # bad recordings
    nan_state_at_s: float | None = None  # a NaN in the state message nearest this time (from the first stamp)
    out_of_order_at_s: float | None = None  # the state message nearest this time is stamped 30 ms earlier
    wrong_type_topic: str = ""  # this topic is written as std_msgs/String
    omit_topics: tuple[str, ...] = ()
    camera_dropout_s: tuple[float, float] | None = None  # (from, to): the first camera publishes nothing
    camera_stamp_offset_s: float = 0.0  # camera stamps from another clock (received on time all the same)

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {self.storage!r}")
        if self.transport not in ("raw", "compressed"):
            raise ValueError(f"transport must be raw or compressed, got {self.transport!r}")
        if self.command_type not in COMMAND_TYPES:
            raise ValueError(f"command_type must be one of {COMMAND_TYPES}, got {self.command_type!r}")
        if not self.episodes or any(d <= 0 for _, d in self.episodes):
            raise ValueError(f"episodes must be (task, seconds > 0) pairs, got {self.episodes!r}")
        if Path(self.out).exists():
            raise ValueError(f"output bag {self.out} already exists")


def camera_topic(name: str, transport: str = "raw") -> str:
    """Where sim_node publishes camera ``name`` (image_transport's name for the JPEG stream)."""
    return f"/{name}/image_raw" + ("/compressed" if transport == "compressed" else "")


def code_frame(k: int, cam: int, h: int, w: int) -> np.ndarray:
    """A flat frame that survives video coding: red and green encode ordinal k (0..899), blue the camera."""
    rgb = (8 + 8 * (k % 30), 8 + 8 * ((k // 30) % 30), 40 + 50 * (cam % 4))
    return np.broadcast_to(np.asarray(rgb, dtype=np.uint8), (h, w, 3)).copy()


def frame_code_of(rgb: np.ndarray) -> int:
    """The ordinal a (decoded) code_frame holds."""
    r, g = (float(np.median(rgb[..., c])) for c in (0, 1))
    return int(round((r - 8) / 8)) + 30 * int(round((g - 8) / 8))


def arm_state(t: float) -> np.ndarray:
    """float64 (4,): a smooth end-effector path and gripper opening at time t (s since the first stamp)."""
    k = np.arange(4)
    return 0.1 * np.sin(0.7 * t * (1 + 0.3 * k) + k) + 0.05 * k


class _Frames:
    """Cheap but JPEG-realistic frames: a textured background (fixed noise) and a square that moves."""

    def __init__(self, h: int, w: int, n: int, seed: int):
        rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        self.h, self.w = h, w
        self.base = []
        for i in range(n):
            tint = rng.uniform(0.5, 1.0, 3).astype(np.float32)
            bg = (0.3 + 0.4 * yy[..., None] / h + 0.1 * np.sin(xx[..., None] / 7.0 + i)) * tint * 255
            noise = rng.integers(-12, 13, size=(h, w, 3))
            self.base.append(np.clip(bg + noise, 0, 255).astype(np.uint8))

    def frame(self, cam: int, t: float) -> np.ndarray:
        img = self.base[cam].copy()
        s = max(2, min(self.h, self.w) // 6)
        cy = int((0.5 + 0.3 * math.sin(1.3 * t + cam)) * (self.h - s))
        cx = int((0.5 + 0.3 * math.cos(0.9 * t + cam)) * (self.w - s))
        img[cy:cy + s, cx:cx + s] = (200, 40 + 60 * cam, 40)
        return img


def write_synthetic_bag(cfg: SynthConfig) -> dict:
    """Write the bag; returns {"topics": {topic: count}, "episodes": [(start_ns, end_ns, task)]}."""
    ts = typestore()
    T = ts.types
    frames = _Frames(cfg.height, cfg.width, len(cfg.cameras), cfg.seed)
    rng = np.random.default_rng(cfg.seed + 1)
    t0 = cfg.start_s
    # the timeline: episodes back to back, each followed by settle_s of held streams and pause_s of silence
    spans, t = [], 0.0
    for task, dur in cfg.episodes:
        spans.append((t, t + dur, task))
        t += dur + cfg.settle_s + cfg.pause_s
    end = t - cfg.pause_s

    def live(x: float) -> bool:  # the streams publish (not in a pause)
        for a, b, _ in spans:
            if a <= x <= b + cfg.settle_s + 1e-9:
                return True
        return False

    def grid(hz: float, kind: str, idx: int = 0):
        n = int(math.floor(end * hz + 1e-9)) + 1
        return ((k / hz, kind, idx) for k in range(n) if live(k / hz))

    streams = [grid(cfg.camera_hz, "camera", i) for i in range(len(cfg.cameras))]
    streams += [grid(cfg.state_hz, "state"), grid(cfg.command_hz, "command")]
    streams.append(((a, "start", i) for i, (a, _, _) in enumerate(spans)))
    streams.append(((b, "end", i) for i, (_, b, _) in enumerate(spans)))
    events = heapq.merge(*streams, key=lambda e: (e[0], {"end": 0, "start": 1}.get(e[1], 2)))

    counts: dict[str, int] = {}
    nan_k = None if cfg.nan_state_at_s is None else round(cfg.nan_state_at_s * cfg.state_hz)
    ooo_k = None if cfg.out_of_order_at_s is None else round(cfg.out_of_order_at_s * cfg.state_hz)

    def stamp(x: float):
        ns = int(round((t0 + x) * 1e9))
        return T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9)

    def header(x: float, frame: str = ""):
        return T["std_msgs/msg/Header"](stamp=stamp(x), frame_id=frame)

    cam_count = [0] * len(cfg.cameras)
    with Writer(cfg.out, version=9, storage_plugin=STORAGES[cfg.storage]) as w:
        conns = {}

        def write(topic: str, msgtype: str, msg, x: float) -> None:
            if topic in cfg.omit_topics:
                return
            if topic == cfg.wrong_type_topic:
                msgtype, msg = "std_msgs/msg/String", T["std_msgs/msg/String"](data="not what the mapping wants")
            if topic not in conns:
                conns[topic] = w.add_connection(topic, msgtype, typestore=ts)
            recv = t0 + x + (cfg.latency_ms + float(rng.uniform(0.0, 1.0))) * 1e-3
            w.write(conns[topic], int(round(recv * 1e9)), ts.serialize_cdr(msg, msgtype))
            counts[topic] = counts.get(topic, 0) + 1

        for x, kind, i in events:
            if kind == "camera":
                if cfg.camera_dropout_s and i == 0 and cfg.camera_dropout_s[0] <= x < cfg.camera_dropout_s[1]:
                    continue
                rgb = (code_frame(cam_count[i], i, cfg.height, cfg.width) if cfg.frame_code
                       else frames.frame(i, x))
                cam_count[i] += 1
                topic = camera_topic(cfg.cameras[i], cfg.transport)
                if cfg.transport == "raw":
                    msg = T["sensor_msgs/msg/Image"](header=header(x + cfg.camera_stamp_offset_s, cfg.cameras[i]), height=cfg.height,
                                                     width=cfg.width, encoding="rgb8", is_bigendian=0,
                                                     step=cfg.width * 3, data=rgb.reshape(-1))
                    write(topic, "sensor_msgs/msg/Image", msg, x)
                else:
                    ok, jpg = cv2.imencode(".jpg", rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, cfg.jpeg_quality])
                    msg = T["sensor_msgs/msg/CompressedImage"](header=header(x + cfg.camera_stamp_offset_s,
                                                                             cfg.cameras[i]), format="jpeg",
                                                               data=jpg.reshape(-1))
                    write(topic, "sensor_msgs/msg/CompressedImage", msg, x)
            elif kind == "state":
                k = int(round(x * cfg.state_hz))
                q = arm_state(x)
                if nan_k is not None and k == nan_k:
                    q[1] = float("nan")
                xs = x - 0.03 if ooo_k is not None and k == ooo_k else x
                msg = T["sensor_msgs/msg/JointState"](header=header(xs), name=list(SIM_JOINTS), position=q,
                                                      velocity=np.zeros(0), effort=np.zeros(0))
                write("/joint_states", "sensor_msgs/msg/JointState", msg, x)
            elif kind == "command":
                q = arm_state(x + 1.0 / cfg.command_hz)  # the target one control period ahead
                write("/edgefm/command", *_command(T, cfg.command_type, q, header(x)), x)
            elif kind == "start":
                a, _, task = spans[i]
                text = TASK_TEXT.get(task, task)
                if cfg.instruction:
                    write("/instruction", "std_msgs/msg/String", T["std_msgs/msg/String"](data=text), x)
                if cfg.events:
                    ev = {"event": "start", "t": t0 + x, "episode": i, "task": task, "seed": 1000 + i,
                          "instruction": text}
                    write("/sim/events", "std_msgs/msg/String", T["std_msgs/msg/String"](data=json.dumps(ev)), x)
            elif kind == "end" and cfg.events:
                a, b, task = spans[i]
                ev = {"event": "success", "t": t0 + x, "episode": i, "task": task, "seed": 1000 + i,
                      "instruction": TASK_TEXT.get(task, task), "elapsed_s": b - a}
                write("/sim/events", "std_msgs/msg/String", T["std_msgs/msg/String"](data=json.dumps(ev)), x)
    ns = lambda x: int(round((t0 + x) * 1e9))  # noqa: E731
    return {"topics": counts, "episodes": [(ns(a), ns(b), TASK_TEXT.get(task, task)) for a, b, task in spans]}


def _command(T, kind: str, q: np.ndarray, header):
    if kind == "float64_multi_array":
        return "std_msgs/msg/Float64MultiArray", T["std_msgs/msg/Float64MultiArray"](
            layout=T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0), data=np.asarray(q, dtype=np.float64))
    if kind == "joint_state":
        return "sensor_msgs/msg/JointState", T["sensor_msgs/msg/JointState"](
            header=header, name=list(SIM_JOINTS), position=np.asarray(q, dtype=np.float64), velocity=np.zeros(0),
            effort=np.zeros(0))
    point = T["trajectory_msgs/msg/JointTrajectoryPoint"](
        positions=np.asarray(q, dtype=np.float64), velocities=np.zeros(0), accelerations=np.zeros(0),
        effort=np.zeros(0), time_from_start=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=50_000_000))
    return "trajectory_msgs/msg/JointTrajectory", T["trajectory_msgs/msg/JointTrajectory"](
        header=header, joint_names=list(SIM_JOINTS), points=[point])

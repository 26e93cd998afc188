"""ROS messages <-> edgefm_ros.types and numpy: stamps, images, chunks, route decisions (joint states: joints.py;
robot commands: commands.py)."""
from __future__ import annotations

import math

import numpy as np
from builtin_interfaces.msg import Time
from sensor_msgs.msg import CompressedImage, Image

from edgefm_ros.msg import ActionChunk as ActionChunkMsg
from edgefm_ros.msg import RouteDecision as RouteDecisionMsg
from edgefm_ros.sensors.camera import decode_compressed, image_to_rgb, rgb_to_image_fields, rgb_view
from edgefm_ros.sensors.observation import Frame
from edgefm_ros.types import ActionChunk, RouteDecision


def to_sec(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def to_stamp(t: float) -> Time:
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"time stamp must be a finite non-negative number of seconds, got {t!r}")
    ns = int(round(t * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def image_msg_to_rgb(msg: Image | CompressedImage) -> np.ndarray:
    """uint8 (H, W, 3) RGB from a raw or compressed image; ValueError when malformed."""
    if isinstance(msg, CompressedImage):
        return decode_compressed(msg.format, msg.data)
    return image_to_rgb(msg.encoding, msg.height, msg.width, msg.step, msg.data)


def msg_to_frame(msg: Image | CompressedImage, stamp: float) -> Frame:
    """A camera frame for the sensor cache: a raw image converted to RGB now, a compressed one kept as its
    bytes (decoded when used); ValueError when malformed or empty."""
    if isinstance(msg, CompressedImage):
        if len(msg.data) == 0:
            raise ValueError(f"compressed image ({msg.format!r}) holds no data")
        return Frame(stamp, compressed=bytes(msg.data), fmt=msg.format)
    return Frame(stamp, rgb=image_msg_to_rgb(msg))


def rgb_to_image_msg(rgb: np.ndarray, stamp: float, frame_id: str = "", encoding: str = "rgb8") -> Image:
    h, w, step, data = rgb_to_image_fields(rgb, encoding)
    msg = Image(height=h, width=w, encoding=encoding, is_bigendian=0, step=step, data=data)
    msg.header.stamp, msg.header.frame_id = to_stamp(stamp), frame_id
    return msg


def chunk_to_msg(chunk: ActionChunk) -> ActionChunkMsg:
    a = np.ascontiguousarray(chunk.actions, dtype=np.float32)  # (chunk, action_dim)
    msg = ActionChunkMsg(joint_names=list(chunk.joint_names), chunk_size=a.shape[0], action_dim=a.shape[1],
                         dt=float(chunk.dt), actions=a.reshape(-1), source=chunk.source, model=chunk.model,
                         inference_time=float(chunk.inference_s), prefill_time=float(chunk.prefill_s),
                         decode_time=float(chunk.decode_s), sequence=int(chunk.seq))
    msg.header.stamp = to_stamp(chunk.stamp)
    return msg


def msg_to_chunk(msg: ActionChunkMsg) -> ActionChunk:
    """ActionChunk from its message; ValueError when sizes disagree or values are not finite."""
    n, d = int(msg.chunk_size), int(msg.action_dim)
    a = np.asarray(msg.actions, dtype=np.float32)
    if n <= 0 or d <= 0 or a.size != n * d:
        raise ValueError(f"ActionChunk message holds {a.size} values for chunk_size {n} x action_dim {d}")
    return ActionChunk(actions=a.reshape(n, d), dt=float(msg.dt), stamp=to_sec(msg.header.stamp),
                       source=msg.source, model=msg.model, joint_names=tuple(msg.joint_names),
                       seq=int(msg.sequence), inference_s=float(msg.inference_time),
                       prefill_s=float(msg.prefill_time), decode_s=float(msg.decode_time))


def msg_to_route(msg: RouteDecisionMsg) -> RouteDecision:
    """The fields vla_node acts on (target, candidate, reason, stamp) plus the link and evidence."""
    return RouteDecision(target=msg.target, candidate=msg.candidate, reason=msg.reason,
                         stamp=to_sec(msg.header.stamp), feature_names=tuple(msg.feature_names),
                         features=tuple(float(x) for x in msg.features), guard_open=bool(msg.guard_active),
                         bandwidth_mbps=float(msg.bandwidth_mbps), rtt_s=float(msg.rtt_s),
                         params={"jpeg_quality": int(msg.jpeg_quality), "resolution": int(msg.resolution),
                                 "breaker_open": bool(msg.breaker_open)})


def image_view(msg: Image) -> np.ndarray:
    """uint8 (H, W, 3) RGB or (H, W) grey: a view of msg.data (no copy); ValueError when malformed."""
    return rgb_view(msg.encoding, int(msg.height), int(msg.width), int(msg.step), msg.data)


def compressed_view(msg: CompressedImage) -> memoryview:
    """The compressed bytes as a view of msg.data; ValueError when empty."""
    data = memoryview(msg.data).cast("B")
    if len(data) < 4:
        raise ValueError(f"compressed image ({msg.format!r}) holds only {len(data)} bytes")
    return data


def route_to_msg(d: RouteDecision, stamp) -> RouteDecisionMsg:
    """A router decision with its evidence (features, every candidate's prediction, the link) as a message."""
    m = RouteDecisionMsg(target=d.target, candidate=d.candidate, reason=d.reason,
                         feature_names=list(d.feature_names), features=[float(x) for x in d.features],
                         candidates=[p.name for p in d.predictions],
                         predicted_quality=[float(p.quality) for p in d.predictions],
                         predicted_latency=[float(p.latency_s) for p in d.predictions],
                         predicted_energy=[float(p.energy_j) for p in d.predictions],
                         guard_active=bool(d.guard_open), breaker_open=bool(d.params.get("breaker_open", False)),
                         bandwidth_mbps=float(d.bandwidth_mbps), rtt_s=float(d.rtt_s),
                         jpeg_quality=int(d.params.get("jpeg_quality", 0)),
                         resolution=int(d.params.get("resolution", 0)))
    m.header.stamp = stamp
    return m

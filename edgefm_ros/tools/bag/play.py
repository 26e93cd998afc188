"""``edgefm-bag play``: replay a rosbag2 bag into live topics, publishing the stored CDR bytes unchanged
(except, with ``restamp``, the header stamp: shifted so the bag's first message is "now") on the bag's
timeline, with a rate factor, looping and topic remapping.
"""
from __future__ import annotations

import importlib
import math
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from rosbags.interfaces import QosDurability
from rosbags.rosbag2 import Reader

from edgefm_ros.tools.bag.typestore import make_typestore

HEADER = ("header", "std_msgs/msg/Header")


@dataclass(frozen=True)
class PlayConfig:
    bag: str
    rate: float = 1.0
    loop: bool = False
    remap: Mapping[str, str] = field(default_factory=dict)  # bag topic -> live topic
    topics: tuple[str, ...] = ()  # bag topics to play; empty: all
    restamp: bool = True  # rewrite header stamps to the replay time
    start_offset_s: float = 0.0  # skip the bag's first seconds

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number, got {self.rate!r}")
        if self.start_offset_s < 0:
            raise ValueError(f"start_offset_s must be >= 0, got {self.start_offset_s!r}")


def parse_remap(items) -> dict[str, str]:
    """["/a:=/b", ...] -> {"/a": "/b"}; ValueError naming a malformed item."""
    out = {}
    for it in items or ():
        src, sep, dst = it.partition(":=")
        if not sep or not src or not dst:
            raise ValueError(f"remapping {it!r} must look like /from:=/to")
        out[src] = dst
    return out


def message_class(msgtype: str):
    """'pkg/msg/Name' -> the rclpy message class."""
    pkg, kind, name = msgtype.split("/")
    try:
        return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"message type {msgtype!r} is not available in this ROS environment: {e}") from e


def has_header(typestore, msgtype: str) -> bool:
    fields = typestore.fielddefs.get(msgtype, ((), ()))[1]
    return bool(fields) and fields[0][0] == HEADER[0] and fields[0][1][1] == HEADER[1]


def restamp_cdr(data: bytes, shift_ns: int) -> bytes:
    """CDR of a message whose first field is std_msgs/Header, with header.stamp moved by ``shift_ns``."""
    b = bytearray(data)
    fmt = "<iI" if b[1] & 1 else ">iI"  # encapsulation: 0x0001 little endian, 0x0000 big endian
    sec, nsec = struct.unpack_from(fmt, b, 4)
    t = sec * 1_000_000_000 + nsec + shift_ns
    if t < 0:
        t = 0
    struct.pack_into(fmt, b, 4, t // 1_000_000_000, t % 1_000_000_000)
    return bytes(b)


def _qos(conn):
    from edgefm_ros.ros import qos  # rclpy, once a bag plays: edgefm-bag's other commands run without ROS

    profiles = getattr(conn.ext, "offered_qos_profiles", None) or []
    latched = any(getattr(p, "durability", None) == QosDurability.TRANSIENT_LOCAL for p in profiles)
    return qos.LATCHED if latched else qos.RELIABLE


class Player:
    """Publishes a bag on its timeline from the calling thread (no spinning needed)."""

    def __init__(self, node, cfg: PlayConfig):
        self.node, self.cfg = node, cfg
        self.typestore = make_typestore()
        self.published = 0
        self.loops = 0
        with Reader(cfg.bag) as r:
            self.connections = [c for c in r.connections if not cfg.topics or c.topic in cfg.topics]
            self.start_ns, self.end_ns = r.start_time, r.end_time
        if not self.connections:
            raise ValueError(f"bag {cfg.bag} has none of the topics {list(cfg.topics)}")
        self._pubs = {}
        self._stamped = {}
        for c in self.connections:
            topic = cfg.remap.get(c.topic, c.topic)
            if c.topic not in self._pubs:
                self._pubs[c.topic] = node.create_publisher(message_class(c.msgtype), topic, _qos(c))
                self._stamped[c.topic] = cfg.restamp and has_header(self.typestore, c.msgtype)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9

    def play(self, stop: threading.Event | None = None) -> int:
        """Play once (or until ``stop``, looping when configured); returns messages published."""
        stop = stop or threading.Event()
        while not stop.is_set():
            self._play_once(stop)
            self.loops += 1
            if not self.cfg.loop:
                break
        return self.published

    def _play_once(self, stop: threading.Event) -> None:
        cfg = self.cfg
        first = self.start_ns + int(cfg.start_offset_s * 1e9)
        mono0 = time.monotonic()
        wall0_ns = time.time_ns()
        with Reader(cfg.bag) as r:
            for conn, t_ns, data in r.messages(connections=self.connections, start=first):
                offset = (t_ns - first) * 1e-9 / cfg.rate
                delay = mono0 + offset - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
                if stop.is_set() or not self.node.context.ok():
                    return
                if self._stamped[conn.topic]:
                    # the bag's time t maps to wall0 + (t - first) / rate
                    data = restamp_cdr(data, wall0_ns + int((t_ns - first) / cfg.rate) - t_ns)
                self._pubs[conn.topic].publish(bytes(data))
                self.published += 1

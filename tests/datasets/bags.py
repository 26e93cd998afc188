"""Small real rosbag2 bags (rosbags' writer, sqlite3 or MCAP) of this package's topics for the converter's
tests, and an independent reading of what the dataset should hold."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from edgefm_ros.datasets.synthbag import SynthConfig, write_synthetic_bag

SMALL = dict(height=24, width=32, episodes=(("reach", 1.2), ("push", 1.0)))


def make_bag(tmp_path: Path, name: str = "rec", **kw) -> Path:
    out = tmp_path / name
    write_synthetic_bag(SynthConfig(str(out), **{**SMALL, **kw}))
    return out


def header_stamps(bag: Path, topic: str) -> np.ndarray:
    """int64 header stamps of a topic's messages in recorded order (read without the converter's code)."""
    ts = get_typestore(Stores.ROS2_JAZZY)
    out = []
    with Reader(bag) as r:
        conns = [c for c in r.connections if c.topic == topic]
        for c, _, raw in r.messages(connections=conns):
            h = ts.deserialize_cdr(raw, c.msgtype).header.stamp
            out.append(h.sec * 10**9 + h.nanosec)
    return np.asarray(out, dtype=np.int64)


def expected_index(stamps: np.ndarray, tick: int, start: int, max_age_ns: int) -> int:
    """The rule spelled out: the last message with start <= stamp <= tick, if at most max_age old; else -1."""
    best = -1
    for i, s in enumerate(stamps):
        if start <= s <= tick:
            best = i
    if best >= 0 and tick - stamps[best] > max_age_ns:
        return -1
    return best


def parquet_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet"))

"""Reading a rosbag2 bag (sqlite3 or MCAP, with ``rosbags``) for a conversion: the first pass.

``scan_bag`` reads every message of the mapped topics once and keeps what the synchronisation needs: each
stream's message times, the state/action vectors, the texts of the instruction and event topics, and for a
camera only its message times (a frame is decoded later, and only when a tick uses it; see ``frames``).
Every check of a bad recording that needs no pixels happens here, each raising ``RecordingError`` with the
bag, the topic and the time: a missing topic, a wrong message type, stamps out of order, a truncated bag, a
non-finite state or action, a joint missing from a message.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from .errors import RecordingError
from .mapping import CameraSource, DatasetMapping, VectorSource

JOINT_STATE = "sensor_msgs/msg/JointState"
TRAJECTORY = "trajectory_msgs/msg/JointTrajectory"
F64_ARRAY = "std_msgs/msg/Float64MultiArray"
F32_ARRAY = "std_msgs/msg/Float32MultiArray"
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
STRING = "std_msgs/msg/String"
VECTOR_TYPES = (JOINT_STATE, TRAJECTORY, F64_ARRAY, F32_ARRAY)
IMAGE_TYPES = (IMAGE, COMPRESSED)
TEXT_TYPES = (STRING,)
HEADER_TYPES = (JOINT_STATE, TRAJECTORY, IMAGE, COMPRESSED)  # the first field is a std_msgs/Header

_TYPESTORE = None


def typestore():
    global _TYPESTORE
    if _TYPESTORE is None:
        _TYPESTORE = get_typestore(Stores.ROS2_JAZZY)
    return _TYPESTORE


def header_stamp_ns(raw: bytes | memoryview) -> int:
    """header.stamp of a serialized (CDR) message whose first field is a std_msgs/Header, without
    deserializing the rest (an image's pixels): the 4-byte encapsulation, then sec (int32), nanosec (uint32)."""
    if len(raw) < 12:
        raise ValueError(f"a {len(raw)}-byte message is too short to hold a header")
    fmt = "<iI" if raw[1] == 1 else ">iI"
    sec, nsec = struct.unpack_from(fmt, raw, 4)
    return sec * 1_000_000_000 + nsec


@dataclass
class Stream:
    """One topic's messages, in recorded order (times non-decreasing)."""

    topic: str
    msgtype: str
    times: np.ndarray  # int64 [n] ns: header.stamp (clock 'header', types with a header) or receive time
    clock: str  # 'header' | 'bag': where ``times`` came from
    values: np.ndarray | None = None  # float64 [n, d]: state / action vectors
    names: tuple[str, ...] = ()  # the vector's dimension names
    texts: list[str] | None = None  # instruction / events
    bag_times: np.ndarray | None = None  # int64 [n] receive times (texts: events may carry their own)


@dataclass
class BagScan:
    path: str
    start_ns: int  # the bag's first receive time
    end_ns: int
    storage: str
    state: Stream
    action: Stream
    cameras: dict[str, Stream]  # camera key -> its stream (times only)
    instruction: Stream | None = None
    events: Stream | None = None
    counts: dict[str, int] = field(default_factory=dict)


def open_reader(path: str | Path) -> Reader:
    """An open rosbags Reader; a bag that cannot be opened is a RecordingError naming it."""
    p = Path(path)
    if not p.exists():
        raise RecordingError(str(p), None, None, "no such bag")
    if p.is_file():
        raise RecordingError(str(p), None, None, "expected a rosbag2 bag directory (with metadata.yaml), got a file")
    if not (p / "metadata.yaml").is_file():
        raise RecordingError(str(p), None, None, "metadata.yaml is missing: the recording did not finish "
                                                 "(a truncated bag); nothing to convert")
    try:
        r = Reader(p)
        r.open()
    except Exception as e:  # rosbags' ReaderError, sqlite/mcap decoding errors
        raise RecordingError(str(p), None, None, f"the bag is truncated or corrupt: {e}") from None
    return r


def _vector_extractor(src: VectorSource, msgtype: str) -> Callable:
    """msg -> (names, values) for the mapped vector type."""
    if msgtype == JOINT_STATE:
        return lambda m: (m.name, getattr(m, src.field))
    if msgtype == TRAJECTORY:
        def traj(m):
            if len(m.points) == 0:
                raise ValueError("JointTrajectory without points")
            return m.joint_names, m.points[0].positions
        return traj
    return lambda m: (None, m.data)


class _VectorReader:
    """Picks the mapped joints of each message, caching the index per name list."""

    def __init__(self, src: VectorSource, msgtype: str):
        self.src, self.extract = src, _vector_extractor(src, msgtype)
        self.names: tuple[str, ...] = src.joints
        self._index: dict[tuple, np.ndarray] = {}

    def __call__(self, msg) -> np.ndarray:
        names, values = self.extract(msg)
        values = np.asarray(values, dtype=np.float64)
        if names is None:  # a multi-array: values in order, joints only label them
            if not self.names:
                self.names = tuple(f"{self.src.topic.strip('/').replace('/', '.')}[{i}]" for i in range(len(values)))
            if len(values) != len(self.names):
                raise ValueError(f"{len(values)} values, expected {len(self.names)} ({list(self.names)})")
            return values
        names = tuple(names)
        if len(names) != len(values):
            raise ValueError(f"{len(names)} names but {len(values)} {self.src.field} values")
        if not self.names:
            self.names = names
        idx = self._index.get(names)
        if idx is None:
            missing = [j for j in self.names if j not in names]
            if missing:
                raise ValueError(f"joint(s) {missing} not in the message (its joints: {list(names)})")
            idx = self._index[names] = np.array([names.index(j) for j in self.names], dtype=np.int64)
        return values[idx]


def _check_type(bag: str, topic: str, msgtype: str, allowed: tuple[str, ...], role: str, t0: int | None) -> None:
    if msgtype not in allowed:
        raise RecordingError(bag, topic, t0, f"wrong message type {msgtype} for the {role} "
                                             f"(expected {' or '.join(allowed)})")


def scan_bag(path: str | Path, mapping: DatasetMapping,
             progress: Callable[[int, int], None] | None = None) -> BagScan:
    """Read the mapped topics of one bag (see the module docstring); ``progress(done, total)`` messages."""
    bag = str(path)
    reader = open_reader(path)
    try:
        return _scan(reader, bag, mapping, progress)
    finally:
        reader.close()


def _scan(reader: Reader, bag: str, mapping: DatasetMapping, progress) -> BagScan:
    ts = typestore()
    start = int(reader.start_time) if reader.message_count else 0
    conns = {}
    for c in reader.connections:
        conns.setdefault(c.topic, c)
    roles: dict[str, tuple[str, object]] = {}  # topic -> (role, source)
    required = [("observation.state", mapping.state, VECTOR_TYPES), ("action", mapping.action, VECTOR_TYPES)]
    required += [(c.key, c, IMAGE_TYPES) for c in mapping.cameras]
    types: dict[str, set[str]] = {}
    for c in reader.connections:
        types.setdefault(c.topic, set()).add(c.msgtype)
    for role, src, allowed in required:
        if src.topic not in conns:
            raise RecordingError(bag, src.topic, None, f"topic missing (mapped to {role}); the bag has "
                                                       f"{sorted(conns)}")
        for msgtype in sorted(types[src.topic]):  # every connection of the topic (a topic may have several)
            _check_type(bag, src.topic, msgtype, allowed, role, None)
        if len(types[src.topic]) > 1:
            raise RecordingError(bag, src.topic, None, f"recorded with several types {sorted(types[src.topic])}")
        roles[src.topic] = (role, src)
    for role, topic in (("instruction", mapping.instruction), ("events", mapping.events)):
        if topic and topic in conns:
            for msgtype in sorted(types[topic]):
                _check_type(bag, topic, msgtype, TEXT_TYPES, role, None)
            roles[topic] = (role, topic)
    wanted = [c for c in reader.connections if c.topic in roles]
    total = sum(c.msgcount for c in wanted)

    times: dict[str, list[int]] = {t: [] for t in roles}
    bag_times: dict[str, list[int]] = {t: [] for t in roles}
    vectors: dict[str, list[np.ndarray]] = {}
    texts: dict[str, list[str]] = {}
    vreaders: dict[str, _VectorReader] = {}
    clocks: dict[str, str] = {}
    for topic, (role, src) in roles.items():
        msgtype = conns[topic].msgtype
        clocks[topic] = "header" if mapping.clock == "header" and msgtype in HEADER_TYPES else "bag"
        if isinstance(src, VectorSource):
            vreaders[topic] = _VectorReader(src, msgtype)
            vectors[topic] = []
        elif not isinstance(src, CameraSource):
            texts[topic] = []

    done, last_topic, last_t = 0, None, None
    it: Iterator = reader.messages(connections=wanted)
    while True:
        try:
            item = next(it)
        except StopIteration:
            break
        except Exception as e:  # a chunk or page that cannot be read: the file ends early or is damaged
            raise RecordingError(bag, last_topic, last_t, f"the bag is truncated or corrupt after this message: "
                                                          f"{e}", start) from None
        conn, t_bag, raw = item
        topic = conn.topic
        role, src = roles[topic]
        try:
            if clocks[topic] == "header":
                t = header_stamp_ns(raw)
                if t == 0:
                    raise ValueError("header.stamp is zero (an unstamped message; use clock: bag)")
            else:
                t = int(t_bag)
            prev = times[topic][-1] if times[topic] else None
            if prev is not None and t < prev:
                raise RecordingError(bag, topic, t, f"stamps out of order: {(prev - t) * 1e-6:.3f} ms before the "
                                                    f"previous message's", start)
            if topic in vreaders:
                v = vreaders[topic](ts.deserialize_cdr(raw, conn.msgtype))
                if not np.isfinite(v).all():
                    bad = [n for n, x in zip(vreaders[topic].names, v) if not np.isfinite(x)]
                    raise ValueError(f"non-finite {role} value(s) {bad}: {v.tolist()}")
                vectors[topic].append(v)
            elif topic in texts:
                texts[topic].append(str(ts.deserialize_cdr(raw, conn.msgtype).data))
        except RecordingError:
            raise
        except Exception as e:
            raise RecordingError(bag, topic, t_bag if clocks[topic] == "bag" else _safe_stamp(raw, t_bag),
                                 f"{role}: {e}", start) from None
        times[topic].append(t)
        bag_times[topic].append(int(t_bag))
        last_topic, last_t = topic, t
        done += 1
        if progress is not None and done % 2000 == 0:
            progress(done, total)
    if progress is not None:
        progress(done, total)
    counts = {t: len(v) for t, v in times.items()}
    for c in wanted:  # the metadata's counts: fewer messages read means the file ended early
        if c.msgcount and counts[c.topic] < c.msgcount:
            raise RecordingError(bag, c.topic, last_t, f"truncated: {counts[c.topic]} of the {c.msgcount} "
                                                       f"messages in metadata.yaml could be read", start)

    def stream(topic: str) -> Stream:
        s = Stream(topic, conns[topic].msgtype, np.asarray(times[topic], dtype=np.int64), clocks[topic],
                   bag_times=np.asarray(bag_times[topic], dtype=np.int64))
        if topic in vreaders:
            d = len(vreaders[topic].names)
            s.values = np.asarray(vectors[topic], dtype=np.float64).reshape(-1, d)
            s.names = vreaders[topic].names
        if topic in texts:
            s.texts = texts[topic]
        return s

    for role, src, _ in required:
        if counts[src.topic] == 0:
            raise RecordingError(bag, src.topic, None, f"no messages (mapped to {role})")
    return BagScan(
        path=bag, start_ns=start, end_ns=int(reader.end_time) if reader.message_count else 0,
        storage="mcap" if any(f.suffix == ".mcap" for f in Path(bag).iterdir()) else "sqlite3",
        state=stream(mapping.state.topic), action=stream(mapping.action.topic),
        cameras={c.key: stream(c.topic) for c in mapping.cameras},
        instruction=stream(mapping.instruction) if mapping.instruction in roles else None,
        events=stream(mapping.events) if mapping.events in roles else None, counts=counts)


def _safe_stamp(raw, fallback: int) -> int:
    try:
        return header_stamp_ns(raw) or int(fallback)
    except Exception:
        return int(fallback)


def iter_camera_messages(path: str | Path, topics: list[str]) -> Iterator[tuple[str, int, str, bytes]]:
    """Second pass: (topic, ordinal within the topic, msgtype, raw CDR) of the camera topics, in recorded
    order."""
    reader = open_reader(path)
    try:
        wanted = [c for c in reader.connections if c.topic in set(topics)]
        seen: dict[str, int] = {}
        for conn, _t, raw in reader.messages(connections=wanted):
            k = seen.get(conn.topic, 0)
            seen[conn.topic] = k + 1
            yield conn.topic, k, conn.msgtype, raw
    finally:
        reader.close()

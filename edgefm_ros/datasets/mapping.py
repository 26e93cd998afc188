"""Which topics feed which dataset feature: the mapping of a conversion (defaults: this package's own topics).

A small YAML file gives any of these keys (the rest keep their defaults)::

    fps: 20                      # dataset frame rate (the command line's --fps wins)
    clock: header                # message time: header (header.stamp where the type has one) | bag (receive time)
    max_age_s: 0.1               # a stream's sample may be at most this old at a tick (per stream below too)
    gap_s: 1.0                   # a pause this long in the state stream ends an episode (when no events)
    robot_type: metaworld_sawyer_ee
    task: ""                     # task text where the bag has no instruction
    instruction: /instruction    # std_msgs/String; "" for none
    events: /sim/events          # std_msgs/String JSON episode events; "" for none
    state:  {topic: /joint_states, joints: [ee_x, ee_y, ee_z, gripper], field: position, max_age_s: 0.1}
    action: {topic: /edgefm/command, joints: [ee_x, ee_y, ee_z, gripper]}
    cameras:
      scene: /scene/image_raw                 # key (observation.images. is added) -> topic
      wrist: {topic: /wrist/image_raw, max_age_s: 0.1}

``joints`` picks and orders values by name (JointState names, JointTrajectory joint_names); empty takes every
value in the first message's order. Float64MultiArray has no names: ``joints`` then only labels the values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

CAMERA_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
CLOCKS = ("header", "bag")
VECTOR_FIELDS = ("position", "velocity", "effort")
SIM_JOINTS = ("ee_x", "ee_y", "ee_z", "gripper")


def camera_key(name: str) -> str:
    """'scene' -> 'observation.images.scene' (a full key is kept)."""
    name = str(name).strip()
    if not name or name == CAMERA_PREFIX.rstrip("."):
        raise ValueError(f"camera key must be a name, got {name!r}")
    return name if name.startswith(CAMERA_PREFIX) else CAMERA_PREFIX + name


def _topic(t: str, what: str, optional: bool = False) -> str:
    t = str(t or "").strip()
    if not t:
        if optional:
            return ""
        raise ValueError(f"{what}: a topic name is required")
    return t if t.startswith("/") else "/" + t


def _age(v, what: str) -> float | None:
    if v is None:
        return None
    v = float(v)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{what} max_age_s must be a positive number of seconds, got {v!r}")
    return v


@dataclass(frozen=True)
class VectorSource:
    """observation.state or action: a topic and the joint names taken from it, in order."""

    topic: str
    joints: tuple[str, ...] = ()
    field: str = "position"  # JointState's field
    max_age_s: float | None = None  # None: the mapping's

    def __post_init__(self) -> None:
        object.__setattr__(self, "topic", _topic(self.topic, "vector source"))
        object.__setattr__(self, "joints", tuple(str(j) for j in self.joints))
        if len(set(self.joints)) != len(self.joints):
            raise ValueError(f"{self.topic}: joint names repeat: {list(self.joints)}")
        if self.field not in VECTOR_FIELDS:
            raise ValueError(f"{self.topic}: field must be one of {VECTOR_FIELDS}, got {self.field!r}")
        _age(self.max_age_s, self.topic)


@dataclass(frozen=True)
class CameraSource:
    key: str  # observation.images.<name>
    topic: str
    max_age_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", camera_key(self.key))
        object.__setattr__(self, "topic", _topic(self.topic, f"camera {self.key}"))
        _age(self.max_age_s, self.topic)


@dataclass(frozen=True)
class DatasetMapping:
    state: VectorSource = VectorSource("/joint_states", SIM_JOINTS)
    action: VectorSource = VectorSource("/edgefm/command", SIM_JOINTS)
    cameras: tuple[CameraSource, ...] = (CameraSource("scene", "/scene/image_raw"),
                                         CameraSource("wrist", "/wrist/image_raw"))
    instruction: str = "/instruction"
    events: str = "/sim/events"
    task: str = ""
    clock: str = "header"
    max_age_s: float = 0.1
    gap_s: float = 1.0
    robot_type: str = "metaworld_sawyer_ee"
    fps: float | None = None  # from a YAML file; the caller decides what wins

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", tuple(self.cameras))
        object.__setattr__(self, "instruction", _topic(self.instruction, "instruction", optional=True))
        object.__setattr__(self, "events", _topic(self.events, "events", optional=True))
        if not self.cameras:
            raise ValueError("mapping: at least one camera is required")
        keys = [c.key for c in self.cameras]
        if len(set(keys)) != len(keys):
            raise ValueError(f"mapping: camera keys repeat: {keys}")
        topics = [c.topic for c in self.cameras] + [self.state.topic, self.action.topic]
        if len(set(topics)) != len(topics):
            raise ValueError(f"mapping: a topic feeds two features: {topics}")
        if self.clock not in CLOCKS:
            raise ValueError(f"mapping: clock must be one of {CLOCKS}, got {self.clock!r}")
        _age(self.max_age_s, "mapping")
        if not (self.gap_s > 0 and math.isfinite(self.gap_s)):
            raise ValueError(f"mapping: gap_s must be a positive number of seconds, got {self.gap_s!r}")
        if self.fps is not None and not (self.fps > 0 and math.isfinite(self.fps)):
            raise ValueError(f"mapping: fps must be positive, got {self.fps!r}")

    def age_s(self, source: VectorSource | CameraSource) -> float:
        return source.max_age_s if source.max_age_s is not None else self.max_age_s

    def as_dict(self) -> dict:
        """The YAML form (what ``mapping_from_dict`` reads back)."""
        vec = lambda v: {"topic": v.topic, "joints": list(v.joints), "field": v.field,  # noqa: E731
                         **({"max_age_s": v.max_age_s} if v.max_age_s is not None else {})}
        cams = {c.key.removeprefix(CAMERA_PREFIX): ({"topic": c.topic, "max_age_s": c.max_age_s}
                                                    if c.max_age_s is not None else c.topic) for c in self.cameras}
        d = {"clock": self.clock, "max_age_s": self.max_age_s, "gap_s": self.gap_s, "robot_type": self.robot_type,
             "task": self.task, "instruction": self.instruction, "events": self.events,
             "state": vec(self.state), "action": vec(self.action), "cameras": cams}
        if self.fps is not None:
            d["fps"] = self.fps
        return d


KEYS = ("fps", "clock", "max_age_s", "gap_s", "robot_type", "task", "instruction", "events", "state", "action",
        "cameras")


def _vector(d, what: str, base: VectorSource) -> VectorSource:
    if isinstance(d, str):
        return VectorSource(d, (), base.field)
    if not isinstance(d, dict):
        raise ValueError(f"mapping {what}: expected a topic or a mapping, got {d!r}")
    unknown = sorted(set(d) - {"topic", "joints", "field", "max_age_s"})
    if unknown:
        raise ValueError(f"mapping {what}: unknown key(s) {unknown} (known: topic, joints, field, max_age_s)")
    joints = d.get("joints", base.joints if "topic" not in d else ())
    if isinstance(joints, str):
        joints = [j for j in joints.replace(",", " ").split() if j]
    return VectorSource(d.get("topic", base.topic), tuple(joints or ()), d.get("field", base.field),
                        d.get("max_age_s"))


def _cameras(d) -> tuple[CameraSource, ...]:
    if not isinstance(d, dict) or not d:
        raise ValueError(f"mapping cameras: expected a non-empty mapping of key -> topic, got {d!r}")
    out = []
    for key, v in d.items():
        if isinstance(v, str):
            out.append(CameraSource(key, v))
        elif isinstance(v, dict):
            unknown = sorted(set(v) - {"topic", "max_age_s"})
            if unknown:
                raise ValueError(f"mapping cameras.{key}: unknown key(s) {unknown} (known: topic, max_age_s)")
            out.append(CameraSource(key, v.get("topic", ""), v.get("max_age_s")))
        else:
            raise ValueError(f"mapping cameras.{key}: expected a topic or a mapping, got {v!r}")
    return tuple(out)


def mapping_from_dict(d: dict, base: DatasetMapping | None = None) -> DatasetMapping:
    base = base or DatasetMapping()
    if not isinstance(d, dict):
        raise ValueError(f"mapping: expected a mapping at the top level, got {type(d).__name__}")
    unknown = sorted(set(d) - set(KEYS))
    if unknown:
        raise ValueError(f"mapping: unknown key(s) {unknown} (known: {', '.join(KEYS)})")
    kw = {}
    for k in ("clock", "robot_type", "task", "instruction", "events"):
        if k in d:
            kw[k] = "" if d[k] is None else str(d[k])
    for k in ("max_age_s", "gap_s", "fps"):
        if k in d:
            try:
                kw[k] = float(d[k])
            except (TypeError, ValueError):
                raise ValueError(f"mapping {k}: expected a number, got {d[k]!r}") from None
    if "state" in d:
        kw["state"] = _vector(d["state"], "state", base.state)
    if "action" in d:
        kw["action"] = _vector(d["action"], "action", base.action)
    if "cameras" in d:
        kw["cameras"] = _cameras(d["cameras"])
    return replace(base, **kw)


def load_mapping(path: str | Path, base: DatasetMapping | None = None) -> DatasetMapping:
    """The mapping in a YAML file over ``base`` (default: this package's topics)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"mapping file {p} does not exist")
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"mapping file {p}: not valid YAML: {e}") from None
    try:
        return mapping_from_dict(d, base)
    except ValueError as e:
        raise ValueError(f"mapping file {p}: {e}") from None


def parse_camera_arg(arg: str) -> CameraSource:
    """'KEY=TOPIC' (the command line's --camera)."""
    key, sep, topic = arg.partition("=")
    if not sep or not key.strip() or not topic.strip():
        raise ValueError(f"--camera expects KEY=TOPIC, got {arg!r}")
    return CameraSource(key.strip(), topic.strip())

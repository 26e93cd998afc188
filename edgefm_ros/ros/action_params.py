"""action_node parameters: declared once here (specs), read once into ``ActionNodeConfig``."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from edgefm_ros.control.aggregate import AGGREGATE_FUNCTIONS
from edgefm_ros.ros.params import ParamSpec, validate

NODE_NAME = "action_node"
COMMAND_TYPES = ("joint_trajectory", "float64_multi_array", "joint_state")

PARAMS = (
    ParamSpec("control_rate_hz", "float", 50.0, "Rate at which one action is published.", range=(1.0, 1000.0)),
    ParamSpec("joint_names", "str[]", (), "Command joint order; chunk columns are mapped by name. Empty: the "
              "first chunk's joint names."),
    ParamSpec("command_type", "str", "joint_trajectory", "Command message: trajectory_msgs/JointTrajectory, "
              "std_msgs/Float64MultiArray (ros2_control forward controllers) or sensor_msgs/JointState.",
              choices=COMMAND_TYPES),
    ParamSpec("command_topic", "str", "edgefm/command", "Command output topic."),
    ParamSpec("aggregate", "str", "weighted_average", "How an arriving chunk merges with queued actions "
              "(LeRobot's functions; rtc: the new chunk replaces the queue from the first unexecuted tick, for "
              "vla_node's rtc_enabled).", choices=tuple(sorted(AGGREGATE_FUNCTIONS))),
    ParamSpec("chunk_size_threshold", "float", 0.5, "Request a chunk when queue/chunk falls below this "
              "(1.0: infer continuously).", range=(0.0, 1.0)),
    ParamSpec("chunk_topic", "str", "edgefm/action_chunk", "Input: edgefm_ros/ActionChunk."),
    ParamSpec("queue_status_topic", "str", "edgefm/queue_status", "Output: edgefm_ros/QueueStatus, every tick."),
    ParamSpec("episode_start_topic", "str", "edgefm/episode_start", "Input: std_msgs/Header at each new episode "
              "(e.g. sim_node's reset): the queue and the held position are dropped and chunks observed before "
              "header.stamp are discarded; empty: no subscription."),
    ParamSpec("producer_timeout_s", "float", 2.0, "No chunk for this long while holding is reported as a "
              "lost producer (vla_node down).", range=(0.01, 3600.0)),
    ParamSpec("spin_s", "float", 0.0, "Busy-wait this long before each tick deadline (0: sleep only).",
              range=(0.0, 0.01)),
    ParamSpec("realtime_priority", "int", 0, "SCHED_FIFO priority of the control thread (0: normal "
              "scheduling; needs CAP_SYS_NICE).", range=(0, 99)),
    ParamSpec("diagnostics_period_s", "float", 1.0, "Period of /diagnostics.", range=(0.05, 60.0)),
    ParamSpec("autostart", "bool", False, "Configure and activate on start (no lifecycle manager needed)."),
)


@dataclass(frozen=True)
class ActionNodeConfig:
    control_rate_hz: float
    joint_names: tuple[str, ...]
    command_type: str
    command_topic: str
    aggregate: str
    chunk_size_threshold: float
    chunk_topic: str
    queue_status_topic: str
    episode_start_topic: str
    producer_timeout_s: float
    spin_s: float
    realtime_priority: int
    diagnostics_period_s: float
    autostart: bool

    def __post_init__(self) -> None:
        if not (self.control_rate_hz > 0 and math.isfinite(self.control_rate_hz)):
            raise ValueError(f"control_rate_hz must be a positive number, got {self.control_rate_hz!r}")
        if self.spin_s >= self.period:
            raise ValueError(f"spin_s {self.spin_s} must be shorter than the control period {self.period}")
        if len(set(self.joint_names)) != len(self.joint_names):
            raise ValueError(f"joint_names {list(self.joint_names)} holds duplicates")
        if self.command_type not in COMMAND_TYPES:
            raise ValueError(f"command_type {self.command_type!r}: choose from {list(COMMAND_TYPES)}")

    @property
    def period(self) -> float:
        return 1.0 / self.control_rate_hz


def make_config(values: Mapping[str, Any]) -> ActionNodeConfig:
    v = validate(PARAMS, values)
    return ActionNodeConfig(**{f.name: v[f.name] for f in fields(ActionNodeConfig)})

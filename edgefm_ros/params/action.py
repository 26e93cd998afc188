"""action_node's parameters (the control loop)."""
from __future__ import annotations

import math

from edgefm_ros.control.aggregate import AGGREGATE_FUNCTIONS
from edgefm_ros.params import topics
from edgefm_ros.params.spec import NodeConfig, param

COMMAND_TYPES = ("joint_trajectory", "float64_multi_array", "joint_state")


class ActionNodeConfig(NodeConfig, node="action_node"):
    control_rate_hz: float = param(50.0, "Rate at which one action is published.", range=(1.0, 1000.0))
    joint_names: tuple[str, ...] = param((), "Command joint order; chunk columns are mapped by name. Empty: the "
                                         "first chunk's joint names.")
    command_type: str = param("joint_trajectory", "Command message: trajectory_msgs/JointTrajectory, "
                              "std_msgs/Float64MultiArray (ros2_control forward controllers) or "
                              "sensor_msgs/JointState.", choices=COMMAND_TYPES)
    command_topic: str = param(topics.COMMAND, "Command output topic (the robot controller's input).")
    aggregate: str = param("weighted_average", "How an arriving chunk merges with queued actions (LeRobot's "
                           "functions; rtc: the new chunk replaces the queue from the first unexecuted tick, for "
                           "vla_node's rtc_enabled).", choices=tuple(sorted(AGGREGATE_FUNCTIONS)))
    chunk_size_threshold: float = param(0.5, "Request a chunk when queue/chunk falls below this (1.0: infer "
                                        "continuously).", range=(0.0, 1.0))
    chunk_topic: str = param(topics.ACTION_CHUNK, "Input: edgefm_ros/ActionChunk.")
    queue_status_topic: str = param(topics.QUEUE_STATUS, "Output: edgefm_ros/QueueStatus, every tick.")
    episode_start_topic: str = param(topics.EPISODE_START, "Input: std_msgs/Header at each new episode (e.g. "
                                     "sim_node's reset): the queue and the held position are dropped and chunks "
                                     "observed before header.stamp are discarded; empty: no subscription.")
    producer_timeout_s: float = param(2.0, "No chunk for this long while holding is reported as a lost producer "
                                      "(vla_node down).", range=(0.01, 3600.0))
    spin_s: float = param(0.0, "Busy-wait this long before each tick deadline (0: sleep only).", range=(0.0, 0.01))
    realtime_priority: int = param(0, "SCHED_FIFO priority of the control thread (0: normal scheduling; needs "
                                   "CAP_SYS_NICE).", range=(0, 99))

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

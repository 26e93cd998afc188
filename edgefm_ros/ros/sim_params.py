"""sim_node parameters: declared once here (specs), read once into ``SimNodeConfig``."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from edgefm_ros.ros.action_params import COMMAND_TYPES
from edgefm_ros.ros.params import ParamSpec, validate

NODE_NAME = "sim_node"
JOINTS = ("ee_x", "ee_y", "ee_z", "gripper")  # the simulated arm's state and command order

PARAMS = (
    ParamSpec("episodes", "str[]", (), "Episodes to run, in order, each 'task:seed' (tasks: edgefm_ros.sim.tasks."
              "TASKS). Empty: every task once on its first evaluation seed."),
    ParamSpec("repeat", "bool", False, "Start over after the last episode (live demos); false: hold and publish "
              "a 'done' event."),
    ParamSpec("timeout_s", "float", 0.0, "Episode time limit (wall = simulated seconds); 0: the task's "
              "max_seconds.", range=(0.0, 3600.0)),
    ParamSpec("settle_s", "float", 0.5, "Seconds the arm holds after an episode ends, before the next one "
              "starts.", range=(0.0, 60.0)),
    ParamSpec("start_delay_s", "float", 0.0, "Seconds to hold before the first episode (e.g. while the model "
              "warms up).", range=(0.0, 600.0)),
    ParamSpec("command_guard_s", "float", 0.05, "Commands stamped less than this after an episode start are "
              "ignored: action_node may still command from the old episode until the episode_start message "
              "reaches it (the new episode's first chunk needs a render and an inference first).",
              range=(0.0, 1.0)),
    ParamSpec("wait_for_start", "bool", False, "Hold before the first episode until a message arrives on "
              "reset_topic (a harness starts the episodes once the policy is up)."),
    ParamSpec("conditions", "str", "clean", "Camera condition set, drawn per episode from its seed and applied "
              "to the published images (edgefm_ros.sim.conditions: clean, degraded, mixed).",
              choices=("clean", "degraded", "mixed")),
    ParamSpec("phrasings", "str", "canonical", "Instruction per episode: the task's canonical wording, or "
              "varied (drawn from the seed; evaluation seeds include held-out wordings).",
              choices=("canonical", "varied")),
    ParamSpec("image_height", "int", 0, "Camera image height; 0: the simulator's default.", range=(0, 1024)),
    ParamSpec("image_width", "int", 0, "Camera image width; 0: the simulator's default.", range=(0, 1024)),
    ParamSpec("camera_names", "str[]", ("scene", "wrist"), "Simulator cameras to publish, same order as "
              "camera_topics."),
    ParamSpec("camera_topics", "str[]", ("/scene/image_raw", "/wrist/image_raw"), "sensor_msgs/Image (rgb8) "
              "topic per camera."),
    ParamSpec("publish_compressed", "bool", False, "Also publish each camera as JPEG sensor_msgs/CompressedImage "
              "on <topic>/compressed."),
    ParamSpec("camera_rate_hz", "float", 30.0, "Camera publishing rate.", range=(1.0, 120.0)),
    ParamSpec("state_rate_hz", "float", 100.0, "JointState publishing rate; also the physics loop's wake-up "
              "rate.", range=(10.0, 1000.0)),
    ParamSpec("joint_states_topic", "str", "/joint_states", "Output: sensor_msgs/JointState (ee_x, ee_y, ee_z, "
              "gripper)."),
    ParamSpec("ground_truth_topic", "str", "", "Output (privileged: for scripted operators and tests, never a "
              "policy's input): sensor_msgs/JointState of the simulator's full state, Meta-World's observation "
              "(hand, gripper, object poses, goal; names: edgefm_ros.sim.teleop.GROUND_TRUTH_NAMES), stamped "
              "like the joint state it goes with. Empty: not published."),
    ParamSpec("instruction_topic", "str", "/instruction", "Output: std_msgs/String, the episode's instruction "
              "(reliable, transient local)."),
    ParamSpec("events_topic", "str", "sim/events", "Output: std_msgs/String JSON per episode event (start, "
              "success, timeout, done) with task, seed and times."),
    ParamSpec("episode_start_topic", "str", "edgefm/episode_start", "Output: std_msgs/Header at each episode "
              "start (stamp = start time, frame_id = 'task:seed'); action_node drops its queue on it."),
    ParamSpec("reset_topic", "str", "sim/reset", "Input: std_msgs/String; 'task:seed' starts that episode now, "
              "'' ends the current one (timeout) and goes on with the list."),
    ParamSpec("command_topic", "str", "/edgefm/command", "Input: action_node's command topic."),
    ParamSpec("command_type", "str", "joint_trajectory", "Command message type on command_topic (action_node's "
              "command_type).", choices=COMMAND_TYPES),
    ParamSpec("joint_names", "str[]", JOINTS, "State and command joint names (end-effector xyz, gripper)."),
    ParamSpec("realtime_priority", "int", 0, "SCHED_FIFO priority of the physics thread (0: normal scheduling; "
              "needs CAP_SYS_NICE): the simulated robot keeps the wall clock on a busy machine.", range=(0, 99)),
    ParamSpec("results_path", "str", "", "Per-episode results appended as JSON lines; empty: none."),
    ParamSpec("diagnostics_period_s", "float", 1.0, "Period of /diagnostics.", range=(0.05, 60.0)),
    ParamSpec("autostart", "bool", False, "Configure and activate on start (no lifecycle manager needed)."),
)


@dataclass(frozen=True)
class SimNodeConfig:
    episodes: tuple[str, ...]
    repeat: bool
    timeout_s: float
    settle_s: float
    start_delay_s: float
    command_guard_s: float
    wait_for_start: bool
    conditions: str
    phrasings: str
    image_height: int
    image_width: int
    camera_names: tuple[str, ...]
    camera_topics: tuple[str, ...]
    publish_compressed: bool
    camera_rate_hz: float
    state_rate_hz: float
    joint_states_topic: str
    ground_truth_topic: str
    instruction_topic: str
    events_topic: str
    episode_start_topic: str
    reset_topic: str
    command_topic: str
    command_type: str
    joint_names: tuple[str, ...]
    realtime_priority: int
    results_path: str
    diagnostics_period_s: float
    autostart: bool

    def __post_init__(self) -> None:
        if len(self.camera_names) != len(self.camera_topics):
            raise ValueError(f"camera_names {list(self.camera_names)} must name one camera per topic "
                             f"{list(self.camera_topics)}")
        if len(self.joint_names) != 4 or len(set(self.joint_names)) != 4:
            raise ValueError(f"joint_names {list(self.joint_names)} must be 4 distinct names (x, y, z, gripper)")
        if (self.image_height == 0) != (self.image_width == 0):
            raise ValueError(f"image_height {self.image_height} and image_width {self.image_width}: set both or "
                             "neither")
        for name in ("camera_rate_hz", "state_rate_hz"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"parameter {name!r} must be a positive number, got {v!r}")


def make_config(values: Mapping[str, Any]) -> SimNodeConfig:
    v = validate(PARAMS, values)
    return SimNodeConfig(**{f.name: v[f.name] for f in fields(SimNodeConfig)})

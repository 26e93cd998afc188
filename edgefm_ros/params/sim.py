"""sim_node's parameters (the simulated arm on the ROS graph)."""
from __future__ import annotations

import math

from edgefm_ros.params import topics
from edgefm_ros.params.action import COMMAND_TYPES
from edgefm_ros.params.spec import NodeConfig, param
from edgefm_ros.sim.conditions import CONDITION_SETS
from edgefm_ros.sim.tasks import PHRASINGS

JOINTS = ("ee_x", "ee_y", "ee_z", "gripper")  # the simulated arm's state and command order


class SimNodeConfig(NodeConfig, node="sim_node"):
    episodes: tuple[str, ...] = param((), "Episodes to run, in order, each 'task:seed' (tasks: edgefm_ros.sim.tasks."
                                      "TASKS). Empty: every task once on its first evaluation seed.")
    repeat: bool = param(False, "Start over after the last episode (live demos); false: hold and publish a 'done' "
                         "event.")
    timeout_s: float = param(0.0, "Episode time limit (wall = simulated seconds); 0: the task's max_seconds.",
                             range=(0.0, 3600.0))
    settle_s: float = param(0.5, "Seconds the arm holds after an episode ends, before the next one starts.",
                            range=(0.0, 60.0))
    start_delay_s: float = param(0.0, "Seconds to hold before the first episode (e.g. while the model warms up).",
                                 range=(0.0, 600.0))
    command_guard_s: float = param(0.05, "Commands stamped less than this after an episode start are ignored: "
                                   "action_node may still command from the old episode until the episode_start "
                                   "message reaches it (the new episode's first chunk needs a render and an "
                                   "inference first).", range=(0.0, 1.0))
    wait_for_start: bool = param(False, "Hold before the first episode until a message arrives on reset_topic (a "
                                 "harness starts the episodes once the policy is up).")
    conditions: str = param("clean", "Camera condition set, drawn per episode from its seed and applied to the "
                            "published images (edgefm_ros.sim.conditions: clean, degraded, mixed).",
                            choices=tuple(CONDITION_SETS))
    phrasings: str = param("canonical", "Instruction per episode: the task's canonical wording, or varied (drawn "
                           "from the seed; evaluation seeds include held-out wordings).",
                           choices=PHRASINGS)
    image_height: int = param(0, "Camera image height; 0: the simulator's default.", range=(0, 1024))
    image_width: int = param(0, "Camera image width; 0: the simulator's default.", range=(0, 1024))
    camera_names: tuple[str, ...] = param(("scene", "wrist"), "Simulator cameras to publish, same order as "
                                          "camera_topics.")
    camera_topics: tuple[str, ...] = param(topics.SIM_CAMERAS, "sensor_msgs/Image (rgb8) topic per camera.")
    publish_compressed: bool = param(False, "Also publish each camera as JPEG sensor_msgs/CompressedImage on "
                                     "<topic>/compressed.")
    camera_rate_hz: float = param(30.0, "Camera publishing rate.", range=(1.0, 120.0))
    state_rate_hz: float = param(100.0, "JointState publishing rate; also the physics loop's wake-up rate.",
                                 range=(10.0, 1000.0))
    joint_states_topic: str = param(topics.JOINT_STATES, "Output: sensor_msgs/JointState (ee_x, ee_y, ee_z, "
                                    "gripper).")
    ground_truth_topic: str = param("", "Output (privileged: for scripted operators and tests, never a policy's "
                                    "input): sensor_msgs/JointState of the simulator's full state, Meta-World's "
                                    "observation (hand, gripper, object poses, goal; names: edgefm_ros.sim.teleop."
                                    "GROUND_TRUTH_NAMES), stamped like the joint state it goes with. Empty: not "
                                    "published.")
    instruction_topic: str = param(topics.INSTRUCTION, "Output: std_msgs/String, the episode's instruction "
                                   "(reliable, transient local).")
    events_topic: str = param(topics.SIM_EVENTS, "Output: std_msgs/String JSON per episode event (start, "
                              "success, timeout, done) with task, seed and times.")
    episode_start_topic: str = param(topics.EPISODE_START, "Output: std_msgs/Header at each episode start (stamp "
                                     "= start time, frame_id = 'task:seed'); action_node drops its queue on it.")
    reset_topic: str = param(topics.SIM_RESET, "Input: std_msgs/String; 'task:seed' starts that episode now, '' "
                             "ends the current one (timeout) and goes on with the list.")
    command_topic: str = param(topics.COMMAND, "Input: action_node's command topic.")
    command_type: str = param("joint_trajectory", "Command message type on command_topic (action_node's "
                              "command_type).", choices=COMMAND_TYPES)
    joint_names: tuple[str, ...] = param(JOINTS, "State and command joint names (end-effector xyz, gripper).")
    realtime_priority: int = param(0, "SCHED_FIFO priority of the physics thread (0: normal scheduling; needs "
                                   "CAP_SYS_NICE): the simulated robot keeps the wall clock on a busy machine.",
                                   range=(0, 99))
    results_path: str = param("", "Per-episode results appended as JSON lines; empty: none.")

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

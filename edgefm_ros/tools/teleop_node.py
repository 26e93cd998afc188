"""teleop_operator: the simulated teleoperation device (edgefm_ros.sim.teleop) as a node on the ROS graph.

It drives sim_node the way a person with a leader arm or a spacemouse would: commands on action_node's command
topic, of action_node's type (JointTrajectory, Float64MultiArray or JointState), once a period while an episode
runs. Each command is stamped with the time of the ground truth it answers, as a teleoperation recorder pairs
an action with the observation it was made from: a converter sampling the command at or before a frame's time
(edgefm-bag to-dataset) then takes the one made from that frame's scene or the one before. What it sees of
the scene is sim_node's ground truth (``ground_truth_topic``, a privileged output sim_node publishes only when
asked), and the episode events tell it which task to teach and when to start and stop. It sends nothing
between episodes and never uses ground truth from before an episode's start.

    python -m edgefm_ros.tools.teleop_node --ros-args --params-file params.yaml   (edgefm-sim teach starts it)
"""
from __future__ import annotations

import json
import math
import sys

from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from edgefm_ros.params.action import COMMAND_TYPES
from edgefm_ros.params.sim import JOINTS
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.commands import COMMAND_MSG, command_msg
from edgefm_ros.ros.convert import to_sec, to_stamp
from edgefm_ros.ros.params import ParamSpec, declare
from edgefm_ros.ros.spin import run_node
from edgefm_ros.sim.expert import EXPERT_SPEED
from edgefm_ros.sim.teleop import TeleopConfig, TeleopOperator, ground_truth_vector

NODE_NAME = "teleop_operator"
GROUND_TRUTH_TOPIC = "sim/ground_truth"  # sim_node's ground_truth_topic when edgefm-sim teach runs it

PARAMS = (
    ParamSpec("ground_truth_topic", "str", GROUND_TRUTH_TOPIC, "Input: sim_node's ground truth "
              "(sensor_msgs/JointState, Meta-World's observation)."),
    ParamSpec("events_topic", "str", "sim/events", "Input: sim_node's episode events (std_msgs/String JSON)."),
    ParamSpec("command_topic", "str", "/edgefm/command", "Output: the command topic (action_node's)."),
    ParamSpec("command_type", "str", "joint_trajectory", "Command message type (action_node's command_type).",
              choices=COMMAND_TYPES),
    ParamSpec("joint_names", "str[]", JOINTS, "Command joint names (end-effector xyz, gripper)."),
    ParamSpec("tasks", "str[]", (), "Tasks to get ready for before the first episode (an unlisted task is "
              "made ready when it first comes, which delays its first command)."),
    ParamSpec("rate_hz", "float", 20.0, "Commands per second while an episode runs (the control rate).",
              range=(1.0, 80.0)),
    ParamSpec("speed", "float", EXPERT_SPEED, "The expert's speed cap, a fraction of Meta-World's 0.8 m/s.",
              range=(0.01, 1.0)),
    ParamSpec("noise_m", "float", 0.0, "Std (m) of the xyz noise on each command sent (a tremor around the "
              "intended target).", range=(0.0, 0.049)),
    ParamSpec("hesitate_per_s", "float", 0.0, "Hesitations (the command held) per second of teaching.",
              range=(0.0, 5.0)),
    ParamSpec("hesitate_min_s", "float", 0.2, "Shortest hesitation.", range=(0.01, 5.0)),
    ParamSpec("hesitate_max_s", "float", 0.6, "Longest hesitation.", range=(0.01, 5.0)),
    ParamSpec("seed", "int", 0, "Seed of the noise and hesitations (with the task and the episode's seed).",
              range=(0, 2 ** 31 - 1)),
    ParamSpec("max_truth_age_s", "float", 0.2, "Ground truth older than this is not acted on (the device "
              "waits).", range=(0.01, 5.0)),
    ParamSpec("diagnostics_period_s", "float", 1.0, "Period of /diagnostics.", range=(0.05, 60.0)),
)


class TeleopNode(Node):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        v = self.values = declare(self, PARAMS)
        if v["hesitate_min_s"] > v["hesitate_max_s"]:
            raise ValueError(f"hesitate_min_s {v['hesitate_min_s']} exceeds hesitate_max_s {v['hesitate_max_s']}")
        if len(v["joint_names"]) != 4 or len(set(v["joint_names"])) != 4:
            raise ValueError(f"joint_names {list(v['joint_names'])} must be 4 distinct names (x, y, z, gripper)")
        self.op = TeleopOperator(TeleopConfig(
            rate_hz=v["rate_hz"], speed=v["speed"], noise_m=v["noise_m"], hesitate_per_s=v["hesitate_per_s"],
            hesitate_s=(v["hesitate_min_s"], v["hesitate_max_s"]), seed=v["seed"]))
        self.op.prepare(v["tasks"])  # ValueError naming an unknown task
        self.period = 1.0 / v["rate_hz"]
        self._truth = None  # (stamp s, vector [39]) of the newest ground truth
        self._episode: dict | None = None  # the running episode's start event
        self._begun = False
        self.sent = 0
        self.episodes = 0
        self.truth_rejected = 0
        self.last_rejection = ""
        self._cmd_pub = self.create_publisher(COMMAND_MSG[v["command_type"]], v["command_topic"], qos.RELIABLE)
        self.create_subscription(JointState, v["ground_truth_topic"], self._on_truth, qos.SENSOR)
        self.create_subscription(String, v["events_topic"], self._on_event, qos.RELIABLE)
        self._diag_pub = self.create_publisher(diag.DiagnosticArray, "/diagnostics", qos.DIAGNOSTICS)
        self.create_timer(self.period, self._tick)
        self.create_timer(v["diagnostics_period_s"], self._publish_diagnostics)
        self.get_logger().info(f"teaching on {v['command_topic']} ({v['command_type']}, {v['rate_hz']:g} Hz) from "
                               f"{v['ground_truth_topic']}; noise {v['noise_m']:g} m, hesitations "
                               f"{v['hesitate_per_s']:g}/s")

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_truth(self, msg: JointState) -> None:
        try:
            vec = ground_truth_vector(msg.name, msg.position)
        except ValueError as e:
            self.truth_rejected += 1
            self.last_rejection = str(e)
            self.get_logger().warning(f"ground truth refused: {e}", throttle_duration_sec=2.0)
            return
        self._truth = (to_sec(msg.header.stamp), vec)

    def _on_event(self, msg: String) -> None:
        try:
            ev = json.loads(msg.data)
            kind = ev["event"]
        except (ValueError, KeyError, TypeError):
            self.get_logger().warning(f"episode event not understood: {msg.data[:80]!r}", throttle_duration_sec=2.0)
            return
        if kind == "start":
            self.op.end()
            self._episode, self._begun = ev, False
        elif kind in ("success", "timeout", "reset") and self._episode is not None:
            self.get_logger().info(f"episode {ev.get('episode')} {kind}: {self.op.commands} commands sent, "
                                   f"{self.op.hesitations} hesitations")
            self.op.end()
            self._episode, self._begun = None, False

    def _tick(self) -> None:
        ep, truth = self._episode, self._truth
        if ep is None or truth is None or not self.context.ok():
            return
        stamp, vec = truth
        now = self._now()
        if stamp < float(ep["t"]) or now - stamp > self.values["max_truth_age_s"]:
            return  # the scene as it was before the reset, or too old to act on
        if not self._begun:
            try:
                self.op.begin(str(ep["task"]), int(ep["seed"]), vec)
            except (ValueError, KeyError) as e:
                self.get_logger().error(f"cannot teach episode {ep}: {e}")
                self._episode = None
                return
            self._begun = True
            self.episodes += 1
            self.get_logger().info(f"episode {ep.get('episode')}: teaching {ep['task']} seed {ep['seed']}")
            now = self._now()  # building an unprepared task's expert takes a while
            if now - stamp > self.values["max_truth_age_s"]:
                return  # the first command at the next tick, from the scene as it is then
        cmd = self.op.command(vec, now)
        v = self.values
        self._cmd_pub.publish(command_msg(v["command_type"], v["joint_names"], cmd, to_stamp(stamp), self.period))
        self.sent += 1

    def _publish_diagnostics(self) -> None:
        if not self.context.ok():
            return
        ep = self._episode
        values = {"state": "active", "commands_sent": self.sent, "episodes_taught": self.episodes,
                  "teaching": f"{ep['task']}:{ep['seed']}" if ep else "", "truth_rejected": self.truth_rejected}
        age = self._now() - self._truth[0] if self._truth else math.inf
        values["ground_truth_age_s"] = age
        level, message = diag.OK, ("teaching " + values["teaching"]) if ep else "waiting for an episode"
        if self.last_rejection:
            values["last_rejection"] = self.last_rejection
        if ep is not None and age > self.values["max_truth_age_s"]:
            level, message = diag.WARN, f"no fresh ground truth on {self.values['ground_truth_topic']}"
        diag.publish_status(self, self._diag_pub, "teleop", level, message, values)


def main(args=None) -> int:
    return run_node(TeleopNode, NODE_NAME, args)


if __name__ == "__main__":
    sys.exit(main())

"""The robot command messages action_node publishes and sim_node (a robot) reads: one table of types, the
message for one action, and the fields of a received one."""
from __future__ import annotations

from builtin_interfaces.msg import Duration
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from edgefm_ros.ros.convert import to_sec

# command_type parameter (params/action.py COMMAND_TYPES) -> message type: trajectory_msgs, a ros2_control
# forward controller's array, JointState
COMMAND_MSG = {"joint_trajectory": JointTrajectory, "float64_multi_array": Float64MultiArray,
               "joint_state": JointState}


def command_msg(kind: str, names: tuple[str, ...], positions, stamp, period: float):
    """The command message of ``kind`` for one action (positions in ``names`` order)."""
    pos = [float(x) for x in positions]
    if kind == "float64_multi_array":
        return Float64MultiArray(data=pos)
    if kind == "joint_state":
        m = JointState(name=list(names), position=pos)
        m.header.stamp = stamp
        return m
    ns = int(period * 1e9)
    m = JointTrajectory(joint_names=list(names), points=[JointTrajectoryPoint(
        positions=pos, time_from_start=Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000))])
    m.header.stamp = stamp
    return m


def command_fields(msg) -> tuple[list[str], list[float], float]:
    """(joint names, positions, header stamp in s; 0 when unstamped) of any of the three command types."""
    if isinstance(msg, JointTrajectory):
        if not msg.points:
            raise ValueError("JointTrajectory without points")
        return list(msg.joint_names), list(msg.points[0].positions), to_sec(msg.header.stamp)
    if isinstance(msg, JointState):
        return list(msg.name), list(msg.position), to_sec(msg.header.stamp)
    return [], list(msg.data), 0.0

"""The closed loop in simulation: sim_node (the simulated arm, real time) with vla_node and action_node.

    ros2 launch edgefm_ros sim.launch.py [checkpoint:=DIR] [params_file:=FILE] [inference_delay_ms:=0]
                                         [results_path:=FILE] [use_router:=false]

sim_node runs the episodes listed in the params file (default share/edgefm_ros/config/sim.yaml: every task
once); the checkpoint defaults to the committed, trained one (share/edgefm_ros/checkpoints/smolvla-metaworld).
All nodes configure and activate themselves (autostart). ``edgefm-sim eval --exec ros`` runs the same graph
over many seeds and reports task success.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from edgefm_ros.ros.launch_housekeeping import housekeeping_actions


def generate_launch_description():
    share = FindPackageShare("edgefm_ros")
    params = LaunchConfiguration("params_file")
    return LaunchDescription([
        *housekeeping_actions(),
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([share, "config", "sim.yaml"]),
                              description="parameters of every node"),
        DeclareLaunchArgument("checkpoint",
                              default_value=PathJoinSubstitution([share, "checkpoints", "smolvla-metaworld"]),
                              description="SmolVLA checkpoint dir (default: the committed trained one)"),
        DeclareLaunchArgument("inference_delay_ms", default_value="0.0",
                              description="extra latency added to every chunk (success vs latency)"),
        DeclareLaunchArgument("results_path", default_value="", description="sim_node's per-episode JSON lines"),
        DeclareLaunchArgument("use_router", default_value="false", description="start router_node"),
        LifecycleNode(package="edgefm_ros", executable="sim_node", name="sim_node", namespace="",
                      parameters=[params, {"results_path": LaunchConfiguration("results_path")}], output="screen"),
        LifecycleNode(package="edgefm_ros", executable="vla_node", name="vla_node", namespace="",
                      parameters=[params, {
                          "checkpoint": LaunchConfiguration("checkpoint"),
                          "inference_delay_ms": ParameterValue(LaunchConfiguration("inference_delay_ms"),
                                                               value_type=float)}],
                      output="screen"),
        LifecycleNode(package="edgefm_ros", executable="action_node", name="action_node", namespace="",
                      parameters=[params], output="screen"),
        Node(package="edgefm_ros", executable="router_node", name="router_node", parameters=[params],
             output="screen", condition=IfCondition(LaunchConfiguration("use_router"))),
    ])

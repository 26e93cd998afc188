"""The closed loop in simulation: sim_node (the simulated arm, real time) with vla_node and action_node (and
router_node with use_router:=true).

    ros2 launch edgefm_ros sim.launch.py [checkpoint:=DIR] [params_file:=FILE] [inference_delay_ms:=0]
        [results_path:=FILE] [mode:=fast] [namespace:=sim1] [camera_topics:=/a,/b] [autostart:=false]
        [use_router:=true] ...                                (--show-args: every argument)

sim_node runs the episodes listed in the params file (default share/edgefm_ros/config/sim.yaml); the
checkpoint defaults to the committed, trained one (share/edgefm_ros/checkpoints/smolvla-metaworld). The shared
arguments are the robot graph's (edgefm_ros/ros/launch_args.py); camera_topics also sets where sim_node
publishes its cameras. ``edgefm-sim eval --exec ros`` runs the same graph over many seeds and reports task
success.
"""
from launch import LaunchDescription
from launch.actions import OpaqueFunction
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from edgefm_ros.ros.launch_args import SIM_ARGS, arguments, sim_graph_nodes
from edgefm_ros.ros.launch_housekeeping import housekeeping_actions


def generate_launch_description():
    share = FindPackageShare("edgefm_ros")
    return LaunchDescription([
        *housekeeping_actions(),
        *arguments(*SIM_ARGS, params_file=PathJoinSubstitution([share, "config", "sim.yaml"]),
                   checkpoint=PathJoinSubstitution([share, "checkpoints", "smolvla-metaworld"]), use_router="false"),
        OpaqueFunction(function=sim_graph_nodes),
    ])

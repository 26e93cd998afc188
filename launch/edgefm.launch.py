"""Launch the edgefm_ros node graph on a robot: vla_node, action_node and router_node (lifecycle nodes).

    ros2 launch edgefm_ros edgefm.launch.py checkpoint:=/path/to/smolvla [params_file:=/path/to/edgefm.yaml]
        [vlm:=/path/to/vlm] [mode:=fast] [camera_topics:=/wrist/image_raw/compressed,/top/image_raw]
        [joint_names:=a,b,c] [namespace:=arm1] [autostart:=false] [use_router:=false] [respawn:=true]
    ros2 launch edgefm_ros edgefm.launch.py --show-args      # every argument, explained

All parameters come from one file (default: share/edgefm_ros/config/edgefm.yaml); the arguments override
single parameters of it (edgefm_ros/ros/launch_args.py); an argument this file does not declare fails the
launch. With autostart the lifecycle nodes configure and activate themselves; otherwise drive them with
``ros2 lifecycle set /vla_node configure`` then ``activate``. Ctrl-C (SIGINT) stops every node cleanly (exit
code 0).
"""
from launch import LaunchDescription
from launch.actions import OpaqueFunction
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from edgefm_ros.ros.launch_args import arguments, graph_nodes
from edgefm_ros.ros.launch_housekeeping import housekeeping_actions


def generate_launch_description():
    robot_params = PathJoinSubstitution([FindPackageShare("edgefm_ros"), "config", "edgefm.yaml"])
    return LaunchDescription(housekeeping_actions() + arguments(params_file=robot_params)
                             + [OpaqueFunction(function=graph_nodes)])

"""Launch the edgefm_ros node graph on a robot: vla_node and action_node (lifecycle) and router_node.

    ros2 launch edgefm_ros edgefm.launch.py [params_file:=/path/to/edgefm.yaml] [use_router:=true]

All parameters come from one file (default: share/edgefm_ros/config/edgefm.yaml). With ``autostart: true``
in it the lifecycle nodes configure and activate themselves; otherwise drive them with a lifecycle manager
(configure, then activate).
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    params = LaunchConfiguration("params_file")
    return LaunchDescription([
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("edgefm_ros"), "config", "edgefm.yaml"]),
            description="parameters of every node"),
        DeclareLaunchArgument("use_router", default_value="true", description="start router_node (edge/cloud)"),
        LifecycleNode(package="edgefm_ros", executable="vla_node", name="vla_node", namespace="",
                      parameters=[params], output="screen"),
        LifecycleNode(package="edgefm_ros", executable="action_node", name="action_node", namespace="",
                      parameters=[params], output="screen"),
        Node(package="edgefm_ros", executable="router_node", name="router_node", parameters=[params],
             output="screen", condition=IfCondition(LaunchConfiguration("use_router"))),
    ])

"""Bag-replay testing: the node graph fed from a rosbag2 bag, its outputs recorded to another bag.

    ros2 launch edgefm_ros replay.launch.py bag:=/path/to/bag record:=/tmp/edgefm_record [rate:=1.0]

Make a synthetic bag with ``edgefm-bag make BAG``. Replay and recording use edgefm-bag (rosbags), which
publishes the stored CDR bytes on the bag's timeline, header stamps moved to replay time.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, TimerAction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    params = LaunchConfiguration("params_file")
    return LaunchDescription([
        DeclareLaunchArgument("bag", description="rosbag2 bag to replay"),
        DeclareLaunchArgument("record", default_value="edgefm_record", description="output bag"),
        DeclareLaunchArgument("rate", default_value="1.0", description="replay time factor"),
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare("edgefm_ros"), "config", "replay.yaml"]),
            description="node parameters for the synthetic bag's topics"),
        DeclareLaunchArgument("use_router", default_value="false", description="start router_node"),
        LifecycleNode(package="edgefm_ros", executable="vla_node", name="vla_node", namespace="",
                      parameters=[params], output="screen"),
        LifecycleNode(package="edgefm_ros", executable="action_node", name="action_node", namespace="",
                      parameters=[params], output="screen"),
        Node(package="edgefm_ros", executable="router_node", name="router_node", parameters=[params],
             output="screen", condition=IfCondition(LaunchConfiguration("use_router"))),
        ExecuteProcess(cmd=["edgefm-bag", "record", LaunchConfiguration("record"), "--topics",
                            "/edgefm/action_chunk", "/edgefm/queue_status", "/edgefm/route", "/edgefm/command",
                            "/diagnostics"], output="screen"),
        # give the model time to load and warm up before the data starts
        TimerAction(period=5.0, actions=[
            ExecuteProcess(cmd=["edgefm-bag", "play", LaunchConfiguration("bag"), "--rate",
                                LaunchConfiguration("rate")], output="screen")]),
    ])

"""Bag-replay testing: the node graph fed from a rosbag2 bag, its outputs recorded to another bag.

    ros2 launch edgefm_ros replay.launch.py bag:=/path/to/bag record:=/tmp/edgefm_record [rate:=1.0]

The nodes are edgefm.launch.py's (included, so the graph is defined once), with the synthetic bag's
parameters (config/replay.yaml) and the router off by default. Make a synthetic bag with
``edgefm-bag make BAG``. Replay and recording use edgefm-bag (rosbags), which publishes the stored CDR
bytes on the bag's timeline, header stamps moved to replay time.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription, TimerAction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    share = FindPackageShare("edgefm_ros")
    return LaunchDescription([
        DeclareLaunchArgument("bag", description="rosbag2 bag to replay"),
        DeclareLaunchArgument("record", default_value="edgefm_record", description="output bag"),
        DeclareLaunchArgument("rate", default_value="1.0", description="replay time factor"),
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([share, "config", "replay.yaml"]),
                              description="node parameters for the synthetic bag's topics"),
        DeclareLaunchArgument("use_router", default_value="false", description="start router_node"),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch", "edgefm.launch.py"])),
            launch_arguments={"params_file": LaunchConfiguration("params_file"),
                              "use_router": LaunchConfiguration("use_router")}.items()),
        ExecuteProcess(cmd=["edgefm-bag", "record", LaunchConfiguration("record"), "--topics",
                            "/edgefm/action_chunk", "/edgefm/queue_status", "/edgefm/route", "/edgefm/command",
                            "/diagnostics"], output="screen"),
        # give the model time to load and warm up before the data starts
        TimerAction(period=5.0, actions=[
            ExecuteProcess(cmd=["edgefm-bag", "play", LaunchConfiguration("bag"), "--rate",
                                LaunchConfiguration("rate")], output="screen")]),
    ])

"""Bag-replay testing: the node graph fed from a rosbag2 bag, its outputs recorded to another bag.

    ros2 launch edgefm_ros replay.launch.py bag:=/path/to/bag record:=/tmp/edgefm_record [rate:=1.0]
        [checkpoint:=DIR] [params_file:=FILE] [use_router:=true] ...   (--show-args: every argument)

The nodes are edgefm.launch.py's (included, so the graph is defined once), with the synthetic bag's
parameters (config/replay.yaml) and the router off by default; the shared arguments (checkpoint, mode,
camera_topics, namespace, autostart ...: edgefm_ros/ros/launch_args.py) reach the included graph. Make a
synthetic bag with ``edgefm-bag make BAG``. Replay and recording use edgefm-bag (rosbags), which publishes
the stored CDR bytes on the bag's timeline, header stamps moved to replay time; the recorder takes the
graph's topics in its namespace.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription, OpaqueFunction, TimerAction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from edgefm_ros.params import topics
from edgefm_ros.ros.launch_args import arguments, node_env, value
from edgefm_ros.ros.launch_housekeeping import housekeeping_actions


def recorder(context):
    """edgefm-bag record of the graph's outputs: its own topics in the launch's namespace, the robot's as
    they are."""
    ns = value(context, "namespace").strip("/")
    own = [f"/{ns}/{t}" if ns else f"/{t}" for t in (topics.ACTION_CHUNK, topics.QUEUE_STATUS, topics.ROUTE)]
    return [ExecuteProcess(cmd=["edgefm-bag", "record", value(context, "record"), "--topics", *own,
                                topics.COMMAND, topics.DIAGNOSTICS], output="screen", additional_env=node_env())]


def generate_launch_description():
    share = FindPackageShare("edgefm_ros")
    own = [DeclareLaunchArgument("bag", description="rosbag2 bag to replay"),
           DeclareLaunchArgument("record", default_value="edgefm_record", description="output bag"),
           DeclareLaunchArgument("rate", default_value="1.0", description="replay time factor"),
           DeclareLaunchArgument("play_delay_s", default_value="5.0",
                                 description="seconds between the start and the replay (model load, warm-up)")]
    return LaunchDescription([
        *housekeeping_actions(),
        *arguments(own=own, params_file=PathJoinSubstitution([share, "config", "replay.yaml"]), use_router="false"),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch", "edgefm.launch.py"])),
            launch_arguments={"params_file": LaunchConfiguration("params_file"),
                              "use_router": LaunchConfiguration("use_router")}.items()),
        OpaqueFunction(function=recorder),
        TimerAction(period=LaunchConfiguration("play_delay_s"), actions=[
            ExecuteProcess(cmd=["edgefm-bag", "play", LaunchConfiguration("bag"), "--rate",
                                LaunchConfiguration("rate")], output="screen", additional_env=node_env())]),
    ])

"""The launch arguments every edgefm launch file shares, declared and applied in one place.

    def generate_launch_description():
        return LaunchDescription(declare(params_file=<default path>) + [OpaqueFunction(function=graph)])

    def graph(context):   # runs at launch time, when the argument values are known
        return graph_nodes(context)          # or: LifecycleNode(..., parameters=[params_file(context),
                                             #                                    overrides(context, "vla_node")])

An empty argument keeps the params file's value; a non-empty one overrides it for the nodes that have that
parameter. ``ros2 launch edgefm_ros <file> --show-args`` prints each argument with its description.
Imports ``launch``/``launch_ros``: only launch files import this module.
"""
from __future__ import annotations

from dataclasses import dataclass

from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node

from edgefm_ros.ros.spin import EXIT_WITH_PARENT_ENV


@dataclass(frozen=True)
class LaunchArg:
    name: str
    default: str
    description: str
    nodes: tuple[str, ...] = ()  # nodes whose parameter of the same name the argument overrides


ARGS = (
    LaunchArg("params_file", "", "YAML parameter file of every node (vla_node, action_node, router_node "
              "sections)."),
    LaunchArg("checkpoint", "", "LeRobot SmolVLA checkpoint directory (config.json, model.safetensors, "
              "processor files). Empty: vla_node.checkpoint of the params file.", ("vla_node",)),
    LaunchArg("mode", "", "Engine mode of vla_node: exact (LeRobot parity) or fast (tuned kernels). Empty: "
              "the params file's.", ("vla_node",)),
    LaunchArg("camera_topics", "", "Camera topics, comma separated, in the order of the params file's "
              "camera_keys, e.g. /wrist/image_raw/compressed,/top/image_raw (a topic ending in /compressed is "
              "read as sensor_msgs/CompressedImage). Empty: the params file's.", ("vla_node", "router_node")),
    LaunchArg("namespace", "", "Namespace of every node and of their relative topics (edgefm/action_chunk, "
              "edgefm/queue_status, edgefm/route ...); absolute topics (/joint_states, /instruction, the "
              "cameras) stay as they are. Empty: the root namespace."),
    LaunchArg("autostart", "", "true: the lifecycle nodes configure and activate themselves; false: they wait "
              "for `ros2 lifecycle set <node> configure` then `activate`. Empty: the params file's.",
              ("vla_node", "action_node")),
    LaunchArg("respawn", "false", "true: launch restarts a node that exits or dies (a supervisor's restart); "
              "stale shared memory of a node that died is removed first."),
    LaunchArg("use_router", "true", "Start router_node (the edge/cloud router; vla_node runs on the edge "
              "without it)."),
)
BY_NAME = {a.name: a for a in ARGS}
RESPAWN_DELAY_S = 1.0  # between a node's exit and its restart (launch's respawn)


def declare(**defaults: str) -> list[DeclareLaunchArgument]:
    """DeclareLaunchArgument for every shared argument; ``defaults`` replaces a default (a launch file's own
    params file, use_router ...), a Substitution allowed."""
    unknown = sorted(set(defaults) - set(BY_NAME))
    if unknown:
        raise ValueError(f"no shared launch argument named {unknown}; known: {sorted(BY_NAME)}")
    return [DeclareLaunchArgument(a.name, default_value=defaults.get(a.name, a.default), description=a.description)
            for a in ARGS]


def split_list(text: str) -> list[str]:
    """'a,b' or '[a, b]' -> ['a', 'b'] (empty items dropped)."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [t.strip().strip("'\"") for t in text.split(",") if t.strip().strip("'\"")]


def parse_bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low not in ("true", "false"):
        raise ValueError(f"launch argument {name}:={text!r} must be true or false")
    return low == "true"


def value(context, name: str) -> str:
    return LaunchConfiguration(name).perform(context)


def overrides(context, node: str) -> dict:
    """The parameters of ``node`` that non-empty shared arguments override."""
    out: dict = {}
    for a in ARGS:
        if node not in a.nodes:
            continue
        text = value(context, a.name)
        if not text:
            continue
        if a.name == "camera_topics":
            out[a.name] = split_list(text)
        elif a.name == "autostart":
            out[a.name] = parse_bool(a.name, text)
        else:
            out[a.name] = text
    return out


def node_env() -> dict[str, str]:
    """Environment of every node a launch file starts: exit when the launcher dies (no orphans)."""
    return {EXIT_WITH_PARENT_ENV: "1"}


def graph_nodes(context) -> list:
    """vla_node and action_node (lifecycle) and router_node (``use_router``), with the params file and the
    arguments' overrides; for an OpaqueFunction."""
    params = value(context, "params_file")
    ns = value(context, "namespace")
    if not params:
        raise ValueError("launch argument params_file is empty: name a parameter file")
    common = dict(package="edgefm_ros", namespace=ns, output="screen", additional_env=node_env(),
                  respawn=parse_bool("respawn", value(context, "respawn")), respawn_delay=RESPAWN_DELAY_S)
    def parameters(node: str) -> list:
        extra = overrides(context, node)
        return [params, extra] if extra else [params]

    nodes = [LifecycleNode(executable=n, name=n, parameters=parameters(n), **common)
             for n in ("vla_node", "action_node")]
    if parse_bool("use_router", value(context, "use_router")):
        nodes.append(Node(executable="router_node", name="router_node", parameters=parameters("router_node"),
                          **common))
    return nodes

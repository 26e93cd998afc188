"""The launch arguments every edgefm launch file shares, declared and applied in one place, and the graph
they start.

    def generate_launch_description():
        return LaunchDescription(housekeeping_actions() + arguments(params_file=<default path>)
                                 + [OpaqueFunction(function=graph_nodes)])

An empty argument keeps the params file's value; a non-empty one overrides it for the nodes that have that
parameter (``targets``). ``ros2 launch edgefm_ros <file> --show-args`` prints each argument with its
description. ROS 2 launch ignores an argument no launch file declares (``autostart:=flase`` would change
nothing, silently): ``arguments`` ends with a check that refuses one, naming it and the declared ones.
Imports ``launch``/``launch_ros``: only launch files import this module.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Sequence

import yaml

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode

from edgefm_ros.ros.spin import EXIT_WITH_PARENT_ENV

GRAPH = ("vla_node", "action_node", "router_node")  # edgefm.launch.py's nodes; sim.launch.py adds sim_node


@dataclass(frozen=True)
class LaunchArg:
    name: str
    default: str
    description: str
    targets: tuple[tuple[str, str], ...] = ()  # (node, parameter) pairs a non-empty value overrides
    kind: str = "str"  # how the text becomes the parameter's value: str, list (comma separated), bool, float


def _each(param: str, *nodes: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, param) for n in nodes)


ARGS = (
    LaunchArg("params_file", "", "YAML parameter file of every node (vla_node, action_node, router_node "
              "sections)."),
    LaunchArg("checkpoint", "", "LeRobot SmolVLA checkpoint directory (config.json, model.safetensors, "
              "processor files). Empty: vla_node.checkpoint of the params file.", _each("checkpoint", "vla_node")),
    LaunchArg("vlm", "", "Directory with the checkpoint's VLM config and tokenizer, for a checkpoint whose "
              "backbone is not in the Hugging Face cache (vla_node.vlm_dir). Empty: the params file's.",
              _each("vlm_dir", "vla_node")),
    LaunchArg("mode", "", "Engine mode of vla_node: exact (LeRobot parity) or fast (tuned kernels). Empty: "
              "the params file's.", _each("mode", "vla_node")),
    LaunchArg("camera_topics", "", "Camera topics, comma separated, e.g. /wrist/image_raw/compressed,/top/"
              "image_raw (a topic ending in /compressed is read as sensor_msgs/CompressedImage), in the order of "
              "vla_node's camera_keys; with camera_keys empty, the checkpoint's cameras in its order "
              "(config.json input_features). Empty: the params file's.",
              _each("camera_topics", "vla_node", "router_node", "sim_node"), "list"),
    LaunchArg("joint_names", "", "The robot's joint names, comma separated, in the model's state order "
              "(vla_node.state_joint_names, action_node.joint_names). Empty: the params file's.",
              (("vla_node", "state_joint_names"), ("action_node", "joint_names")), "list"),
    LaunchArg("namespace", "", "Namespace of every node and of the graph's own (relative) topics: "
              "edgefm/action_chunk, edgefm/queue_status, edgefm/route ...; the robot's topics are absolute "
              "(/joint_states, /instruction, the cameras, the command topic) and stay as they are "
              "(edgefm_ros/params/topics.py). Empty: the root namespace."),
    LaunchArg("autostart", "", "true: the lifecycle nodes configure and activate themselves; false: they wait "
              "for `ros2 lifecycle set <node> configure` then `activate`. Empty: the params file's.",
              _each("autostart", *GRAPH, "sim_node"), "bool"),
    LaunchArg("respawn", "false", "true: launch restarts a node that exits or dies (a supervisor's restart); "
              "stale shared memory of a node that died is removed first."),
    LaunchArg("use_router", "true", "Start router_node (the edge/cloud router; vla_node runs on the edge "
              "without it)."),
)
# sim.launch.py's own, besides the shared ones
SIM_ARGS = (
    LaunchArg("inference_delay_ms", "0.0", "Extra latency added to every chunk (success against latency).",
              _each("inference_delay_ms", "vla_node"), "float"),
    LaunchArg("results_path", "", "sim_node's per-episode results, JSON lines. Empty: the params file's.",
              _each("results_path", "sim_node")),
)
BY_NAME = {a.name: a for a in ARGS + SIM_ARGS}
RESPAWN_DELAY_S = 1.0  # between a node's exit and its restart (launch's respawn)
CHECKED = "_edgefm_launch_arguments_checked"  # set once the outermost launch file has checked them


def declare(*extra: LaunchArg, **defaults) -> list[DeclareLaunchArgument]:
    """DeclareLaunchArgument for every shared argument and ``extra`` ones; ``defaults`` replaces a default (a
    launch file's own params file, use_router ...), a Substitution allowed."""
    args = ARGS + extra
    unknown = sorted(set(defaults) - {a.name for a in args})
    if unknown:
        raise ValueError(f"no launch argument named {unknown}; known: {sorted(a.name for a in args)}")
    return [DeclareLaunchArgument(a.name, default_value=defaults.get(a.name, a.default), description=a.description)
            for a in args]


def arguments(*extra: LaunchArg, own: Sequence[DeclareLaunchArgument] = (), **defaults) -> list:
    """A launch file's arguments: its ``own``, the shared ones and ``extra`` (``declare``), then the check
    that refuses any other (``refuse_undeclared``)."""
    declared = list(own) + declare(*extra, **defaults)
    return declared + [refuse_undeclared([d.name for d in declared])]


def refuse_undeclared(names: list[str]) -> OpaqueFunction:
    """A launch action that fails the launch when it was given an argument none of ``names`` (every argument
    the launch file declares, its own included) is; the outermost launch file checks, an included one (whose
    parent passes it its own arguments) does not."""

    def check(context):
        given = context.launch_configurations
        if CHECKED in given:
            return []
        unknown = sorted(set(given) - set(names))
        given[CHECKED] = "1"
        if unknown:
            raise ValueError(f"launch arguments {unknown} are not declared by this launch file (ROS 2 launch "
                             f"would ignore them); declared: {sorted(names)}")
        return []

    return OpaqueFunction(function=check)


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


def _parse(a: LaunchArg, text: str):
    if a.kind == "list":
        return split_list(text)
    if a.kind == "bool":
        return parse_bool(a.name, text)
    if a.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"launch argument {a.name}:={text!r} must be a number") from None
    return text


def value(context, name: str) -> str:
    return LaunchConfiguration(name).perform(context)


def overrides(context, node: str, extra: tuple[LaunchArg, ...] = ()) -> dict:
    """The parameters of ``node`` that non-empty arguments (the shared ones and ``extra``) override."""
    out: dict = {}
    for a in ARGS + extra:
        for target, param in a.targets:
            text = value(context, a.name) if target == node else ""
            if text:
                out[param] = _parse(a, text)
    return out


def node_env() -> dict[str, str]:
    """Environment of every node a launch file starts: exit when the launcher dies (no orphans)."""
    return {EXIT_WITH_PARENT_ENV: "1"}


def namespaced_params(path: str) -> str:
    """A copy of the params file whose node sections (``vla_node:``) also match a node in a namespace
    (``/**/vla_node:``): rcl reads a plain node name as one in the root namespace only, so under a namespace
    the nodes would get none of the file's parameters. Written once per launch to a temporary file."""
    with open(os.path.expanduser(path)) as f:
        doc = yaml.safe_load(f) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"params_file {path!r} is not a mapping of node names to ros__parameters")
    fd, out = tempfile.mkstemp(prefix="edgefm_params_", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({k if str(k).startswith("/") else f"/**/{k}": v for k, v in doc.items()}, f)
    return out


def graph_nodes(context, sim: bool = False) -> list:
    """The lifecycle nodes of the graph (sim_node first with ``sim``, vla_node, action_node, router_node with
    ``use_router``), each with the params file and the arguments' overrides, in ``namespace``; for an
    OpaqueFunction."""
    params = value(context, "params_file")
    if not params:
        raise ValueError("launch argument params_file is empty: name a parameter file")
    extra = SIM_ARGS if sim else ()
    ns = value(context, "namespace").strip("/")
    if ns:
        params = namespaced_params(params)
    common = dict(package="edgefm_ros", namespace=ns, output="screen",
                  additional_env=node_env(), respawn=parse_bool("respawn", value(context, "respawn")),
                  respawn_delay=RESPAWN_DELAY_S)

    def parameters(node: str) -> list:
        over = overrides(context, node, extra)
        return [params, over] if over else [params]

    names = (("sim_node",) if sim else ()) + GRAPH[:2]
    if parse_bool("use_router", value(context, "use_router")):
        names += ("router_node",)
    return [LifecycleNode(executable=n, name=n, parameters=parameters(n), **common) for n in names]


def sim_graph_nodes(context) -> list:
    """``graph_nodes`` with sim_node, for sim.launch.py's OpaqueFunction."""
    return graph_nodes(context, sim=True)

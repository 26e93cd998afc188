"""config/sim.yaml and launch/sim.launch.py checked structurally (no ROS needed): only declared, valid
parameters; the simulated arm's joints everywhere; the launch file starts the three nodes of the loop."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from edgefm_ros.params.action import ActionNodeConfig
from edgefm_ros.params.sim import JOINTS, SimNodeConfig
from edgefm_ros.params.spec import unknown_in_params_file, validate
from edgefm_ros.params.vla import VlaNodeConfig
from skips import require_module

REPO = Path(__file__).resolve().parents[2]
SPECS = {"sim_node": SimNodeConfig.PARAMS, "vla_node": VlaNodeConfig.PARAMS, "action_node": ActionNodeConfig.PARAMS}


def _doc():
    return yaml.safe_load((REPO / "config" / "sim.yaml").read_text())


def test_sim_config_holds_only_declared_valid_parameters():
    doc = _doc()
    for node, specs in SPECS.items():
        assert unknown_in_params_file(doc, node, specs) == [], node
        validate(specs, doc[node]["ros__parameters"])
    SimNodeConfig.from_values(doc["sim_node"]["ros__parameters"])
    ActionNodeConfig.from_values(doc["action_node"]["ros__parameters"])
    vla = dict(doc["vla_node"]["ros__parameters"], checkpoint="/x")  # the launch argument / the tool sets it
    VlaNodeConfig.from_values(vla)
    assert {s.name for s in SimNodeConfig.PARAMS} == set(doc["sim_node"]["ros__parameters"])  # every one listed


def test_sim_config_wires_the_loop():
    """sim_node's outputs are vla_node's inputs, action_node's commands are sim_node's input, same joints,
    and action_node runs at the simulator's control rate (the policy's action rate)."""
    from edgefm_ros.sim.env import SimConfig

    doc = _doc()
    s, v, a = (doc[n]["ros__parameters"] for n in ("sim_node", "vla_node", "action_node"))
    assert v["camera_topics"] == s["camera_topics"]
    assert v["camera_keys"] == [f"observation.images.{c}" for c in s["camera_names"]]
    assert v["joint_states_topic"] == s["joint_states_topic"] and v["instruction_topic"] == s["instruction_topic"]
    assert s["joint_names"] == v["state_joint_names"] == a["joint_names"] == list(JOINTS)
    assert a["command_topic"] == s["command_topic"] and a["command_type"] == s["command_type"]
    assert a["episode_start_topic"] == s["episode_start_topic"]
    assert a["control_rate_hz"] == v["action_rate_hz"] == SimConfig().control_hz


def test_sim_launch_starts_the_loop_with_a_checkpoint_argument():
    """sim.launch.py (evaluated with the launch API): the shared arguments plus its own, the committed checkpoint
    and config/sim.yaml by default, the router off; its graph is sim_node then edgefm.launch.py's nodes."""
    require_module("launch_ros")
    import importlib.util

    from launch import LaunchContext

    from edgefm_ros.ros.launch_args import ARGS, SIM_ARGS, sim_graph_nodes

    spec = importlib.util.spec_from_file_location("sim_launch", REPO / "launch" / "sim.launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    declared = {a.name: a for a in module.generate_launch_description().get_launch_arguments()}
    assert set(declared) == {a.name for a in ARGS + SIM_ARGS}
    ctx = LaunchContext()
    defaults = {n: "".join(s.perform(ctx) if hasattr(s, "perform") else str(s) for s in a.default_value)
                for n, a in declared.items() if n not in ("params_file", "checkpoint")}
    assert defaults["use_router"] == "false" and defaults["inference_delay_ms"] == "0.0"
    text = ast.unparse(ast.parse((REPO / "launch" / "sim.launch.py").read_text()))
    assert "smolvla-metaworld" in text and "sim.yaml" in text
    ctx.launch_configurations.update({**defaults, "params_file": "/sim.yaml", "checkpoint": "/ckpt",
                                      "use_router": "true"})
    assert [n.node_executable for n in sim_graph_nodes(ctx)] == ["sim_node", "vla_node", "action_node",
                                                                 "router_node"]


def test_bad_sim_parameters_are_named():
    with pytest.raises(ValueError, match="camera_names"):
        SimNodeConfig.from_values({"camera_names": ["scene"]})
    with pytest.raises(ValueError, match="joint_names"):
        SimNodeConfig.from_values({"joint_names": ["a", "b", "c"]})
    with pytest.raises(ValueError, match="'command_type'"):
        SimNodeConfig.from_values({"command_type": "twist"})


def test_rcl_parses_the_sim_params_file(ros):
    """rcl's own YAML parser (stricter than PyYAML: 'task:seed' in a flow list must be quoted)."""
    from rclpy.context import Context

    ctx = Context()
    ctx.init(["--ros-args", "--params-file", str(REPO / "config" / "sim.yaml")])
    ctx.try_shutdown()

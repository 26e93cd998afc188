"""Launch files and parameter files, checked without running them (tests/ros/test_launch_graph.py runs
them with ``ros2 launch``): the graph and its arguments, the executables are installed, the parameter files
parse and hold only declared, valid parameters."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from edgefm_ros.params.action import ActionNodeConfig
from edgefm_ros.params.router import RouterNodeConfig
from edgefm_ros.params.spec import ParamSpec, unknown_in_params_file, validate
from edgefm_ros.params.vla import VlaNodeConfig
from skips import require_module

REPO = Path(__file__).resolve().parents[2]
LAUNCH = sorted((REPO / "launch").glob("*.launch.py"))
CONFIGS = [REPO / "config" / "edgefm.yaml", REPO / "config" / "replay.yaml"]
SPECS = {"vla_node": VlaNodeConfig.PARAMS, "action_node": ActionNodeConfig.PARAMS}


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name and isinstance(k.value, ast.Constant):
            return k.value.value
    return None


def test_launch_files_exist():
    assert {p.name for p in LAUNCH} >= {"edgefm.launch.py", "replay.launch.py"}


def _context(*extra, **values):
    from launch import LaunchContext

    from edgefm_ros.ros.launch_args import ARGS

    ctx = LaunchContext()
    ctx.launch_configurations.update({a.name: a.default for a in ARGS + extra})
    ctx.launch_configurations.update(values)
    return ctx


def test_launch_graph_starts_our_executables_and_applies_the_arguments(tmp_path):
    """The graph edgefm.launch.py starts (edgefm_ros/ros/launch_args.py), evaluated with the launch API:
    lifecycle vla_node, action_node and router_node (use_router), our package, the params file, exit with the
    launcher; a non-empty argument overrides its parameter, an empty one keeps the file's."""
    require_module("launch_ros")
    from launch_ros.actions import LifecycleNode

    from edgefm_ros.ros.launch_args import graph_nodes, overrides
    from edgefm_ros.ros.spin import EXIT_WITH_PARENT_ENV

    robot = tmp_path / "robot.yaml"
    robot.write_text("vla_node:\n  ros__parameters:\n    threads: 1\n    tables: []\n"
                     "/arm1/action_node:\n  ros__parameters:\n    spin_s: 0.0\n")
    ctx = _context(params_file=str(robot), checkpoint="/models/ckpt", mode="fast", vlm="/models/vlm",
                   camera_topics="[/wrist/image_raw/compressed, /top/image_raw]", autostart="false",
                   joint_names="a, b,c", namespace="arm1")
    nodes = graph_nodes(ctx)
    assert [(n.node_executable, isinstance(n, LifecycleNode)) for n in nodes] == [
        ("vla_node", True), ("action_node", True), ("router_node", True)]
    assert all(n.node_package == "edgefm_ros" for n in nodes)
    from launch.utilities import perform_substitutions

    envs = [{perform_substitutions(ctx, k): perform_substitutions(ctx, v) for k, v in n.additional_env} for n in nodes]
    assert all(e.get(EXIT_WITH_PARENT_ENV) == "1" for e in envs), envs
    # launch_ros has no public getter before it runs the node: the namespace and the files it was given
    assert [n._Node__node_namespace for n in nodes] == ["arm1"] * 3
    # rcl reads a plain node name in a params file as the root namespace's: under a namespace the nodes get a
    # copy whose sections match them wherever they are
    files = {str(n._Node__parameters[0].evaluate(ctx)) for n in nodes}
    assert len(files) == 1 and str(robot) not in files
    copy = yaml.safe_load(Path(files.pop()).read_text())
    assert copy == {"/**/vla_node": {"ros__parameters": {"threads": 1, "tables": []}},
                    "/arm1/action_node": {"ros__parameters": {"spin_s": 0.0}}}
    cams = ["/wrist/image_raw/compressed", "/top/image_raw"]
    assert overrides(ctx, "vla_node") == {"checkpoint": "/models/ckpt", "vlm_dir": "/models/vlm", "mode": "fast",
                                          "camera_topics": cams, "state_joint_names": ["a", "b", "c"],
                                          "autostart": False}
    assert overrides(ctx, "action_node") == {"joint_names": ["a", "b", "c"], "autostart": False}
    assert overrides(ctx, "router_node") == {"camera_topics": cams, "autostart": False}
    assert overrides(_context(params_file="/p.yaml"), "vla_node") == {}  # empty arguments: the file decides
    assert [n.node_executable for n in graph_nodes(_context(params_file="/p.yaml", use_router="false"))] == [
        "vla_node", "action_node"]
    with pytest.raises(ValueError, match="use_router"):
        graph_nodes(_context(params_file="/p.yaml", use_router="maybe"))
    with pytest.raises(ValueError, match="autostart"):
        overrides(_context(params_file="/p.yaml", autostart="yes please"), "vla_node")


def test_sim_launch_graph_takes_the_shared_arguments_too():
    """sim.launch.py's graph: sim_node first, then edgefm.launch.py's nodes, with the same shared arguments
    (autostart, namespace, mode, camera_topics: also where sim_node publishes) and its own two."""
    require_module("launch_ros")
    from edgefm_ros.ros.launch_args import SIM_ARGS, overrides, sim_graph_nodes

    ctx = _context(*SIM_ARGS, params_file=str(REPO / "config" / "sim.yaml"), use_router="true", autostart="false",
                   namespace="sim1", mode="fast", camera_topics="/a,/b", inference_delay_ms="250",
                   results_path="/r.jsonl")
    nodes = sim_graph_nodes(ctx)
    assert [n.node_executable for n in nodes] == ["sim_node", "vla_node", "action_node", "router_node"]
    assert overrides(ctx, "sim_node", SIM_ARGS) == {"camera_topics": ["/a", "/b"], "autostart": False,
                                                    "results_path": "/r.jsonl"}
    assert overrides(ctx, "vla_node", SIM_ARGS) == {"mode": "fast", "camera_topics": ["/a", "/b"],
                                                    "autostart": False, "inference_delay_ms": 250.0}
    with pytest.raises(ValueError, match="inference_delay_ms"):
        overrides(_context(*SIM_ARGS, params_file="/p", inference_delay_ms="slow"), "vla_node", SIM_ARGS)


def test_every_launch_file_takes_the_shared_arguments_and_refuses_others():
    """Each launch file declares every shared argument (one list: launch_args.ARGS); an argument none of its
    declarations names fails the launch, naming it (ROS 2 launch alone would ignore it)."""
    require_module("launch_ros")
    import importlib.util

    from launch import LaunchContext
    from launch.actions import OpaqueFunction

    from edgefm_ros.ros.launch_args import ARGS, refuse_undeclared

    for path in LAUNCH:
        spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        declared = {a.name for a in module.generate_launch_description().get_launch_arguments()}
        assert {a.name for a in ARGS} <= declared, (path.name, {a.name for a in ARGS} - declared)
    check = refuse_undeclared(["autostart", "namespace"])
    assert isinstance(check, OpaqueFunction)
    ctx = LaunchContext()
    ctx.launch_configurations.update({"autostart": "false", "autostrat": "false"})
    with pytest.raises(ValueError, match=r"\['autostrat'\] are not declared"):
        check.execute(ctx)
    inner = refuse_undeclared(["autostart"])  # an included file's check (its parent's arguments are given too)
    assert not inner.execute(ctx)  # the outermost file checked: nothing more
    fresh = LaunchContext()
    fresh.launch_configurations.update({"autostart": "true"})
    assert not refuse_undeclared(["autostart", "namespace"]).execute(fresh)


@pytest.mark.parametrize("path", LAUNCH, ids=lambda p: p.name)
def test_launch_files_refer_to_files_that_exist(path):
    text = path.read_text()
    assert "generate_launch_description" in text
    for cfg in ("edgefm.yaml", "replay.yaml"):
        if cfg in text:
            assert (REPO / "config" / cfg).is_file(), f"{path.name} refers to missing config/{cfg}"
    for other in LAUNCH:
        if other.name in text and other != path:
            assert "IncludeLaunchDescription" in text


def test_replay_launch_includes_the_graph_with_its_arguments():
    calls = _calls(REPO / "launch" / "replay.launch.py")
    assert not [c for c in calls if getattr(c.func, "id", "") in ("Node", "LifecycleNode")], "graph defined twice"
    include = [c for c in calls if getattr(c.func, "id", "") == "IncludeLaunchDescription"]
    assert len(include) == 1
    text = ast.unparse(include[0])
    assert "edgefm.launch.py" in text and "'params_file'" in text and "'use_router'" in text


def test_replay_launch_uses_registered_console_scripts():
    scripts = (REPO / "setup.py").read_text()
    cmds = [c for c in _calls(REPO / "launch" / "replay.launch.py") if getattr(c.func, "id", "") == "ExecuteProcess"]
    assert len(cmds) == 2
    for c in cmds:
        cmd = next(k.value for k in c.keywords if k.arg == "cmd")
        assert cmd.elts[0].value == "edgefm-bag" and f"{cmd.elts[0].value}=" in scripts
        assert cmd.elts[1].value in ("play", "record")


def test_node_executables_are_installed():
    lib = REPO / "install" / "edgefm_ros" / "lib" / "edgefm_ros"
    if not lib.is_dir():
        pytest.skip("no colcon install space (run scripts/setup.sh)")
    for name in ("vla_node", "action_node"):
        exe = lib / name
        assert exe.is_file() and exe.stat().st_mode & 0o111, f"{exe} missing or not executable"
        assert f"edgefm_ros.nodes.{name} import main" in exe.read_text()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_params_files_hold_only_declared_valid_parameters(path):
    doc = yaml.safe_load(path.read_text())
    assert set(SPECS) <= set(doc), f"{path.name} lacks a node section"
    for node, specs in {**SPECS, "router_node": RouterNodeConfig.PARAMS}.items():
        if node not in doc:
            continue
        assert unknown_in_params_file(doc, node, specs) == [], f"{path.name}: undeclared {node} parameters"
        values = doc[node]["ros__parameters"]
        validate(specs, values)  # types, ranges, choices
    ActionNodeConfig.from_values(doc["action_node"]["ros__parameters"])
    VlaNodeConfig.from_values(doc["vla_node"]["ros__parameters"])


def test_robot_config_lists_every_parameter():
    doc = yaml.safe_load(CONFIGS[0].read_text())
    for node, specs in SPECS.items():
        assert {s.name for s in specs} == set(doc[node]["ros__parameters"]), node


def test_robot_config_router_section_is_valid():
    doc = yaml.safe_load(CONFIGS[0].read_text())
    params = doc["router_node"]["ros__parameters"]
    # the runtime thresholds are left to the router YAML (unset), so the file does not list them
    assert set(params) == {s.name for s in RouterNodeConfig.PARAMS if s.read_only}
    RouterNodeConfig.from_values(params)


def test_unknown_and_invalid_parameters_are_named():
    specs = (ParamSpec("rate", "float", 50.0, "r", range=(1.0, 100.0)),
             ParamSpec("mode", "str", "a", "m", choices=("a", "b")))
    rng = __import__("numpy").random.default_rng()
    bad_rate = float(rng.uniform(101, 1000))
    with pytest.raises(ValueError, match="'rate'"):
        validate(specs, {"rate": bad_rate})
    with pytest.raises(ValueError, match="'mode'"):
        validate(specs, {"mode": "c"})
    with pytest.raises(ValueError, match="typo_rate"):
        validate(specs, {"typo_rate": 5.0})
    with pytest.raises(ValueError, match="type float"):
        validate(specs, {"rate": "fast"})
    assert unknown_in_params_file({"n": {"ros__parameters": {"rate": 2.0, "x": 1}}}, "n", specs) == ["x"]

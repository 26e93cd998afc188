"""Parameters declared once (edgefm_ros/params): one field per parameter gives its ParamSpec and the typed,
frozen config; bad values are named; every node's declaration follows the same form and the topic rule;
the rclpy side declares them read-only (or not), with their ranges, and refuses a bad runtime value with
a reason that names it. The rclpy parts run real nodes in-process."""
from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.params import topics
from edgefm_ros.params.spec import NodeConfig, ParamSpec, param
from skips import require_material

RNG = np.random.default_rng()
REPO = Path(__file__).resolve().parents[2]
DECLARATIONS = {"vla_node": ("edgefm_ros.params.vla", "VlaNodeConfig"),
                "action_node": ("edgefm_ros.params.action", "ActionNodeConfig"),
                "router_node": ("edgefm_ros.params.router", "RouterNodeConfig"),
                "sim_node": ("edgefm_ros.params.sim", "SimNodeConfig"),
                "scene_query_node": ("edgefm_ros.params.scene_query", "SceneQueryConfig")}


class DemoConfig(NodeConfig, node="demo_node"):
    rate_hz: float = param(50.0, "Ticks per second.", range=(1.0, 100.0))
    depth: int = param(3, "Queue depth.", range=(1, 10))
    mode: str = param("a", "Mode.", choices=("a", "b"))
    topics_in: tuple[str, ...] = param(("/x",), "Inputs.")
    gains: tuple[float, ...] = param((), "Gains.", range=(0.0, 2.0))
    enabled: bool = param(True, "On.")
    gain: float | None = param(None, "Runtime gain; unset: the library's.", range=(-1.0, 1.0), read_only=False)

    def __post_init__(self) -> None:
        if self.depth > 2 * self.rate_hz:
            raise ValueError(f"depth {self.depth} exceeds twice rate_hz {self.rate_hz}")


def lint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    require_material(Path(exe).is_file(), "lint-imports is not installed (requirements.txt pins import-linter)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([exe, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _declaration(node: str):
    module, name = DECLARATIONS[node]
    return getattr(importlib.import_module(module), name)


def test_one_declaration_gives_the_specs_and_the_typed_frozen_config():
    specs = {s.name: s for s in DemoConfig.PARAMS}
    assert DemoConfig.NODE == "demo_node"
    # the base's two parameters first, then the node's, in field order
    assert list(specs) == ["diagnostics_period_s", "autostart", "rate_hz", "depth", "mode", "topics_in", "gains",
                           "enabled", "gain"]
    assert specs["rate_hz"] == ParamSpec("rate_hz", "float", 50.0, "Ticks per second.", (1.0, 100.0))
    assert (specs["depth"].type, specs["mode"].choices, specs["topics_in"].type, specs["gains"].type) == \
        ("int", ("a", "b"), "str[]", "float[]")
    assert specs["enabled"].type == "bool" and specs["autostart"].default is False
    assert specs["gain"].type == "float" and specs["gain"].default is None and not specs["gain"].read_only
    assert all(s.read_only for n, s in specs.items() if n != "gain")

    # rate_hz >= 1.5: the default depth 3 must not exceed twice it (DemoConfig.__post_init__)
    rate, gains = float(RNG.uniform(1.5, 100)), [int(RNG.integers(0, 2)), float(RNG.uniform(0, 2))]
    cfg = DemoConfig.from_values({"rate_hz": rate, "topics_in": ["/a", "/b"], "gains": gains})
    assert cfg.rate_hz == rate and cfg.topics_in == ("/a", "/b") and cfg.depth == 3 and cfg.gain is None
    assert cfg.gains == tuple(float(g) for g in gains) and all(isinstance(g, float) for g in cfg.gains)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rate_hz = 2.0
    assert dataclasses.replace(cfg, gain=0.5).gain == 0.5


@pytest.mark.parametrize("name,value,words", [
    ("rate_hz", "out", ["'rate_hz'", "outside [1.0, 100.0]"]),
    ("depth", 2.5, ["'depth'", "type int", "2.5"]),
    ("mode", "c", ["'mode'", "'c'", "choose from"]),
    ("gains", "negative", ["'gains'", "outside [0.0, 2.0]"]),
    ("gain", float("nan"), ["'gain'", "nan"]),
    ("topics_in", "/x", ["'topics_in'", "type str[]"]),
    ("typo_hz", 5.0, ["typo_hz"]),
])
def test_a_bad_value_is_refused_naming_it(name, value, words):
    if value == "out":
        value = float(RNG.choice([RNG.uniform(-1e3, 0.99), RNG.uniform(100.01, 1e4)]))
        words = words + [repr(value)]
    if value == "negative":
        value = [1.0, float(-RNG.uniform(0.01, 5))]
        words = words + [repr(value[1])]
    with pytest.raises(ValueError) as e:
        DemoConfig.from_values({name: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_checks_across_parameters_run_on_every_config():
    cfg = DemoConfig.from_values({"rate_hz": 2.0, "depth": 4})
    with pytest.raises(ValueError, match="depth 5 exceeds"):
        dataclasses.replace(cfg, depth=5)


def test_a_declaration_without_param_or_with_an_unknown_type_is_refused():
    with pytest.raises(TypeError, match="declare it with param"):
        class _Bare(NodeConfig, node="bare"):
            x: int = 3
    with pytest.raises(TypeError, match="parameter type 'dict'"):
        class _Dict(NodeConfig, node="dict"):
            x: dict = param(None, "d")
    with pytest.raises(TypeError, match="name the node"):
        class _Anonymous(NodeConfig):
            x: int = param(1, "x")
    with pytest.raises(ValueError, match="'x' = 7 is outside"):
        class _BadDefault(NodeConfig, node="bad_default"):
            x: int = param(7, "x", range=(0, 5))


@pytest.mark.parametrize("node", sorted(DECLARATIONS))
def test_every_node_declares_its_parameters_the_same_way(node):
    """Each node's declaration is one NodeConfig subclass in edgefm_ros/params, a field per parameter; its
    defaults make a config; every topic parameter defaults to a name of params/topics.py and follows the rule
    (the graph's own relative, the robot's absolute)."""
    cls = _declaration(node)
    assert issubclass(cls, NodeConfig) and cls.NODE == node
    assert [f.name for f in dataclasses.fields(cls)] == [s.name for s in cls.PARAMS]
    assert all(s.description.strip() for s in cls.PARAMS)
    names = {s.name for s in cls.PARAMS}
    assert {"diagnostics_period_s", "autostart"} <= names
    if node != "vla_node":  # vla_node needs a checkpoint, cameras and joints before its config is valid
        cls.from_values({})
    for s in cls.PARAMS:
        if not (s.name.endswith("_topic") or s.name.endswith("_topics")) or not s.default:
            continue
        for t in (s.default if isinstance(s.default, tuple) else (s.default,)):
            assert t in topics.GRAPH + topics.ROBOT, f"{node}.{s.name} = {t!r} is not a name of params/topics.py"


def test_the_topic_rule():
    assert all(not t.startswith("/") for t in topics.GRAPH) and all(t.startswith("/") for t in topics.ROBOT)
    assert topics.transport("/wrist/image_raw/compressed") == topics.transport("/a/compressed/") == "compressed"
    assert topics.transport("/wrist/image_raw") == topics.transport("/compressed_cam") == "raw"
    assert topics.transports(("/a", "/b/compressed")) == ("raw", "compressed")
    assert topics.transports(("/a", "/b"), ("compressed", "raw")) == ("compressed", "raw")
    with pytest.raises(ValueError, match="one entry per camera topic"):
        topics.transports(("/a", "/b"), ("raw",))
    assert topics.compressed("/scene/image_raw/") == "/scene/image_raw/compressed"
    # the drifted defaults, fixed: the three nodes that read the robot name the same topics
    vla, router, sim, action = (_declaration(n) for n in ("vla_node", "router_node", "sim_node", "action_node"))
    for name in ("instruction_topic",):
        assert vla.spec(name).default == router.spec(name).default == sim.spec(name).default == "/instruction"
    assert vla.spec("joint_states_topic").default == sim.spec("joint_states_topic").default == "/joint_states"
    assert action.spec("command_topic").default == sim.spec("command_topic").default == "/edgefm/command"


def test_vla_camera_keys_default_to_the_checkpoints_own():
    from edgefm_ros.params.vla import VlaNodeConfig

    base = dict(checkpoint="/m", camera_topics=["/top", "/wrist"], state_joint_names=["a", "b"])
    model = ("observation.images.scene", "observation.images.wrist")
    cfg = VlaNodeConfig.from_values(base)
    assert cfg.camera_keys == () and cfg.for_model(model, 2, 2).camera_keys == model  # the model's order
    given = VlaNodeConfig.from_values({**base, "camera_keys": list(model[::-1])})
    assert given.for_model(model, 2, 2).camera_keys == model[::-1]  # set: kept as given
    with pytest.raises(ValueError, match=r"checkpoint's 3 cameras .* camera_topics names 2"):
        cfg.for_model(model + ("observation.images.side",), 2, 2)
    with pytest.raises(ValueError, match=r"camera_keys \['observation.images.top'\] are not cameras of the model"):
        VlaNodeConfig.from_values({**base, "camera_keys": ["observation.images.top", model[1]]}).for_model(model, 2, 2)
    with pytest.raises(ValueError, match="state_joint_names has 2 names, the model's state_dim is 6"):
        cfg.for_model(model, 6, 2)


def test_the_parameter_declarations_import_no_ros(tmp_path):
    """The import contract of edgefm_ros/params holds, and it would see an import it forbids."""
    import tomllib

    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    contract = next(c for c in doc["tool"]["importlinter"]["contracts"] if c.get("source_modules") ==
                    ["edgefm_ros.params"])
    cfg = tmp_path / ".importlinter"

    def write(forbidden):
        cfg.write_text("[importlinter]\nroot_packages =\n    edgefm_ros\ninclude_external_packages = True\n\n"
                       "[importlinter:contract:params]\nname = params\ntype = forbidden\nsource_modules =\n"
                       "    edgefm_ros.params\nforbidden_modules =\n" + "".join(f"    {m}\n" for m in forbidden))

    write(contract["forbidden_modules"])
    r = lint(str(cfg), cwd=tmp_path)
    assert r.returncode == 0 and "KEPT" in r.stdout, r.stdout + r.stderr
    write(contract["forbidden_modules"] + ["edgefm_ros.control"])  # params/action.py imports control.aggregate
    r = lint(str(cfg), cwd=tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout and "edgefm_ros.params.action" in r.stdout, r.stdout


# ---- the rclpy side ---------------------------------------------------------------------------------------

@pytest.fixture
def ctx(ros, ros_domain_id):
    from rclpy.context import Context

    c = Context()
    ros.init(context=c, domain_id=ros_domain_id)
    yield c
    c.try_shutdown()


def test_declared_on_a_node_with_descriptions_ranges_and_read_only(ctx):
    import rclpy
    from rclpy.parameter import Parameter

    from edgefm_ros.ros.params import check_set, declare

    node = rclpy.create_node("params_probe", context=ctx, parameter_overrides=[Parameter("depth", value=4)])
    try:
        values = declare(node, DemoConfig.PARAMS)
        assert values["depth"] == 4 and values["topics_in"] == ("/x",) and values["gains"] == ()
        assert values["gain"] is None  # declared by its type alone: unset
        d = node.describe_parameter("rate_hz")
        assert d.read_only and d.floating_point_range[0].from_value == 1.0 and "Ticks per second" in d.description
        assert node.describe_parameter("depth").integer_range[0].to_value == 10
        assert "Choices: a, b" in node.describe_parameter("mode").description
        g = node.describe_parameter("gain")
        assert not g.read_only and not g.floating_point_range and "Range [-1.0, 1.0]" in g.description
        r = node.set_parameters([Parameter("rate_hz", value=20.0)])[0]
        assert not r.successful and "read-only" in r.reason
        bad = float(RNG.uniform(1.5, 9))
        with pytest.raises(ValueError, match=f"'gain' = {bad!r} is outside"):
            check_set(DemoConfig.PARAMS, [Parameter("gain", value=bad)])
        assert check_set(DemoConfig.PARAMS, [Parameter("gain", value=0.25), Parameter("other", value=1)]) == \
            {"gain": 0.25}
    finally:
        node.destroy_node()


def test_a_bad_declared_value_stops_the_node_naming_it(ctx):
    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.parameter import Parameter

    from edgefm_ros.ros.params import declare

    node = rclpy.create_node("params_probe_bad", context=ctx,
                             parameter_overrides=[Parameter("mode", value="zz")])
    try:
        with pytest.raises((ValueError, ParameterException), match="mode"):
            declare(node, DemoConfig.PARAMS)
    finally:
        node.destroy_node()


@pytest.mark.parametrize("node", sorted(DECLARATIONS))
def test_each_node_declares_exactly_its_declaration(ctx, node):
    """The parameters a node has after construction (autostart off) are its declaration's, read-only
    unless declared otherwise."""
    from rclpy.parameter import Parameter

    class_name = "".join(w.capitalize() for w in node.split("_"))  # vla_node -> VlaNode
    cls = getattr(importlib.import_module(f"edgefm_ros.nodes.{node}"), class_name)
    assert cls.CONFIG is _declaration(node)

    n = cls(context=ctx, parameter_overrides=[Parameter("autostart", value=False)])
    try:
        assert n.get_name() == node
        declared = set(n._parameters) - {"use_sim_time", "start_type_description_service"}  # rclpy's own
        assert declared == {s.name for s in cls.CONFIG.PARAMS}
        for s in cls.CONFIG.PARAMS:
            assert n.describe_parameter(s.name).read_only == s.read_only, s.name
        assert n.lifecycle_state == "unconfigured"
    finally:
        n.destroy_node()

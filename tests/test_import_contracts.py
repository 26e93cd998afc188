"""The import contracts of pyproject.toml ([tool.importlinter]): libraries without ROS (only ros/, nodes/ and
tools/ import it), models without the engines, kernel dispatch below the engines, kernels without models. A
contract that must break shows the checker sees these imports at all."""
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from skips import require_material

ROOT = Path(__file__).resolve().parents[1]


def lint(*args: str, cwd: Path = ROOT, path_first: Path | None = None) -> subprocess.CompletedProcess:
    """lint-imports; ``path_first``: a folder searched before everything else (a stand-in package tree)."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    require_material(Path(exe).is_file(), "lint-imports is not installed (requirements.txt pins import-linter)")
    paths = ([str(path_first)] if path_first else []) + [p for p in sys.path if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([exe, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_house_rules_hold():
    r = lint()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and r.stdout.count("KEPT") >= 4, r.stdout


def test_a_contract_that_must_break_does(tmp_path):
    cfg = tmp_path / ".importlinter"
    cfg.write_text("[importlinter]\nroot_packages =\n    edgefm_ros\ninclude_external_packages = True\n\n"
                   "[importlinter:contract:nodes-use-ros]\nname = nodes never import rclpy (false)\n"
                   "type = forbidden\nsource_modules =\n    edgefm_ros.nodes\nforbidden_modules =\n    rclpy\n")
    r = lint(str(cfg), cwd=tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout and "rclpy" in r.stdout, r.stdout + r.stderr


def contract_in_stand_in(where: Path, name_start: str, modules: dict[str, str]) -> subprocess.CompletedProcess:
    """The pyproject.toml contract whose name starts with ``name_start``, exactly as written there, checked on a
    stand-in tree of the same package names under ``where``: every module of the project the contract names
    (empty) plus ``modules`` (dotted name -> source)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    found = [c for c in cfg["contracts"] if c["name"].startswith(name_start)]
    assert len(found) == 1, f"{name_start!r} names {len(found)} contracts of pyproject.toml"
    named = [m for key in ("source_modules", "forbidden_modules", "layers") for m in found[0].get(key, [])]
    tree = where / "src"
    for name in [*cfg["root_packages"], *named, *modules]:
        if name.split(".")[0] not in cfg["root_packages"]:
            continue  # an external package (rclpy): only imported
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            pkg = tree.joinpath(*parts[:i])
            pkg.mkdir(parents=True, exist_ok=True)
            (pkg / "__init__.py").touch()
    for name, source in modules.items():
        (tree.joinpath(*name.split(".")) / "__init__.py").write_text(source)
    toml = where / "contract.toml"
    lines = ["[tool.importlinter]", f"root_packages = {json.dumps(cfg['root_packages'])}",
             f"include_external_packages = {str(cfg['include_external_packages']).lower()}", "",
             "[[tool.importlinter.contracts]]", "id = \"under_test\""]
    lines += [f"{key} = {json.dumps(value)}" for key, value in found[0].items()]
    toml.write_text("\n".join(lines) + "\n")
    return lint(str(toml), cwd=where, path_first=tree)


def test_only_ros_nodes_and_tools_import_ros(tmp_path):
    name = "Only ros/, nodes/ and tools/ import ROS"
    kept = contract_in_stand_in(tmp_path / "kept", name, {
        "edgefm_ros.ros.helper": "import rclpy\nfrom std_msgs.msg import String\n",
        "edgefm_ros.nodes.node": "from sensor_msgs.msg import Image\n",
        "edgefm_ros.sensors.cache": "import numpy\n"})
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    # a ROS import inside a function of a ROS-free package (as a lazy import would be) breaks it
    broken = contract_in_stand_in(tmp_path / "broken", name, {
        "edgefm_ros.sensors.cache": "def spin():\n    import rclpy\n    return rclpy\n"})
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    assert "edgefm_ros.sensors.cache" in broken.stdout and "rclpy" in broken.stdout, broken.stdout



def test_the_ros_contract_names_every_package_but_ros_nodes_and_tools():
    """A package added to edgefm_ros is bound to no ROS unless the contract is changed on purpose."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    found = [c for c in cfg["contracts"] if c["name"].startswith("Only ros/, nodes/ and tools/ import ROS")]
    assert len(found) == 1
    tree = ROOT / "edgefm_ros"
    present = {f"edgefm_ros.{p.name}" for p in tree.iterdir() if (p / "__init__.py").is_file()}
    present |= {f"edgefm_ros.{p.stem}" for p in tree.glob("*.py") if p.name != "__init__.py"}
    allowed = {"edgefm_ros.ros", "edgefm_ros.nodes", "edgefm_ros.tools"}
    assert set(found[0]["source_modules"]) == present - allowed | {"edgefm_kernels"}

def test_dispatch_lies_below_the_engines(tmp_path):
    name = "Kernel dispatch lies below the engines"
    kept = contract_in_stand_in(tmp_path / "kept", name, {
        "edgefm_ros.dispatch.table": "",
        "edgefm_ros.runtime.engine": "from edgefm_ros.dispatch import table\n",
        "edgefm_ros.generation.generate": "from edgefm_ros.dispatch import table\nfrom edgefm_ros.runtime import engine\n"})
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    broken = contract_in_stand_in(tmp_path / "broken", name, {
        "edgefm_ros.dispatch.table": "from edgefm_ros.runtime import engine\n",
        "edgefm_ros.runtime.engine": "from edgefm_ros.generation import generate\n",
        "edgefm_ros.generation.generate": ""})
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    for edge in ("edgefm_ros.dispatch.table -> edgefm_ros.runtime.engine",
                 "edgefm_ros.runtime.engine -> edgefm_ros.generation.generate"):
        assert edge in broken.stdout, broken.stdout



def test_no_import_cycle_in_tools(tmp_path):
    name = "No import cycle in tools/"
    kept = contract_in_stand_in(tmp_path / "kept", name, {
        "edgefm_ros.tools.graph": "from edgefm_ros.tools.bag import play\n",
        "edgefm_ros.tools.bag.play": "",
        "edgefm_ros.tools.demo": "from edgefm_ros.tools import graph\n",
        "edgefm_ros.tools.launch_cycles": "from edgefm_ros.tools import graph\n"})
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    # the cycle the tools had: launch_cycles -> demo -> bag.session -> launch_cycles, through lazy imports
    broken = contract_in_stand_in(tmp_path / "broken", name, {
        "edgefm_ros.tools.demo": "def choose():\n    from edgefm_ros.tools.bag import session\n",
        "edgefm_ros.tools.bag.session": "def alive():\n    from edgefm_ros.tools.launch_cycles import alive\n",
        "edgefm_ros.tools.launch_cycles": "def prepare():\n    from edgefm_ros.tools import demo\n"})
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    assert "No cycles are allowed in edgefm_ros.tools" in broken.stdout, broken.stdout
    assert any(e in broken.stdout for e in (".demo -> .bag", ".bag -> .launch_cycles", ".launch_cycles -> .demo")), \
        broken.stdout  # the edge to remove is one of the cycle's


def test_libraries_import_no_tool(tmp_path):
    name = "Libraries import no tool"
    kept = contract_in_stand_in(tmp_path / "kept", name, {
        "edgefm_ros.training.random_checkpoint": "",
        "edgefm_ros.training.export": "from edgefm_ros.training import random_checkpoint\n",
        "edgefm_ros.tools.demo": "from edgefm_ros.training import random_checkpoint\n"})
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    # what training/export.py once did: a library importing a tool (make_checkpoint, then in tools/)
    broken = contract_in_stand_in(tmp_path / "broken", name, {
        "edgefm_ros.tools.make_checkpoint": "",
        "edgefm_ros.training.export": "from edgefm_ros.tools.make_checkpoint import policy_config\n"})
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    assert "edgefm_ros.training.export -> edgefm_ros.tools.make_checkpoint" in broken.stdout, broken.stdout


def test_the_action_side_imports_no_cloud_code(tmp_path):
    name = "The action side (control) imports no cloud code"
    kept = contract_in_stand_in(tmp_path / "kept", name, {
        "edgefm_ros.control.rtc": "",
        "edgefm_ros.cloud.images": "",
        "edgefm_ros.placement.vla": "from edgefm_ros.cloud.images import Encoding\n"
                                    "from edgefm_ros.control import rtc\n"})
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    # what control/placement.py once did: the action side encoding images for the cloud (lazily, here)
    broken = contract_in_stand_in(tmp_path / "broken", name, {
        "edgefm_ros.cloud.images": "",
        "edgefm_ros.control.placement": "def encode():\n    from edgefm_ros.cloud.images import Encoding\n"})
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    assert "edgefm_ros.control.placement -> edgefm_ros.cloud.images" in broken.stdout, broken.stdout


def test_placement_imports_no_ros_nodes_or_tools(tmp_path):
    name = "Where a request runs (placement) imports no ROS"
    kept = contract_in_stand_in(tmp_path / "kept", name, {
        "edgefm_ros.placement.vla": "import numpy\n",
        "edgefm_ros.nodes.vla_node": "import rclpy\nfrom edgefm_ros.placement import vla\n"})
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    # a ROS message or a ros/ helper in placement/ (e.g. the link-sample publisher, which lives in ros/)
    broken = contract_in_stand_in(tmp_path / "broken", name, {
        "edgefm_ros.ros.link_samples": "",
        "edgefm_ros.placement.vla": "from std_msgs.msg import Float64MultiArray\n",
        "edgefm_ros.placement.vla_build": "from edgefm_ros.ros.link_samples import LinkSamples\n"})
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    for edge in ("edgefm_ros.placement.vla -> std_msgs",
                 "edgefm_ros.placement.vla_build -> edgefm_ros.ros.link_samples"):
        assert edge in broken.stdout, broken.stdout

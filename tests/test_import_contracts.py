"""The import contracts of pyproject.toml ([tool.importlinter]): libraries without ROS, models without the
runtime, kernels without models. A contract that must break shows the checker sees these imports at all."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from skips import require_material

ROOT = Path(__file__).resolve().parents[1]


def lint(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    require_material(Path(exe).is_file(), "lint-imports is not installed (requirements.txt pins import-linter)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
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

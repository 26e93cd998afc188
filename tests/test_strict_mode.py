"""Strict mode (tests/skips.py): a material skip fails the run, an allowed one passes; -rs lists both."""
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CASES = '''
import pytest
from skips import require_material, require_module, skip_hardware

def test_material():
    require_material(False, "the reference folder is missing")

def test_plain_skip():
    pytest.skip("nginx not installed")

def test_allowed():
    skip_hardware("cpu-isa", "this CPU lacks AVX-512")

def test_forged_kind():
    pytest.skip("[not-a-kind] looks allowed")

def test_runs():
    assert require_module("json").dumps(1) == "1"
'''


def run(tmp_path, strict: bool):
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_collect_skip.py").write_text(
        "import pytest\npytest.importorskip('no_such_module_edgefm')\ndef test_never():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "EDGEFM_STRICT_TESTS": "1" if strict else "0"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "skips", "-p", "no:cacheprovider", "-p", "no:launch_testing", "-p", "no:launch_ros", "-rs", "-q", "--continue-on-collection-errors",
                        "--rootdir", str(tmp_path), str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_strict_fails_material_skips_only(tmp_path):
    rc, out = run(tmp_path, strict=True)
    assert rc != 0, out
    tail = out.strip().splitlines()[-1]
    # material: test_material, test_plain_skip, test_forged_kind fail; the module skip is a collection error
    assert "3 failed" in tail and "1 passed" in tail and "1 skipped" in tail and "1 error" in tail, out
    assert "the reference folder is missing" in out and "no_such_module_edgefm" in out
    assert "skips by kind (strict): cpu-isa 1" in out


def test_not_strict_skips_everything_and_says_so(tmp_path):
    rc, out = run(tmp_path, strict=False)
    assert rc == 0, out
    assert "1 passed" in out and "5 skipped" in out, out
    assert "cpu-isa 1, material 4" in out

"""The one error-handling main of the console scripts (housekeeping/cli.py): a user's bad value is one line
on stderr naming it and exit code 2, Ctrl-C is 130, a bug keeps its traceback; every console script uses it."""
import importlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgefm_ros.housekeeping.cli import EXIT_INTERRUPTED, EXIT_USAGE, cli_main

ROOT = Path(__file__).resolve().parents[2]


def console_scripts() -> dict[str, str]:
    """name -> "module:function", as setup.py declares them (read as text)."""
    return dict(re.findall(r"[\"'](edgefm-[a-z0-9-]+)=([\w.]+:\w+)[\"']", (ROOT / "setup.py").read_text()))


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=ROOT, **kw)


def test_every_console_script_uses_the_wrapper():
    scripts = console_scripts()
    assert {"edgefm-vla", "edgefm-bag", "edgefm-router", "edgefm-demo", "edgefm-llm", "edgefm-sim", "edgefm-cloud",
            "edgefm-shm-clean"} <= set(scripts), scripts
    for name, target in scripts.items():
        module, fn = target.split(":")
        main = getattr(importlib.import_module(module), fn)
        # functools.wraps of cli_main's wrapper: the undecorated main underneath, and the wrapper's own code
        assert hasattr(main, "__wrapped__") and main.__code__ is cli_main("x")(lambda a: 0).__code__, name


def test_a_bad_value_is_one_line_and_exit_2(tmp_path):
    """The real console script in its own process, as a user runs it."""
    r = run(str(Path(sys.executable).parent / "edgefm-vla"), "make-checkpoint", "--out", str(tmp_path / "ck"),
            "--cameras", "0")
    assert r.returncode == EXIT_USAGE, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == ["edgefm-vla make-checkpoint: error: cameras must be in 1..8, got 0"], r.stderr
    assert not (tmp_path / "ck").exists()


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nope.jsonl"
    r = run(str(Path(sys.executable).parent / "edgefm-router"), "calibrate", "--log", str(missing),
            "--out", str(tmp_path / "out.yaml"))
    assert r.returncode == EXIT_USAGE, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgefm-router calibrate: error:") and str(missing) in lines[0], r.stderr


def test_ctrl_c_is_130_without_a_traceback():
    code = ("import time\nfrom edgefm_ros.housekeeping.cli import cli_main\n"
            "@cli_main('edgefm-test')\ndef main(argv=None):\n    print('ready', flush=True)\n    time.sleep(60)\n"
            "raise SystemExit(main([]))\n")
    # SIGINT's default action restored in the child: a test run started as a background job of a
    # non-interactive shell ignores SIGINT, and its children inherit that (Python then installs no handler)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == EXIT_INTERRUPTED, err
    assert err.strip() == "edgefm-test: interrupted", err


def test_the_wrapper_in_process(capsys):
    @cli_main("edgefm-x", subcommands=True, errors=(RuntimeError,))
    def main(argv=None):
        if argv[1] == "value":
            raise ValueError("--rate must be > 0, got -1\n(see --help)")
        if argv[1] == "runtime":
            raise RuntimeError("nodes ['vla_node'] not active")
        if argv[1] == "bug":
            raise TypeError("a bug")
        return None

    assert main(["run", "value"]) == 2
    assert capsys.readouterr().err == "edgefm-x run: error: --rate must be > 0, got -1; (see --help)\n"
    assert main(["run", "runtime"]) == 2 and "not active" in capsys.readouterr().err
    assert main(["run", "fine"]) == 0
    with pytest.raises(TypeError):  # a bug is not the user's error: its traceback stays
        main(["run", "bug"])

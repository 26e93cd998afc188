"""Launch tests with the real ``ros2 launch`` (installed from ../shared/ros2-jazzy by setup.sh; skipped
without it): each launch file comes up, its lifecycle nodes reach active, commands flow at the configured
rate as a separate subscriber process measures it (the launch's recorder; ``ros2 topic hz`` in the CLI
tests), and SIGINT and SIGTERM end every
process with exit code 0 within a bound, none left running. edgefm.launch.py is also driven by the CLI
tests (test_ros2_cli.py: autostart false, lifecycle set/get, SIGINT at the end)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from launch_helpers import DiagnosticsObserver, need_ros2_launch, ros2, write_params
from replay_helpers import COMMAND_TOPIC, assert_at_rate

BOUND_S = 15.0  # SIGINT -> every process gone (ros2 launch escalates to SIGTERM after 5 s, SIGKILL after 10 s)


@pytest.fixture
def launch_ready(ros):
    need_ros2_launch()


def test_show_args_lists_and_explains_every_argument(launch_ready):
    from edgefm_ros.ros.launch_args import ARGS

    for file in ("edgefm.launch.py", "replay.launch.py"):
        r = ros2("launch", "edgefm_ros", file, "--show-args")
        assert r.returncode == 0, r.stderr
        for a in ARGS:
            assert f"'{a.name}':" in r.stdout, f"{file}: {a.name} missing"
            assert a.description.split(".")[0][:60] in " ".join(r.stdout.split()), f"{file}: {a.name} unexplained"


def test_replay_launch_comes_up_commands_at_rate_and_sigint_ends_all(launch_ready, tiny_model, short_bag,
                                                                      tmp_path, ros_domain_id):
    from edgefm_ros.tools.bag.analyze import command_timing, read_run
    from edgefm_ros.tools.graph import LaunchedGraph

    params = write_params(tmp_path / "params.yaml", tiny_model)
    obs = DiagnosticsObserver(ros_domain_id)
    g = LaunchedGraph("replay.launch.py", {"bag": short_bag, "record": str(tmp_path / "record"), "params_file": params,
                                           "use_router": "true", "play_delay_s": "2.0"}, tmp_path / "launch.log")
    try:
        g.wait_ready(("vla_node", "action_node", "router_node"), timeout=90)
        diags = {n: obs.wait(n, lambda v: v.get("state") == "active") for n in ("vla_node", "action_node")}
        time.sleep(6.0)  # the bag starts 2 s after launch; the first chunk follows
        started = g.started()
    finally:
        result = g.stop(signal.SIGINT, "launch", BOUND_S)
        obs.close()
    assert {n: d.get("state") for n, d in diags.items()} == {"vla_node": "active", "action_node": "active"}
    # the rate, from the command stamps the launch's recorder process received
    run = read_run(str(tmp_path / "record"), COMMAND_TOPIC)
    assert len(run.chunk_seq) >= 2, "no chunks recorded"
    timing = command_timing(run, 1 / 50, run.chunk_recv[0] + 0.5)
    assert timing["commands"] > 100, timing
    assert_at_rate(timing, 50.0, diags["action_node"].get("realtime") == "true")
    assert {"vla_node", "action_node", "router_node", "edgefm-bag"} <= set(started)
    assert result.abnormal() == [], (result, g.log)
    assert set(result.codes.values()) == {0} and result.launch_rc == 0
    assert result.survivors == [] and result.seconds < BOUND_S
    assert (tmp_path / "record" / "metadata.yaml").is_file(), "the recorder did not close its bag on SIGINT"


def _cycles(tmp_path, ros_domain_id, *args) -> str:
    r = subprocess.run([sys.executable, "-m", "edgefm_ros.tools.launch_cycles", "--workdir", str(tmp_path),
                        "--domain-id", str(ros_domain_id), "--up-timeout-s", "90", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    # every way out leaves /dev/shm as it was: no Fast DDS file the run made and nobody uses, no process
    assert "stale files left: 0; processes left: 0" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.parametrize("kill", ["KILL", "TERM"])
def test_cycles_script_ctrl_c_and_restarts_leave_nothing(launch_ready, tmp_path, ros_domain_id, kill):
    """The 20-cycle script, shortened: Ctrl-C (SIGINT to the whole process group) mid-replay, twice; in the
    first cycle vla_node is killed twice (SIGKILL, as a supervisor kills a hung node; SIGTERM) and launch
    restarts it (respawn:=true) each time."""
    out = _cycles(tmp_path, ros_domain_id, "--cycles", "2", "--signal", "INT", "--target", "group",
                  "--kills", "2", "--kill-signal", kill)
    assert out.count("cycle ") == 2 and "ABNORMAL" not in out, out
    assert "abnormal exits: 0" in out, out
    assert f"vla_node SIG{kill} x2: abnormal 0; restarted 2/2" in out, out
    assert "within" in out.splitlines()[-1], out


@pytest.mark.parametrize("graph,target", [("replay", "group"), ("robot", "launch")])
def test_sigterm_ends_every_node_with_exit_0(launch_ready, tmp_path, ros_domain_id, graph, target):
    """SIGTERM to every process (systemd stopping a service) and to ``ros2 launch`` alone (docker stop):
    upstream ``ros2 launch`` dies at once on SIGTERM; the nodes end cleanly, the orphaned ones because
    their launcher died (the script is their subreaper: their exit codes are known)."""
    out = _cycles(tmp_path, ros_domain_id, "--cycles", "1", "--signal", "TERM", "--target", target,
                  "--graph", graph)
    line = next(ln for ln in out.splitlines() if ln.startswith("cycle 1/1"))
    assert "vla_node=0" in line and "action_node=0" in line and "router_node=0" in line, out
    assert "abnormal exits: 0" in out, out

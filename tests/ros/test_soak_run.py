"""The soak, as CI can afford it: three minutes of the simulated closed loop through ros2 launch and the real
nodes (the committed checkpoint), sampled every 20 s, judged by the same rules as the hour with a one-minute
warm-up (benchmarks/soak.py --check): no node's RSS grows 2 % after the warm-up, fds, threads and /dev/shm
stay flat, the control loop keeps its period, success holds, and nothing is left after the stop."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch_helpers import need_ros2_launch

ROOT = Path(__file__).resolve().parents[2]


def test_three_minute_soak_passes_every_rule(ros, tmp_path, ros_domain_id):
    need_ros2_launch()
    pytest.importorskip("metaworld", reason="the simulator (metaworld, mujoco) is not installed")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "3", "--window-s", "20",
                        "--warmup-min", "1", "--out", str(tmp_path), "--domain-id", str(ros_domain_id), "--check"],
                       capture_output=True, text=True, timeout=420)
    report = json.loads((tmp_path / "soak.json").read_text())
    failed = {k: v["measured"] for k, v in report["verdict"].items() if not v["ok"]}
    assert r.returncode == 0 and not failed, f"{failed}\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    rows = report["rows"]
    assert len(rows) >= 8 and {"sim_node", "vla_node", "action_node"} <= set(rows[-1]["nodes"])
    assert sum(x["episodes_done"] for x in rows) >= 40, "the loop ran too few episodes to judge success"
    assert (tmp_path / "soak.svg").read_text().startswith("<svg")

"""Fixtures of the ROS tests: the ROS environment (skip cleanly without it), the tiny reference model and
a short synthetic bag."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the suite imports test files by path (--import-mode=importlib): make replay_helpers.py importable
sys.path.insert(0, str(Path(__file__).resolve().parent))
from skips import require_material, require_module  # noqa: E402


@pytest.fixture(scope="session")
def ros():
    """rclpy and the built messages, or skip."""
    rclpy = require_module("rclpy", "rclpy (ROS 2 Jazzy wheels) is not installed")
    require_module("edgefm_ros.msg", "edgefm_ros.msg is not built (run scripts/setup.sh)")
    require_module("rosbags", "rosbags is not installed")
    return rclpy


@pytest.fixture(scope="session")
def tiny_model(shared_reference):
    ckpt, vlm = shared_reference / "smolvla-tiny", shared_reference / "vlm" / "smolvlm-tiny"
    require_material((ckpt / "config.json").is_file(), f"tiny reference checkpoint missing at {ckpt}")
    return str(ckpt), str(vlm)


@pytest.fixture(scope="session")
def short_bag(ros, tmp_path_factory):
    """8 s of two 64x48 cameras (raw + JPEG) at 30 Hz, joint states at 100 Hz, two instructions."""
    from edgefm_ros.tools.bag.make import MakeConfig, make_bag

    path = tmp_path_factory.mktemp("bags") / "short"
    make_bag(MakeConfig(str(path), duration_s=8.0, cameras=2, width=64, height=48))
    return str(path)

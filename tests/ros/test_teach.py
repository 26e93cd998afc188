"""``edgefm-sim teach``: sim_node, the teleoperation device and ``edgefm-bag record`` as real processes over DDS.
The bag holds what a converter needs (every topic, stamps, one episode per task and seed between its events),
the device's commands reached the arm through the command topic, and both storages are written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgefm_ros.tools.teach import (OPERATOR, RECORD_TOPICS, STORAGES, TeachConfig, bag_summary, run_teach,
                                    teach_params)


@pytest.fixture(scope="module")
def sim(ros):
    pytest.importorskip("metaworld", reason="the simulator (metaworld, mujoco) is not installed")
    return ros


def _stamps(bag, topic):
    """(receive time, header stamp, message) of one topic."""
    from edgefm_ros.tools.sim_ros import read_topic

    return [(t, m.header.stamp.sec + m.header.stamp.nanosec * 1e-9, m) for t, m in read_topic(bag, topic)]


def test_teach_records_one_episode_per_task_and_seed(sim, tmp_path, ros_domain_id):
    bag = tmp_path / "demos"
    cfg = TeachConfig(tasks=("reach", "drawer-open"), seeds=(3, 4), bag=str(bag), domain_id=ros_domain_id,
                      noise_m=0.002)
    lines = []
    summary = run_teach(cfg, workdir=tmp_path / "logs", progress=lines.append)
    # progress: one line per episode, then the summary
    assert sum("[teach] [" in m for m in lines) == 4 and any("done in" in m for m in lines)
    assert set(summary["topics"]) == set(RECORD_TOPICS)
    assert summary["types"]["/edgefm/command"] == "trajectory_msgs/msg/JointTrajectory"
    assert summary["types"]["/scene/image_raw"] == "sensor_msgs/msg/Image"
    eps = summary["episodes"]
    assert [(e["task"], e["seed"]) for e in eps] == [("reach", 3), ("reach", 4), ("drawer-open", 3), ("drawer-open", 4)]
    assert summary["successes"] == 4, eps
    # the commands: stamped, named like the arm's joints, inside the episodes, at the device's rate
    cmds = _stamps(bag, "/edgefm/command")
    assert all(list(m.joint_names) == ["ee_x", "ee_y", "ee_z", "gripper"] for _, _, m in cmds)
    st = np.array([s for _, s, _ in cmds])
    assert np.all(np.diff(st) > 0)
    for e in eps:
        inside = st[(st >= e["start"]) & (st <= e["end"] + 0.1)]
        assert len(inside) >= 0.6 * 20 * (e["end"] - e["start"]), (e, len(inside))
        assert inside[0] - e["start"] < 0.3  # the device starts at once
    between = [s for s in st if not any(e["start"] <= s <= e["end"] + 0.1 for e in eps)]
    assert between == []  # nothing is sent between episodes
    # each command answers one scene: it carries the stamp of the ground truth it was made from, which sim_node
    # published with the joint state of that instant (a few joint states may be lost on the best-effort topic)
    js = {(m.header.stamp.sec, m.header.stamp.nanosec) for _, _, m in _stamps(bag, "/joint_states")}
    paired = [(m.header.stamp.sec, m.header.stamp.nanosec) in js for _, _, m in cmds]
    assert sum(paired) >= 0.9 * len(paired), (sum(paired), len(paired))
    # cameras and joint states carry stamps through every episode
    for topic in ("/scene/image_raw", "/wrist/image_raw", "/joint_states"):
        s = np.array([x for _, x, _ in _stamps(bag, topic)])
        for e in eps:
            n = ((s >= e["start"]) & (s <= e["end"])).sum()
            assert n >= (25 if "image" in topic else 80) * (e["end"] - e["start"]) * 0.7, (topic, e, n)
    # the arm moved because of those commands: sim_node applied them (it counts what came over the topic)
    results = [json.loads(x) for x in (tmp_path / "logs" / "episodes.jsonl").read_text().splitlines()]
    assert [r["rejected_commands"] for r in results] == [0] * 4
    assert all(r["commands"] >= 0.8 * len(st[(st >= e["start"]) & (st <= e["end"])]) for r, e in zip(results, eps))
    assert "teaching reach seed 3" in (tmp_path / "logs" / "operator.log").read_text()


def test_teach_writes_sqlite3_too_and_refuses_a_bag_that_exists(sim, tmp_path, ros_domain_id):
    bag = tmp_path / "demos"
    summary = run_teach(TeachConfig(tasks=("reach",), seeds=(5,), bag=str(bag), storage="sqlite3",
                                    domain_id=ros_domain_id), progress=None)
    assert list(bag.glob("*.db3")) and summary["successes"] == 1
    assert bag_summary(bag)["episodes"] == summary["episodes"]
    with pytest.raises(ValueError, match="already exists"):
        TeachConfig(tasks=("reach",), seeds=(5,), bag=str(bag))


def test_the_device_commands_like_action_node(ros):
    """The same topic, type and message for one action as action_node publishes (all three command types)."""
    from builtin_interfaces.msg import Time

    from edgefm_ros.nodes import action_node
    from edgefm_ros.ros.commands import command_fields
    from edgefm_ros.tools import teleop_node

    assert teleop_node.command_msg is action_node.command_msg and teleop_node.COMMAND_MSG is action_node.COMMAND_MSG
    names, pos, stamp = ("ee_x", "ee_y", "ee_z", "gripper"), [0.1, 0.6, 0.2, -1.0], Time(sec=5, nanosec=7)
    for kind in ("joint_trajectory", "float64_multi_array", "joint_state"):
        got = command_fields(teleop_node.command_msg(kind, names, pos, stamp, 0.05))
        assert got[1] == pos and got[0] in ([], list(names))
    p = teach_params(TeachConfig(tasks=("reach",), seeds=(0,), bag="unused"))
    s, o = p["sim_node"], p[OPERATOR]
    assert (o["command_topic"], o["command_type"], o["joint_names"]) == \
        (s["command_topic"], s["command_type"], s["joint_names"])
    assert o["ground_truth_topic"] == s["ground_truth_topic"] and o["events_topic"] == s["events_topic"]


def test_teach_config_names_bad_values():
    from edgefm_ros.tools import teleop_node
    from edgefm_ros.tools.bag.make import STORAGES as RECORDER_STORAGES

    assert set(STORAGES) == set(RECORDER_STORAGES) and OPERATOR == teleop_node.NODE_NAME
    with pytest.raises(ValueError, match="unknown task 'fly'"):
        TeachConfig(tasks=("fly",), seeds=(0,), bag="x")
    with pytest.raises(ValueError, match="storage"):
        TeachConfig(tasks=("reach",), seeds=(0,), bag="x", storage="bag")
    with pytest.raises(ValueError, match="seed twice"):
        TeachConfig(tasks=("reach",), seeds=(1, 1), bag="x")
    with pytest.raises(ValueError, match="noise_m"):
        TeachConfig(tasks=("reach",), seeds=(1,), bag="x", noise_m=0.2)

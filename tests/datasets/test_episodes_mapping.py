"""Episode cues (events, instruction changes, gaps; the report says which) and the topic mapping (YAML,
command line, joint order, other message types, defaults that match the nodes' parameters)."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bags import make_bag  # noqa: E402

from edgefm_ros.datasets.bagread import scan_bag  # noqa: E402
from edgefm_ros.datasets.convert import ConvertConfig, convert_bags  # noqa: E402
from edgefm_ros.datasets.episodes import split_episodes  # noqa: E402
from edgefm_ros.datasets.errors import RecordingError  # noqa: E402
from edgefm_ros.datasets.mapping import (DatasetMapping, VectorSource, load_mapping,  # noqa: E402
                                         mapping_from_dict, parse_camera_arg)
from edgefm_ros.datasets.reader import read_lerobot_dataset  # noqa: E402
from edgefm_ros.datasets.synthbag import arm_state  # noqa: E402
from edgefm_ros.tools.bag_cli import main as bag_main  # noqa: E402

NS = 10**9
T0 = 1_700_000_000 * NS
EPISODES = (("reach", 1.2), ("push", 1.0), ("reach", 1.1))  # the same task twice: only events tell them apart


def _split(bag, **kw):
    m = DatasetMapping(**kw)
    return split_episodes(scan_bag(bag, m), m.gap_s, m.task)


def test_events_split_and_carry_outcome_task_and_seed(tmp_path):
    bag = make_bag(tmp_path, episodes=EPISODES)
    spans, cue = _split(bag)
    assert cue == "events" and len(spans) == 3
    assert [(s.start_ns - T0) / NS for s in spans] == pytest.approx([0.0, 1.7, 3.2], abs=1e-6)
    assert [(s.end_ns - T0) / NS for s in spans] == pytest.approx([1.2, 2.7, 4.3], abs=1e-6)
    assert [s.task_name for s in spans] == ["reach", "push", "reach"] and [s.seed for s in spans] == [1000, 1001, 1002]
    assert all(s.outcome == "success" for s in spans)


def test_instruction_changes_split_when_there_are_no_events(tmp_path):
    bag = make_bag(tmp_path, episodes=EPISODES, events=False)
    spans, cue = _split(bag)
    # three instructions, two distinct consecutive changes... and a third: reach -> push -> reach
    assert cue == "instruction" and [s.task for s in spans] == ["Reach the red target.", "Push the puck to the goal.",
                                                               "Reach the red target."]
    # from the first state message at or after the instruction's receive time (1.702-1.703 s): 1.71 s
    assert (spans[1].start_ns - T0) / NS == pytest.approx(1.71, abs=1e-6)
    assert spans[0].end_ns < spans[1].start_ns and all(s.outcome == "" for s in spans)


def test_a_repeated_instruction_does_not_split_but_a_pause_does(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0), ("reach", 1.0)), events=False, pause_s=2.0)
    spans, cue = _split(bag)
    assert cue == "instruction" and len(spans) == 2  # the same text twice: the 2 s pause ends the first
    bag2 = make_bag(tmp_path, "nopause", episodes=(("reach", 1.0), ("reach", 1.0)), events=False)
    assert len(_split(bag2)[0]) == 1


def test_gaps_split_without_events_or_instruction(tmp_path):
    bag = make_bag(tmp_path, episodes=EPISODES, events=False, instruction=False, pause_s=1.5)
    with pytest.raises(RecordingError, match="no task text .* give one with --task"):
        _split(bag)
    spans, cue = _split(bag, task="Do the thing.")
    assert cue == "gaps" and len(spans) == 3 and {s.task for s in spans} == {"Do the thing."}
    # a longer gap threshold joins them
    assert len(_split(bag, task="x", gap_s=2.0)[0]) == 1
    r = convert_bags([bag], tmp_path / "ds", DatasetMapping(task="Do the thing."), ConvertConfig())
    assert r.bags[0]["split_by"] == "gaps" and r.episodes == 3
    assert "split by gaps" in r.lines()[1]


def test_yaml_mapping_picks_and_orders_joints(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0),), command_type="joint_state")
    f = tmp_path / "map.yaml"
    f.write_text(yaml.safe_dump({
        "fps": 10, "max_age_s": 0.2,
        "state": {"topic": "/joint_states", "joints": ["gripper", "ee_x"]},
        "action": {"topic": "/edgefm/command", "joints": "ee_z, ee_y"},
        "cameras": {"front": "/wrist/image_raw"}}))
    m = load_mapping(f)
    assert m.fps == 10 and m.state.joints == ("gripper", "ee_x") and [c.key for c in m.cameras] == [
        "observation.images.front"]
    convert_bags([bag], tmp_path / "ds", m, ConvertConfig(fps=10, chunk_size=8))
    ds = read_lerobot_dataset(tmp_path / "ds")
    info = ds.info["features"]
    assert info["observation.state"]["names"] == ["gripper", "ee_x"] and info["action"]["names"] == ["ee_z", "ee_y"]
    assert list(ds.images) == ["front"]
    x0 = arm_state(0.0)
    np.testing.assert_array_equal(ds.state[0], x0[[3, 0]].astype(np.float32))
    np.testing.assert_array_equal(ds.action[0], arm_state(0.05)[[2, 1]].astype(np.float32))


def test_float64_multi_array_commands_use_the_bag_clock(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0),), command_type="float64_multi_array")
    m = DatasetMapping(action=VectorSource("/edgefm/command", ("ee_x", "ee_y", "ee_z", "gripper")))
    scan = scan_bag(bag, m)
    assert scan.action.clock == "bag" and scan.state.clock == "header"
    r = convert_bags([bag], tmp_path / "ds", m, ConvertConfig(chunk_size=8))
    # receive time is 2-3 ms after the stamp: a tick on the command grid still sees the previous command
    assert r.bags[0]["streams"]["action"]["skew_p50_ms"] > 40


def test_missing_joint_is_named(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0),))
    m = DatasetMapping(state=VectorSource("/joint_states", ("ee_x", "elbow")))
    with pytest.raises(RecordingError, match=r"topic /joint_states at t=1700000000.000000000 s .* joint\(s\) "
                                             r"\['elbow'\] not in the message"):
        convert_bags([bag], tmp_path / "ds", m)


def test_bag_clock_and_cli_overrides(tmp_path, capsys):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0),), events=False)
    rc = bag_main(["to-dataset", str(bag), "--out", str(tmp_path / "ds"), "--clock", "bag", "--fps", "10",
                   "--chunk-size", "5", "--camera", "left=/scene/image_raw", "--state-joints", "ee_z,ee_x",
                   "--events-topic", "", "--images"])
    assert rc == 0, capsys.readouterr().err
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert list(k for k in info["features"] if k.startswith("observation.images")) == ["observation.images.left"]
    assert info["features"]["observation.state"]["names"] == ["ee_z", "ee_x"]
    rep = json.loads((tmp_path / "ds/meta/conversion_report.json").read_text())
    assert rep["mapping"]["clock"] == "bag" and rep["bags"][0]["split_by"] == "instruction"
    eps = pd.read_parquet(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert eps["outcome"].tolist() == ["unknown"]


def test_mapping_validation():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['camera'\]"):
        mapping_from_dict({"camera": {}})
    with pytest.raises(ValueError, match="clock must be one of"):
        mapping_from_dict({"clock": "wall"})
    with pytest.raises(ValueError, match="a topic feeds two features"):
        mapping_from_dict({"cameras": {"a": "/joint_states"}})
    with pytest.raises(ValueError, match="max_age_s must be a positive"):
        mapping_from_dict({"state": {"topic": "/js", "max_age_s": 0}})
    with pytest.raises(ValueError, match="KEY=TOPIC"):
        parse_camera_arg("scene")
    assert parse_camera_arg("wrist=/w/img").key == "observation.images.wrist"
    with pytest.raises(ValueError, match="fps must be a positive whole number"):
        ConvertConfig(fps=12.5)
    from edgefm_ros.datasets.video import VideoConfig

    assert VideoConfig().options() == {"g": "2", "crf": "30", "preset": "12"}  # LeRobot 0.4.4's defaults
    assert VideoConfig("h264", preset="ultrafast").options() == {"g": "2", "crf": "30", "preset": "ultrafast"}
    with pytest.raises(ValueError, match="preset 'fast' is not one of libsvtav1's"):
        VideoConfig(preset="fast")
    m = DatasetMapping()
    assert mapping_from_dict(m.as_dict()) == m


def test_defaults_match_the_nodes_topics(repo_root):
    """The default mapping reads what sim_node and action_node publish with config/sim.yaml."""
    cfg = yaml.safe_load((repo_root / "config" / "sim.yaml").read_text())
    sim, act = cfg["sim_node"]["ros__parameters"], cfg["action_node"]["ros__parameters"]
    m = DatasetMapping()
    assert [c.topic for c in m.cameras] == sim["camera_topics"]
    assert [c.key for c in m.cameras] == cfg["vla_node"]["ros__parameters"]["camera_keys"]
    assert m.state.topic == sim["joint_states_topic"] and list(m.state.joints) == sim["joint_names"]
    assert m.action.topic == act["command_topic"] == sim["command_topic"]
    assert list(m.action.joints) == act["joint_names"] and act["command_type"] == "joint_trajectory"
    assert m.instruction == sim["instruction_topic"] and m.events == "/" + sim["events_topic"].lstrip("/")

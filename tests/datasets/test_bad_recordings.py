"""Bad recordings: each gets an error naming the bag, the topic and the time, and no output appears (no
dataset, no partial directory left beside it)."""
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bags import make_bag  # noqa: E402

from edgefm_ros.datasets.convert import ConvertConfig, convert_bags  # noqa: E402
from edgefm_ros.datasets.errors import RecordingError  # noqa: E402
from edgefm_ros.datasets.mapping import DatasetMapping  # noqa: E402
from edgefm_ros.tools.bag_cli import main as bag_main  # noqa: E402

T0 = 1_700_000_000


def _fails(tmp_path, bags, match, cfg=ConvertConfig(), mapping=DatasetMapping()) -> RecordingError:
    out = tmp_path / "ds"
    with pytest.raises(RecordingError, match=match) as e:
        convert_bags(bags, out, mapping, cfg)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds")] == []  # no partial directory
    return e.value


def _stamp(err: RecordingError) -> float:
    return err.t_ns * 1e-9 - T0


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_missing_topic(tmp_path, storage):
    bag = make_bag(tmp_path, storage=storage, omit_topics=("/wrist/image_raw",))
    e = _fails(tmp_path, [bag], "topic missing")
    assert e.bag == str(bag) and e.topic == "/wrist/image_raw" and "observation.images.wrist" in str(e)


def test_wrong_message_type(tmp_path):
    bag = make_bag(tmp_path, wrong_type_topic="/joint_states")
    e = _fails(tmp_path, [bag], "wrong message type std_msgs/msg/String")
    assert e.topic == "/joint_states" and str(bag) in str(e)


def test_stamps_out_of_order(tmp_path):
    bag = make_bag(tmp_path, out_of_order_at_s=0.7)
    e = _fails(tmp_path, [bag], "stamps out of order")
    assert e.topic == "/joint_states" and _stamp(e) == pytest.approx(0.67, abs=1e-6)
    assert "t=1700000000.67" in str(e)


def test_nan_in_the_state(tmp_path):
    bag = make_bag(tmp_path, nan_state_at_s=0.5)
    e = _fails(tmp_path, [bag], r"non-finite observation.state value\(s\) \['ee_y'\]")
    assert e.topic == "/joint_states" and _stamp(e) == pytest.approx(0.5, abs=1e-6)


def test_episode_shorter_than_a_chunk(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.5), ("push", 0.5)))
    e = _fails(tmp_path, [bag], r"episode 1 of this bag .* keeps 11 of 11 ticks at 20 fps, fewer than one chunk "
                                r"\(16\)")
    assert e.topic == "/sim/events" and _stamp(e) == pytest.approx(2.0, abs=1e-6)  # 1.5 s + 0.5 s settle
    # --skip-short: left out and reported instead
    r = convert_bags([bag], tmp_path / "ok", DatasetMapping(), ConvertConfig(skip_short=True))
    assert r.episodes == 1 and len(r.bags[0]["skipped_short"]) == 1


def test_stale_streams_make_an_episode_short(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.2),), camera_dropout_s=(0.2, 1.3))
    e = _fails(tmp_path, [bag], r"stale ticks by stream: /scene/image_raw 19$")  # ticks 0.3 .. 1.2 s
    assert e.topic == "/sim/events"


def test_cameras_stamped_on_another_clock_say_so_and_convert_on_the_bag_clock(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0),), camera_stamp_offset_s=-100.0)
    _fails(tmp_path, [bag], r"keeps 0 of 21 ticks .*\(/scene/image_raw, /wrist/image_raw never had a sample within "
                            r"max_age_s: stamped on another clock\? try clock: bag\)")
    from dataclasses import replace

    r = convert_bags([bag], tmp_path / "ok", replace(DatasetMapping(), clock="bag"), ConvertConfig())
    assert r.frames >= 16 and r.bags[0]["split_by"] == "events"


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_truncated_bag(tmp_path, storage):
    bag = make_bag(tmp_path, storage=storage)
    data = next(p for p in bag.iterdir() if p.suffix in (".db3", ".mcap"))
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) // 2])
    e = _fails(tmp_path, [bag], "truncated or corrupt")
    assert e.bag == str(bag)


def test_recording_that_never_finished(tmp_path):
    """A recorder killed before it wrote metadata.yaml."""
    bag = make_bag(tmp_path, storage="mcap")
    os.remove(bag / "metadata.yaml")
    _fails(tmp_path, [bag], "metadata.yaml is missing")


def test_a_bad_second_bag_leaves_nothing_of_the_first(tmp_path):
    good = make_bag(tmp_path, "good")
    bad = make_bag(tmp_path, "bad", nan_state_at_s=0.3)
    e = _fails(tmp_path, [good, bad], "non-finite")
    assert e.bag == str(bad)


def test_a_frame_that_does_not_decode_fails_in_the_second_pass_and_cleans_up(tmp_path):
    """A corrupt JPEG is found only when its pixels are needed: after writing began, the partial directory goes."""
    import numpy as np
    from rosbags.rosbag2 import Reader, Writer
    from rosbags.typesys import Stores, get_typestore

    src = make_bag(tmp_path, "src", transport="compressed", storage="sqlite3")
    ts = get_typestore(Stores.ROS2_JAZZY)
    bad = tmp_path / "bad"
    with Reader(src) as r, Writer(bad, version=9) as w:
        conns = {c.id: w.add_connection(c.topic, c.msgtype, typestore=ts) for c in r.connections}
        n = 0
        for c, t, raw in r.messages():
            if c.topic == "/wrist/image_raw/compressed":
                n += 1
                if n == 20:
                    m = ts.deserialize_cdr(raw, c.msgtype)
                    m.data = np.frombuffer(b"not a jpeg at all", dtype=np.uint8)
                    raw = ts.serialize_cdr(m, c.msgtype)
            w.write(conns[c.id], t, raw)
    from edgefm_ros.datasets.mapping import CameraSource

    m = DatasetMapping(cameras=(CameraSource("scene", "/scene/image_raw/compressed"),
                                CameraSource("wrist", "/wrist/image_raw/compressed")))
    e = _fails(tmp_path, [bad], "not a decodable image", mapping=m)
    assert e.topic == "/wrist/image_raw/compressed" and _stamp(e) == pytest.approx(19 / 30, abs=1e-6)


def test_cli_names_the_problem_and_exits_2(tmp_path, capsys):
    bag = make_bag(tmp_path, nan_state_at_s=0.4)
    assert bag_main(["to-dataset", str(bag), "--out", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert f"error: {bag}: topic /joint_states at t=1700000000.400000000 s (" in err and "non-finite" in err
    assert not (tmp_path / "ds").exists()
    assert bag_main(["to-dataset", str(tmp_path / "nope"), "--out", str(tmp_path / "ds")]) == 2
    assert "no such bag" in capsys.readouterr().err
    shutil.rmtree(bag)


def test_a_killed_conversions_partial_directory_is_removed_by_the_next(tmp_path):
    bag = make_bag(tmp_path, episodes=(("reach", 1.0),))
    dead = tmp_path / ".ds.partial-999999999"  # no such process
    (dead / "data").mkdir(parents=True)
    live = tmp_path / f".ds.partial-{os.getppid()}"  # a live process's is left alone
    live.mkdir()
    convert_bags([bag], tmp_path / "ds", DatasetMapping(), ConvertConfig())
    assert (tmp_path / "ds" / "meta" / "info.json").is_file() and not dead.exists() and live.exists()

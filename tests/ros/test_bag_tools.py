"""edgefm-bag: synthetic bags (content and rates), play -> record round trip of the raw CDR bytes."""
from __future__ import annotations

import time

import numpy as np
import pytest

RNG = np.random.default_rng()


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_made_bag_has_the_streams_at_their_rates(ros, tmp_path, storage):
    from rosbags.rosbag2 import Reader

    from edgefm_ros.sensors.camera import decode_compressed
    from edgefm_ros.tools.bag.make import EXTRA_JOINT, MakeConfig, make_bag
    from edgefm_ros.tools.bag.synth import JOINTS
    from edgefm_ros.tools.bag.typestore import make_typestore

    cams = int(RNG.integers(2, 4))
    dur = float(RNG.uniform(1.0, 2.0))
    counts = make_bag(MakeConfig(str(tmp_path / "b"), duration_s=dur, cameras=cams, width=48, height=32,
                                 storage=storage, seed=int(RNG.integers(100))))
    assert counts["/joint_states"] == int(dur * 100)
    for i in range(cams):
        assert counts[f"/camera{i + 1}/image_raw"] == counts[f"/camera{i + 1}/image_raw/compressed"] == int(dur * 30)
    ts = make_typestore()
    raw, jpg, joints, tasks = {}, {}, [], []
    with Reader(str(tmp_path / "b")) as r:
        assert r.duration * 1e-9 == pytest.approx(dur, abs=0.05)
        for c, t, data in r.messages():
            m = ts.deserialize_cdr(data, c.msgtype)
            if c.msgtype == "sensor_msgs/msg/Image":
                raw.setdefault(c.topic, []).append(m.data.reshape(m.height, m.width, 3))
                assert m.header.stamp.sec * 10**9 + m.header.stamp.nanosec == t  # stamped at capture
            elif c.msgtype == "sensor_msgs/msg/CompressedImage":
                jpg.setdefault(c.topic, []).append(decode_compressed(m.format, m.data.tobytes()))
            elif c.msgtype == "sensor_msgs/msg/JointState":
                joints.append(m)
            else:
                tasks.append(m.data)
    assert len(set(tasks)) == 2
    assert set(joints[0].name) == set(JOINTS) | {EXTRA_JOINT} and tuple(joints[0].name[1:]) != JOINTS
    first, later = raw["/camera1/image_raw"][0], raw["/camera1/image_raw"][-1]
    assert np.abs(first.astype(int) - later).mean() > 2, "the scene does not move"
    assert np.abs(raw["/camera1/image_raw"][3].astype(int) - jpg["/camera1/image_raw/compressed"][3]).mean() < 12


def test_play_publishes_the_stored_bytes_and_record_writes_them(ros, tmp_path, ros_domain_id, spin_in_background):
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rosbags.rosbag2 import Reader

    from edgefm_ros.tools.bag.make import MakeConfig, make_bag
    from edgefm_ros.tools.bag.play import Player, PlayConfig
    from edgefm_ros.tools.bag.record import Recorder, RecordConfig

    src = str(tmp_path / "src")
    make_bag(MakeConfig(src, duration_s=1.0, cameras=2, width=32, height=24, transport="compressed", joint_hz=50))
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    node = rclpy.create_node("bag_roundtrip", context=ctx)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    topics = ("/joint_states", "/camera1/image_raw/compressed", "/instruction")
    rec = Recorder(node, RecordConfig(str(tmp_path / "rec"), topics))

    spin = None
    try:
        player = Player(node, PlayConfig(src, rate=2.0, restamp=False, topics=topics,
                                         remap={"/joint_states": "/joint_states"}))
        spin = spin_in_background(ex, ctx)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(rec.counts) < len(topics):
            time.sleep(0.05)  # the recorder subscribes once it sees the player's publishers
        time.sleep(0.5)
        t0 = time.monotonic()
        player.play()
        took = time.monotonic() - t0
        time.sleep(0.5)
    finally:
        rec.close()
        ctx.try_shutdown()
        if spin is not None:
            spin.join(2)
    assert 0.4 < took < 0.9, f"1 s bag at rate 2 took {took:.2f} s"

    def by_topic(path):
        out = {}
        with Reader(path) as r:
            for c, _, data in r.messages():
                out.setdefault(c.topic, []).append(bytes(data))
        return out
    sent, got = by_topic(src), by_topic(str(tmp_path / "rec"))
    for t in topics:
        assert got.get(t) == sent[t], f"{t}: {len(got.get(t, []))} of {len(sent[t])} messages, or bytes differ"


def test_command_timing_counts_missed_and_early_ticks_apart():
    """A skipped period is a missed tick; a catch-up command half a period after a stall is 'early' and no
    longer cancels the late one it follows (their sum used to read 0, or -1 for a lone early command); a late
    command is one stall however many periods it skipped."""
    from types import SimpleNamespace

    from edgefm_ros.tools.bag.analyze import command_timing

    period = 0.02
    base = np.arange(50) * period
    cases = {"regular": (base, 0, 0, 0),
             "one skipped": (np.delete(base, 20), 1, 0, 1),
             "one long stall": (np.delete(base, range(20, 25)), 5, 0, 1),
             "stall then catch-up": (np.concatenate([base[:20], [base[20] + 0.015], base[21:]]), 1, 1, 1),
             "extra command": (np.sort(np.concatenate([base, [base[30] + 0.004]])), 0, 1, 0)}
    for name, (stamps, missed, early, stalls) in cases.items():
        t = command_timing(SimpleNamespace(cmd_stamp=list(stamps)), period)
        assert (t["missed"], t["early"], t["stalls"]) == (missed, early, stalls), name

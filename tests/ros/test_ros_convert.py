"""Message conversion with the real ROS types: chunks, images, stamps, CDR restamping, rosbags type hashes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from skips import require_material

RNG = np.random.default_rng()


def test_chunk_message_round_trip(ros):
    from edgefm_ros.ros.convert import chunk_to_msg, msg_to_chunk
    from edgefm_ros.types import ActionChunk

    n, d = int(RNG.integers(2, 50)), int(RNG.integers(1, 8))
    c = ActionChunk(actions=RNG.normal(size=(n, d)).astype(np.float32), dt=float(RNG.uniform(0.01, 0.1)),
                    stamp=float(RNG.uniform(1e9, 2e9)), source="edge-fallback", model="m",
                    joint_names=tuple(f"j{i}" for i in range(d)), seq=int(RNG.integers(1, 1 << 40)),
                    inference_s=0.05, prefill_s=0.02, decode_s=0.03)
    back = msg_to_chunk(chunk_to_msg(c))
    np.testing.assert_array_equal(back.actions, c.actions)
    assert (back.dt, back.source, back.joint_names, back.seq) == (c.dt, c.source, c.joint_names, c.seq)
    # float seconds near 2e9 resolve ~0.24 us: through integer nanoseconds and back a stamp may move by half a
    # nanosecond (rounding) plus one unit in the last place of the float
    assert abs(back.stamp - c.stamp) <= 0.5e-9 + np.spacing(c.stamp), (back.stamp, c.stamp)


def test_malformed_chunk_message_is_refused(ros):
    from edgefm_ros.msg import ActionChunk as Msg
    from edgefm_ros.ros.convert import msg_to_chunk

    m = Msg(chunk_size=8, action_dim=6, dt=0.1, actions=RNG.normal(size=47).astype(np.float32).tolist(), source="edge")
    with pytest.raises(ValueError, match="47 values"):
        msg_to_chunk(m)
    a = RNG.normal(size=48).astype(np.float32)
    a[RNG.integers(48)] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        msg_to_chunk(Msg(chunk_size=8, action_dim=6, dt=0.1, actions=a.tolist(), source="edge"))


def test_image_message_round_trip_and_stamps(ros):
    from edgefm_ros.ros.convert import image_msg_to_rgb, rgb_to_image_msg, to_sec, to_stamp

    rgb = RNG.integers(0, 256, (int(RNG.integers(4, 30)), int(RNG.integers(4, 30)), 3), dtype=np.uint8)
    t = float(RNG.uniform(1e9, 2e9))
    m = rgb_to_image_msg(rgb, t, encoding="bgr8")
    np.testing.assert_array_equal(image_msg_to_rgb(m), rgb)
    assert to_sec(m.header.stamp) == pytest.approx(t, abs=1e-6)
    with pytest.raises(ValueError, match="stamp"):
        to_stamp(float("nan"))


def test_restamp_rewrites_only_the_header_stamp(ros):
    from rclpy.serialization import deserialize_message, serialize_message
    from sensor_msgs.msg import JointState

    from edgefm_ros.ros.convert import to_stamp
    from edgefm_ros.tools.bag.play import restamp_cdr

    m = JointState(name=["a", "b"], position=RNG.normal(size=2).tolist())
    t = float(RNG.uniform(1e9, 1.5e9))
    m.header.stamp = to_stamp(t)
    m.header.frame_id = "base"
    shift = int(RNG.integers(1, 10**12))
    out = deserialize_message(restamp_cdr(serialize_message(m), shift), JointState)
    ns = lambda st: st.sec * 10**9 + st.nanosec  # noqa: E731  exact integer nanoseconds
    assert ns(out.header.stamp) == ns(m.header.stamp) + shift
    assert out.name == m.name and list(out.position) == list(m.position) and out.header.frame_id == "base"


def test_rosbags_type_hashes_match_rosidl(ros, install_root):
    from edgefm_ros.tools.bag.typestore import make_typestore

    ts = make_typestore()
    share = install_root / "share" / "edgefm_ros" / "msg"
    files = sorted(share.glob("*.json"))
    require_material(bool(files), f"no rosidl type descriptions in {share}")
    for f in files:
        desc = json.loads(f.read_text())
        want = next(h["hash_string"] for h in desc["type_hashes"] if h["type_name"] == f"edgefm_ros/msg/{f.stem}")
        assert ts.hash_rihs01(f"edgefm_ros/msg/{f.stem}") == want, f.stem


@pytest.mark.parametrize("kind", ["joint_trajectory", "float64_multi_array", "joint_state"])
def test_command_messages_carry_the_positions_in_joint_order(ros, kind):
    from edgefm_ros.ros.commands import COMMAND_MSG, command_fields, command_msg
    from edgefm_ros.ros.convert import to_sec, to_stamp

    names = tuple(f"j{i}" for i in range(int(RNG.integers(1, 8))))
    pos = RNG.normal(size=len(names))
    t, period = float(RNG.uniform(1e9, 2e9)), float(RNG.uniform(0.002, 0.1))
    m = command_msg(kind, names, pos, to_stamp(t), period)
    assert isinstance(m, COMMAND_MSG[kind])
    if kind == "float64_multi_array":
        np.testing.assert_allclose(m.data, pos)
    elif kind == "joint_state":
        assert tuple(m.name) == names and to_sec(m.header.stamp) == pytest.approx(t, abs=1e-6)
        np.testing.assert_allclose(m.position, pos)
    else:
        assert tuple(m.joint_names) == names and len(m.points) == 1
        np.testing.assert_allclose(m.points[0].positions, pos)
        d = m.points[0].time_from_start
        assert d.sec + d.nanosec * 1e-9 == pytest.approx(period, abs=1e-9)
    # what a robot (sim_node) reads back from it
    got_names, got_pos, stamp = command_fields(m)
    np.testing.assert_allclose(got_pos, pos)
    assert tuple(got_names) == (() if kind == "float64_multi_array" else names)


def test_command_types_are_the_parameter_choices(ros):
    from edgefm_ros.params.action import COMMAND_TYPES, ActionNodeConfig
    from edgefm_ros.params.sim import SimNodeConfig
    from edgefm_ros.ros.commands import COMMAND_MSG

    assert tuple(COMMAND_MSG) == COMMAND_TYPES
    assert ActionNodeConfig.spec("command_type").choices == SimNodeConfig.spec("command_type").choices == COMMAND_TYPES


def test_diagnostic_status_formats_values(ros):
    from edgefm_ros.ros import diagnostics as diag

    x = float(RNG.uniform(1, 100))
    s = diag.make_status("n: x", "hw", diag.WARN, "msg", {"a": x, "b": True, "c": float("nan"), "d": 3})
    v = diag.status_values(s)
    assert float(v["a"]) == pytest.approx(x, rel=1e-3) and v["b"] == "true" and v["c"] == "nan" and v["d"] == "3"
    assert diag.worst([diag.OK, diag.ERROR, diag.WARN]) == diag.ERROR and diag.worst([]) == diag.OK

"""ROS message -> numpy conversions on fuzzed fields (edgefm_ros/ros: images.py, joints.py, convert.py):
images (raw fields and compressed bytes), joint states, action chunks, route decisions. Messages are built
with valid field types (rosidl enforces those), every value fuzzed; each converts, with the values where
they belong, or raises ValueError naming the bad value."""
import math

import cv2
import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st

from edgefm_ros.sensors.camera import CHANNELS, MAX_PIXELS, decode_compressed, encode_jpeg, image_to_rgb
from edgefm_ros.sensors.joints import JointOrder
from skips import require_module

msg = require_module("edgefm_ros.msg", "edgefm_ros.msg is not built (run scripts/setup.sh)")
from edgefm_ros.ros.convert import msg_to_chunk, msg_to_route  # noqa: E402  (needs the built messages)

u32 = st.integers(0, 2 ** 32 - 1)
small = st.integers(0, 9)
f32 = st.floats(width=32)
f64 = st.floats()


@given(enc=st.sampled_from(sorted(CHANNELS)) | st.text(max_size=6), h=small | u32, w=small | u32,
       pad=st.integers(-3, 3) | u32, extra=st.integers(-3, 3), data=st.data())
def test_fuzz_raw_image(enc, h, w, pad, extra, data):
    ch = CHANNELS.get(enc, 3)
    step = max(w * ch + pad, 0) if pad < 2 ** 31 else pad
    n = step * h + extra
    payload = data.draw(st.binary(min_size=max(n, 0), max_size=max(n, 0))) if 0 <= n <= 4096 else b"\x01" * 7
    try:
        rgb = image_to_rgb(enc, h, w, step, payload)
    except ValueError as e:
        event("refused")
        assert str(e)
        return
    assert rgb.shape == (h, w, 3) and rgb.dtype == np.uint8
    px = np.frombuffer(payload, np.uint8)[:ch]  # the first pixel, as the encoding lays it out
    want = {"rgb8": px, "bgr8": px[::-1], "8UC3": px[::-1], "rgba8": px[:3], "bgra8": px[2::-1]}.get(enc, np.repeat(px, 3))
    assert rgb[0, 0].tolist() == list(want)


def _frame(seed: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@given(kind=st.sampled_from(["jpeg", "png"]), h=st.integers(1, 24), w=st.integers(1, 24), seed=small,
       patches=st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=4)), max_size=3),
       cut=st.none() | st.integers(0, 600), fmt=st.sampled_from(["jpeg", "png", "rgb8; jpeg compressed bgr8", "", "tiff"]))
def test_fuzz_compressed_image(kind, h, w, seed, patches, cut, fmt):
    rgb = _frame(seed, h, w)
    b = bytearray(encode_jpeg(rgb) if kind == "jpeg" else cv2.imencode(".png", rgb[..., ::-1])[1].tobytes())
    for pos, new in patches:
        pos %= len(b)
        b[pos:pos + len(new)] = new
    b = b[:cut] if cut is not None else b
    try:
        out = decode_compressed(fmt, bytes(b))
    except ValueError as e:
        event("refused")
        assert str(e)
        return
    assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3 and out.shape[0] * out.shape[1] <= MAX_PIXELS
    if kind == "png" and not patches and cut is None:
        assert np.array_equal(out, rgb)  # lossless round trip


@given(blob=st.binary(max_size=300))
def test_fuzz_compressed_bytes(blob):
    try:
        decode_compressed("jpeg", blob)
    except ValueError:
        event("refused")


names = st.sampled_from(["j0", "j1", "j2", "j3", "x", ""])


@given(incoming=st.lists(names, max_size=6), values=st.lists(f64, max_size=7))
def test_fuzz_joint_state(incoming, values):
    order = JointOrder(("j0", "j1", "j2"))
    try:
        out = order.reorder(incoming, values)
    except ValueError as e:
        event("refused")
        assert str(e)
        return
    assert out.dtype == np.float32 and out.shape == (3,)
    for i, n in enumerate(order.names):  # each joint's own value, found by name
        assert out[i] == np.float32(values[incoming.index(n)])


@given(n=small | u32, d=small | u32, actions=st.lists(f32, max_size=40), dt=f64, src=st.sampled_from(["edge", "cloud", "x"]),
       names=st.lists(st.text(max_size=3), max_size=5), sec=st.integers(-2 ** 31, 2 ** 31 - 1), nsec=u32,
       times=st.tuples(f64, f64, f64), seq=st.integers(0, 2 ** 64 - 1))
def test_fuzz_action_chunk(n, d, actions, dt, src, names, sec, nsec, times, seq):
    m = msg.ActionChunk(joint_names=names, chunk_size=n, action_dim=d, dt=dt, actions=actions, source=src,
                        model="m", inference_time=times[0], prefill_time=times[1], decode_time=times[2], sequence=seq)
    m.header.stamp.sec, m.header.stamp.nanosec = sec, nsec
    try:
        c = msg_to_chunk(m)
    except ValueError as e:
        event("refused")
        assert str(e)
        return
    assert c.actions.shape == (n, d) and np.array_equal(c.actions.reshape(-1), np.asarray(actions, np.float32))
    assert c.source == src and c.seq == seq and math.isfinite(c.stamp)


@given(target=st.sampled_from(["edge", "cloud", "", "EDGE"]), fnames=st.lists(st.text(max_size=3), max_size=4),
       feats=st.lists(f32, max_size=4), bw=f32, rtt=f32, q=st.integers(0, 255), res=u32, guard=st.booleans())
def test_fuzz_route_decision(target, fnames, feats, bw, rtt, q, res, guard):
    m = msg.RouteDecision(target=target, candidate="c", reason="r", feature_names=fnames, features=feats,
                          bandwidth_mbps=bw, rtt_s=rtt, jpeg_quality=q, resolution=res, guard_active=guard)
    try:
        r = msg_to_route(m)
    except ValueError as e:
        event("refused")
        assert str(e)
        return
    assert r.target == target and len(r.features) == len(fnames) and r.params["resolution"] == res

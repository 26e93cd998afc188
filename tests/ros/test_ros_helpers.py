"""The ROS-free helpers of edgefm_ros.ros: image conversion, joint order, observation assembly."""
from __future__ import annotations

import numpy as np
import pytest

from edgefm_ros.sensors.camera import decode_compressed, encode_jpeg, image_to_rgb, resize_rgb, rgb_to_image_fields
from edgefm_ros.sensors.joints import JointOrder
from edgefm_ros.sensors.observation import Frame, Refusal, SensorCache, assemble
from edgefm_ros.types import Observation

RNG = np.random.default_rng()


def _rgb(h=None, w=None):
    h = h or int(RNG.integers(8, 40))
    w = w or int(RNG.integers(8, 40))
    return RNG.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8"])
def test_raw_image_round_trip_with_row_padding(encoding):
    rgb = _rgb()
    h, w, step, data = rgb_to_image_fields(rgb, encoding)
    pad = int(RNG.integers(1, 9))  # rows padded to a larger step, as drivers do
    rows = np.frombuffer(data, np.uint8).reshape(h, step)
    padded = np.concatenate([rows, RNG.integers(0, 256, (h, pad), dtype=np.uint8)], axis=1).tobytes()
    np.testing.assert_array_equal(image_to_rgb(encoding, h, w, step + pad, padded), rgb)


def test_four_channel_and_mono_encodings():
    rgb = _rgb()
    h, w = rgb.shape[:2]
    alpha = RNG.integers(0, 256, (h, w, 1), dtype=np.uint8)
    np.testing.assert_array_equal(image_to_rgb("rgba8", h, w, w * 4, np.concatenate([rgb, alpha], 2).tobytes()), rgb)
    bgra = np.concatenate([rgb[..., ::-1], alpha], 2)
    np.testing.assert_array_equal(image_to_rgb("bgra8", h, w, w * 4, bgra.tobytes()), rgb)
    mono = rgb[..., 0].copy()
    out = image_to_rgb("mono8", h, w, w, mono.tobytes())
    assert out.shape == (h, w, 3) and all(np.array_equal(out[..., c], mono) for c in range(3))


@pytest.mark.parametrize("case,match", [("encoding", "yuv422"), ("short", "expected step\\*height"),
                                        ("step", "step"), ("size", "positive")])
def test_malformed_raw_images_name_the_problem(case, match):
    rgb = _rgb()
    h, w, step, data = rgb_to_image_fields(rgb)
    args = {"encoding": ("yuv422", h, w, step, data),
            "short": ("rgb8", h, w, step, data[: -int(RNG.integers(1, 50))]),
            "step": ("rgb8", h, w, w * 3 - 1, data),
            "size": ("rgb8", 0, w, step, data)}[case]
    with pytest.raises(ValueError, match=match):
        image_to_rgb(*args)


def test_jpeg_round_trip_is_close_and_garbage_is_refused():
    yy, xx = np.mgrid[0:48, 0:64]
    rgb = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=2).astype(np.uint8)  # smooth: JPEG-friendly
    back = decode_compressed("rgb8; jpeg compressed bgr8", encode_jpeg(rgb, 95))
    assert back.shape == rgb.shape and np.abs(back.astype(int) - rgb).mean() < 3
    with pytest.raises(ValueError, match="not a PNG or JPEG"):
        decode_compressed("jpeg", RNG.integers(0, 256, 300, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match="could not be decoded"):  # a JPEG header, then garbage
        decode_compressed("jpeg", encode_jpeg(rgb, 95)[:400] + RNG.integers(0, 256, 300, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match="no data"):
        decode_compressed("jpeg", b"")
    with pytest.raises(ValueError, match="tiff"):
        decode_compressed("tiff", b"\x00" * 10)


def test_compressed_images_declaring_too_many_pixels_or_another_format_are_refused_before_decoding():
    import cv2

    from edgefm_ros.sensors.camera import MAX_PIXELS

    rgb = _rgb(12, 16)
    png = bytearray(cv2.imencode(".png", rgb)[1].tobytes())
    png[16:24] = (70000).to_bytes(4, "big") + (60000).to_bytes(4, "big")  # IHDR width, height
    with pytest.raises(ValueError, match=f"60000x70000 pixels, outside 1..{MAX_PIXELS}"):
        decode_compressed("png", bytes(png))
    with pytest.raises(ValueError, match="not a PNG or JPEG"):  # OpenCV would decode it
        decode_compressed("png", cv2.imencode(".bmp", rgb)[1].tobytes())


def bilinear_half_pixel(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resampling with half-pixel centres (src = (dst + 0.5) * scale - 0.5, clamped at the edges),
    written out in float64: the convention the resize must follow, independent of OpenCV."""
    h, w = rgb.shape[:2]
    ys = np.clip((np.arange(height) + 0.5) * h / height - 0.5, 0, h - 1)
    xs = np.clip((np.arange(width) + 0.5) * w / width - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    a = rgb.astype(np.float64)
    top = a[y0][:, x0] * (1 - fx) + a[y0][:, x1] * fx
    bottom = a[y1][:, x0] * (1 - fx) + a[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


@pytest.mark.parametrize("size", [(15, 20), (45, 64), (30, 17)], ids=["down", "up", "mixed"])
def test_resize_is_bilinear_and_identity_when_the_size_matches(size):
    rgb = _rgb(30, 40)
    assert resize_rgb(rgb, 30, 40) is rgb
    out = resize_rgb(rgb, *size)
    assert out.shape == (*size, 3) and out.dtype == np.uint8
    # OpenCV rounds its fixed-point weights: within 1 grey level of the float64 resampling
    assert np.abs(out.astype(np.float64) - bilinear_half_pixel(rgb, *size)).max() <= 1.0


def test_joint_order_maps_by_name_and_rejects_bad_states():
    names = tuple(f"j{i}" for i in range(6))
    order = JointOrder(names)
    perm = RNG.permutation(6)
    incoming = ["extra"] + [names[i] for i in perm]
    values = np.concatenate([[RNG.normal()], RNG.normal(size=6)])
    want = np.empty(6)
    want[perm] = values[1:]
    np.testing.assert_allclose(order.reorder(incoming, values), want.astype(np.float32))
    with pytest.raises(ValueError, match="'j3'"):
        order.reorder([n for n in incoming if n != "j3"], np.delete(values, incoming.index("j3")))
    bad = values.copy()
    bad[incoming.index("j2")] = np.nan
    with pytest.raises(ValueError, match="non-finite.*j2"):
        order.reorder(incoming, bad)
    with pytest.raises(ValueError, match="7 joint names but 5"):
        order.reorder(incoming, values[:5])
    with pytest.raises(ValueError, match="duplicate"):
        JointOrder(("a", "a"))


def _snapshot_cache(now, ages, state_age=0.01, task="pick"):
    keys = tuple(ages)
    cache = SensorCache(keys)
    for k, age in ages.items():
        if age is not None:
            cache.put_frame(k, Frame(now - age, rgb=_rgb(24, 32)))
    cache.put_state(RNG.normal(size=6).astype(np.float32), now - state_age)
    cache.put_task(task, now)
    return cache.snapshot(now)


def test_assemble_builds_an_observation_with_resize_and_masks():
    now = float(RNG.uniform(1e9, 2e9))
    snap = _snapshot_cache(now, {"cam1": 0.05, "cam2": 0.02, "cam3": 2.0})
    obs = assemble(snap, required=("cam1", "cam2"), model_keys=("cam1", "cam2", "cam3", "cam4"),
                   image_hw={"cam1": (48, 64), "cam2": (24, 32)}, max_age_s=0.5, now=now)
    assert isinstance(obs, Observation)
    assert obs.images["cam1"].shape == (48, 64, 3) and obs.images["cam2"].shape == (24, 32, 3)
    assert set(obs.missing) == {"cam3", "cam4"}  # stale optional camera and a camera nobody feeds
    assert obs.stamp == pytest.approx(max(snap.frames["cam2"].stamp, snap.state_stamp))


@pytest.mark.parametrize("case,reason", [("stale_camera", "stale_camera"), ("missing", "missing_camera"),
                                         ("stale_state", "stale_state"), ("no_task", "no_task"),
                                         ("no_resize", "bad_image")])
def test_assemble_refuses_with_a_reason(case, reason):
    now = float(RNG.uniform(1e9, 2e9))
    ages = {"cam1": 0.01, "cam2": 0.01}
    kw = {}
    if case == "stale_camera":
        ages["cam2"] = float(RNG.uniform(0.6, 5.0))
    if case == "missing":
        ages["cam2"] = None
    snap = _snapshot_cache(now, ages, state_age=1.0 if case == "stale_state" else 0.01,
                           task="  " if case == "no_task" else "pick")
    if case == "no_resize":
        kw = {"resize": False}
    r = assemble(snap, required=("cam1", "cam2"), model_keys=("cam1", "cam2"), image_hw={"cam1": (48, 64)},
                 max_age_s=0.5, now=now, **kw)
    assert isinstance(r, Refusal) and r.reason == reason, r
    if reason == "stale_camera":
        assert "'cam2'" in r.detail


def test_assemble_refuses_an_undecodable_compressed_frame():
    now = 100.0
    cache = SensorCache(("cam1",))
    cache.put_frame("cam1", Frame(now, compressed=RNG.integers(0, 256, 100, dtype=np.uint8).tobytes(), fmt="jpeg"))
    cache.put_state(np.zeros(6, np.float32) + RNG.normal(size=6).astype(np.float32), now)
    cache.put_task("go", now)
    r = assemble(cache.snapshot(now), required=("cam1",), model_keys=("cam1",), image_hw={}, max_age_s=0.5, now=now)
    assert isinstance(r, Refusal) and r.reason == "bad_image" and "cam1" in r.detail

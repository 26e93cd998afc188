"""Wire format without a server: images, requests, responses, and everything the server must refuse."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor
from edgefm_ros.cloud.images import Encoding, ImageError, decode_image, encode_image, jpeg_size
from edgefm_ros.cloud.tasks.vla import VlaLimits, decode_request, decode_response, encode_request, encode_response
from edgefm_ros.types import Observation

CAMS = ("observation.images.top", "observation.images.wrist")
LIMITS = VlaLimits(camera_keys=CAMS, state_dim=6, noise_shape=(8, 32), max_side=512, max_image_bytes=1 << 20)


def _obs(rng, h=40, w=56, cams=CAMS, **kw) -> Observation:
    return Observation({k: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for k in cams},
                       rng.standard_normal(6).astype(np.float32), kw.pop("task", "put the cup in the sink"),
                       stamp=float(rng.uniform(0, 100)), **kw)


def _tensors(req: dict) -> list[Tensor]:
    """What the runtime hands to decode_request after MLServer parsed the JSON."""
    req = json.loads(json.dumps(req))
    return [Tensor(i["name"], i["datatype"], i["shape"], i.get("parameters", {}), i["data"]) for i in req["inputs"]]


def _decode(req: dict, limits: VlaLimits = LIMITS):
    return decode_request(req["id"], req["parameters"], _tensors(req), limits)


def test_raw_request_roundtrip_is_exact(rng):
    obs = _obs(rng, missing=())
    noise = rng.standard_normal((8, 32)).astype(np.float32)
    d = _decode(encode_request(obs, Encoding(), request_id="r1", dt=0.04, seq=9, noise=noise, deadline_s=0.2))
    assert d.request_id == "r1" and d.dt == 0.04 and d.seq == 9 and d.deadline_s == 0.2
    assert d.obs.task == obs.task and d.obs.stamp == obs.stamp
    np.testing.assert_array_equal(d.obs.state, obs.state)
    np.testing.assert_array_equal(d.noise, noise)  # float32 -> JSON -> float32 is exact
    for k in CAMS:
        np.testing.assert_array_equal(d.obs.images[k], obs.images[k])


def test_float_images_and_missing_camera(rng):
    chw = rng.random((3, 30, 20), dtype=np.float32)
    obs = Observation({CAMS[0]: chw}, rng.standard_normal(6).astype(np.float32), "wave", missing=(CAMS[1],))
    d = _decode(encode_request(obs, Encoding(), request_id="f", dt=0.1))
    assert d.obs.images[CAMS[0]].dtype == np.float32
    np.testing.assert_array_equal(d.obs.images[CAMS[0]], chw)
    assert d.obs.missing == (CAMS[1],) and d.noise is None


def test_jpeg_and_resolution(rng):
    yy, xx = np.mgrid[0:120, 0:200]
    smooth = np.stack([xx * 1.2, yy * 2.0, 255 - xx], axis=-1)  # a smooth picture, as cameras see
    img = np.clip(smooth + rng.normal(0, 3, smooth.shape), 0, 255).astype(np.uint8)
    payload, params = encode_image(img, Encoding("jpeg", 80))
    assert payload[:2] == b"\xff\xd8" and len(payload) < img.nbytes / 3
    assert jpeg_size(payload) == (120, 200)
    back = decode_image(payload, params, 512)
    assert back.shape == img.shape and np.abs(back.astype(int) - img).mean() < 6
    # channel order survives (RGB in, RGB out)
    red = np.zeros((16, 16, 3), np.uint8)
    red[..., 0] = 255
    assert decode_image(*encode_image(red, Encoding("jpeg", 95)), 64)[..., 0].mean() > 240
    # downscaled so that the longer side is the resolution, aspect kept; never enlarged
    small, p = encode_image(img, Encoding("raw", resolution=100))
    assert p["image_shape"] == [60, 100, 3] and len(small) == 60 * 100 * 3
    assert encode_image(img, Encoding("raw", resolution=400))[1]["image_shape"] == [120, 200, 3]
    assert Encoding.from_route(jpeg_quality=0, resolution=0) == Encoding("raw", 90, None)
    assert Encoding.from_route(jpeg_quality=70, resolution=224) == Encoding("jpeg", 70, 224)
    assert Encoding.from_params({"jpeg_quality": 85, "resolution": 0, "other": 1}) == Encoding("jpeg", 85, None)


@pytest.mark.parametrize("bad", [dict(format="png"), dict(jpeg_quality=0), dict(jpeg_quality=101),
                                 dict(resolution=4)])
def test_encoding_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Encoding(**bad)


def _mutate(rng, fn, obs=None, **kw) -> dict:
    req = json.loads(json.dumps(encode_request(obs or _obs(rng), Encoding(), request_id="x", dt=0.1, **kw)))
    fn(req)
    return req


def _inp(req, name):
    return next(i for i in req["inputs"] if i["name"] == name)


BAD = {
    "too many cameras": lambda r: r["inputs"].append(dict(_inp(r, CAMS[0]), name="observation.images.third")),
    "unknown input": lambda r: _inp(r, CAMS[0]).update(name="observation.images.side"),
    "given twice": lambda r: r["inputs"].append(_inp(r, "state")),
    "no camera": lambda r: r.update(inputs=[i for i in r["inputs"] if i["name"] in ("state", "task")]),
    "missing input 'state'": lambda r: r["inputs"].remove(_inp(r, "state")),
    "must have shape [6]": lambda r: _inp(r, "state").update(shape=[7], data=[0.0] * 7),
    "must be FP32": lambda r: _inp(r, "state").update(datatype="FP64"),
    "non-finite": lambda r: _inp(r, "state")["data"].__setitem__(2, float("inf")),
    "is not 6 numbers": lambda r: _inp(r, "state").update(data=["a"] * 6),
    "1..1024 characters": lambda r: _inp(r, "task").update(data=["   "]),
    "exactly one byte string": lambda r: _inp(r, "task").update(data=[1]),
    "do not match": lambda r: _inp(r, CAMS[0])["parameters"].update(image_shape=[41, 56, 3]),
    "1..512 pixels": lambda r: _inp(r, CAMS[0])["parameters"].update(image_shape=[1000, 1, 3]),
    "image_dtype": lambda r: _inp(r, CAMS[0])["parameters"].update(image_dtype="int16"),
    "image_encoding must be": lambda r: _inp(r, CAMS[0])["parameters"].update(image_encoding="png"),
    "not base64": lambda r: _inp(r, CAMS[0]).update(data=["!!!!"]),
    "not a JPEG": lambda r: _inp(r, CAMS[0])["parameters"].update(image_encoding="jpeg"),
    "'noise' must have shape": lambda r: r["inputs"].append({"name": "noise", "datatype": "FP32", "shape": [8, 6],
                                                             "data": [0.0] * 48}),
    "parameter 'missing'": lambda r: r["parameters"].update(missing=["observation.images.nope"]),
    "parameter 'dt' must be a finite number in [1e-06": lambda r: r["parameters"].update(dt=0),
    # numbers are JSON numbers: no NaN, no strings, no bools; integers are not truncated from floats
    "parameter 'deadline_s' must be a finite number in [0, 1e+06], got nan":
        lambda r: r["parameters"].update(deadline_s=float("nan")),
    "parameter 'deadline_s' must be a finite number in [0, 1e+06], got -0.5":
        lambda r: r["parameters"].update(deadline_s=-0.5),
    "parameter 'deadline_s' must be a finite number in [0, 1e+06], got '0.5'":
        lambda r: r["parameters"].update(deadline_s="0.5"),
    "parameter 'seq' must be an integer in [0, 9.22337e+18], got 2.5": lambda r: r["parameters"].update(seq=2.5),
    "parameter 'seq' must be an integer in [0, 9.22337e+18], got 3.0": lambda r: r["parameters"].update(seq=3.0),
    "parameter 'seq' must be an integer in [0, 9.22337e+18], got True": lambda r: r["parameters"].update(seq=True),
    "parameter 'seq' must be an integer in [0, 9.22337e+18], got -1": lambda r: r["parameters"].update(seq=-1),
    "parameter 'stamp' must be a finite number": lambda r: r["parameters"].update(stamp="12.5"),
}


@pytest.mark.parametrize("message", BAD)
def test_malformed_requests_are_refused_with_the_reason(rng, message):
    with pytest.raises(ProtocolError, match=None) as e:
        _decode(_mutate(rng, BAD[message]))
    assert message in str(e.value) and e.value.status == 400


def test_size_limits_are_413_and_checked_before_decoding(rng):
    limits = VlaLimits(camera_keys=CAMS, state_dim=6, noise_shape=(8, 32), max_side=4096, max_image_bytes=10_000)
    with pytest.raises(ProtocolError) as e:
        _decode(encode_request(_obs(rng, 100, 100), Encoding(), request_id="big", dt=0.1), limits)
    assert e.value.status == 413 and "over" in str(e.value)
    # a JPEG whose header claims a huge image is refused from its header, before decoding
    payload, _ = encode_image(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), Encoding("jpeg", 90))
    sof = next(i for i in range(2, len(payload) - 1) if payload[i] == 0xFF and payload[i + 1] in (0xC0, 0xC2))
    bomb = bytearray(payload)
    bomb[sof + 5:sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")
    assert jpeg_size(bytes(bomb)) == (60000, 60000)
    with pytest.raises(ImageError, match="60000x60000"):
        decode_image(bytes(bomb), {"image_encoding": "jpeg"}, 4096)


def test_response_roundtrip(rng):
    actions = rng.standard_normal((8, 6)).astype(np.float32)
    body = encode_response(actions, "smolvla-tiny", 4, {"prefill_s": 0.01, "decode_s": 0.02, "queue_s": 0.0})
    back, params = decode_response(json.loads(json.dumps(body)))
    np.testing.assert_array_equal(back, actions)
    assert params["model"] == "smolvla-tiny" and params["seq"] == 4 and params["decode_s"] == 0.02
    with pytest.raises(ValueError, match="actions"):
        decode_response({"outputs": [{"name": "other", "shape": [1], "data": [1]}]})


def test_base64_of_raw_is_what_travels(rng):
    obs = _obs(rng)
    req = encode_request(obs, Encoding(), request_id="b", dt=0.1)
    payload = base64.b64decode(_inp(req, CAMS[1])["data"][0])
    assert payload == obs.images[CAMS[1]].tobytes()

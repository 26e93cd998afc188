"""Real-time chunking through the cloud tier: the prefix and the delay travel in the vla request, are
validated like every other field, and the server's guided chunk is the local engine's, bit for bit.

Codec-level checks run without a server; the end-to-end one uses the real loopback server (plain HTTP
behind nginx with a bearer token, as `edgefm-cloud serve` runs it)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cloud_support import TOKEN, ServerProcess, free_port, need_server_deps, random_noise, random_observation
from edgefm_ros.cloud import ClientConfig, CloudPolicy, CloudRejected, Encoding
from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor
from edgefm_ros.cloud.tasks import vla
from edgefm_ros.types import Observation

CAMS = ("observation.images.top",)
LIMITS = vla.VlaLimits(camera_keys=CAMS, state_dim=4, noise_shape=(8, 32), action_dim=5)


def _tensors(request: dict) -> list[Tensor]:
    request = json.loads(json.dumps(request))
    return [Tensor(i["name"], i["datatype"], i["shape"], i.get("parameters", {}), i["data"]) for i in request["inputs"]]


def _request(rng, **kw) -> dict:
    obs = Observation({CAMS[0]: rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)},
                      rng.standard_normal(4).astype(np.float32), "pick")
    return vla.encode_request(obs, Encoding(), request_id="r", dt=0.05, **kw)


def _decode(req):
    return vla.decode_request("r", req["parameters"], _tensors(req), LIMITS)


def test_prefix_and_delay_round_trip(rng):
    n, d = int(rng.integers(1, 9)), int(rng.integers(0, 9))
    prefix = rng.standard_normal((n, 5)).astype(np.float32)
    got = _decode(_request(rng, rtc_prefix=prefix, rtc_delay=d))
    np.testing.assert_array_equal(got.rtc_prefix, prefix)
    assert got.rtc_delay == d
    plain = _decode(_request(rng))
    assert plain.rtc_prefix is None and plain.rtc_delay == 0


@pytest.mark.parametrize("case,field", [
    ("wide", "'rtc_prefix'"), ("long", "'rtc_prefix'"), ("empty", "'rtc_prefix'"), ("flat", "'rtc_prefix'"),
    ("nan", "'rtc_prefix'"), ("int32", "'rtc_prefix'"), ("delay_alone", "'rtc_delay'"),
    ("delay_negative", "'rtc_delay'"), ("delay_float", "'rtc_delay'"), ("delay_big", "'rtc_delay'"),
    ("delay_bool", "'rtc_delay'")])
def test_bad_rtc_fields_named(rng, case, field):
    req = _request(rng, rtc_prefix=np.zeros((3, 5), np.float32), rtc_delay=1)
    pre = next(i for i in req["inputs"] if i["name"] == "rtc_prefix")
    if case == "wide":
        pre.update(shape=[3, 6], data=[0.0] * 18)
    elif case == "long":
        pre.update(shape=[9, 5], data=[0.0] * 45)
    elif case == "empty":
        pre.update(shape=[0, 5], data=[])
    elif case == "flat":
        pre.update(shape=[15], data=[0.0] * 15)
    elif case == "nan":
        pre["data"][4] = "NaN"
    elif case == "int32":
        pre["datatype"] = "INT32"
    elif case == "delay_alone":
        req["inputs"].remove(pre)
    else:
        req["parameters"]["rtc_delay"] = {"delay_negative": -1, "delay_float": 1.5, "delay_big": 9,
                                          "delay_bool": True}[case]
    with pytest.raises(ProtocolError, match=field):
        _decode(req)


def test_metadata_declares_rtc():
    meta = vla.metadata(LIMITS, {"schedule": "LINEAR", "execution_horizon": 10})
    inputs = {t["name"]: t for t in meta["inputs"]}
    assert inputs["rtc_prefix"]["datatype"] == "FP32" and inputs["rtc_prefix"]["shape"] == [-1, 5]
    assert inputs["rtc_prefix"]["parameters"]["rtc_schedule"] == "LINEAR"
    assert "rtc_delay" in meta["parameters"] and "[0, 8]" in meta["parameters"]["rtc_delay"]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    need_server_deps()
    d = tmp_path_factory.mktemp("cloud_rtc")
    (d / "token").write_text(TOKEN + "\n")
    port, grpc_port = free_port(), free_port()
    srv = ServerProcess(["--checkpoint", str(tiny_dirs[0]), "--vlm", str(tiny_dirs[1]), "--port", str(port),
                         "--grpc-port", str(grpc_port), "--token-file", str(d / "token")], d / "server.log")
    srv.url = f"http://127.0.0.1:{port}"
    srv.start().wait_ready(srv.url)
    yield srv
    srv.stop()


def test_guided_chunk_over_loopback_server_equals_local(server, local_engine, rng):
    spec = local_engine.spec
    cloud = CloudPolicy(server.url, TOKEN, config=ClientConfig())
    try:
        obs, noise = random_observation(spec, rng), random_noise(spec, rng)
        prev = local_engine.predict(obs, noise=random_noise(spec, rng)).actions
        n, d = int(rng.integers(2, spec.chunk_size + 1)), int(rng.integers(1, 4))
        prefix = prev[spec.chunk_size - n:]
        got = cloud.predict(obs, 20.0, Encoding("raw"), noise=noise, rtc_prefix=prefix, rtc_delay=d)
        want = local_engine.predict(obs, noise=noise, rtc_prefix=prefix, rtc_delay=d)
        np.testing.assert_array_equal(got.actions, want.actions)  # bit for bit
        free = cloud.predict(obs, 20.0, Encoding("raw"), noise=noise)
        assert not np.array_equal(free.actions, got.actions)  # the prefix was used
        with pytest.raises(CloudRejected, match="rtc_prefix"):
            cloud.predict(obs, 20.0, noise=noise, rtc_prefix=np.zeros((2, spec.action_dim + 1), np.float32))
    finally:
        cloud.close()


def test_a_robot_with_a_longer_chunk_is_fitted_to_the_served_model(server, local_engine, rng):
    """The robot's own model has more rows than the served one: its noise is dropped (the server draws its own)
    and its continuation cut to the served chunk, so the call succeeds instead of being refused."""
    spec = local_engine.spec
    cloud = CloudPolicy(server.url, TOKEN, config=ClientConfig())
    try:
        assert cloud.served_shape() == (spec.chunk_size, spec.max_action_dim)
        longer = spec.chunk_size + int(rng.integers(1, 20))
        noise = rng.standard_normal((longer, spec.max_action_dim)).astype(np.float32)
        prefix = rng.standard_normal((longer, spec.action_dim)).astype(np.float32)
        n, p, d = cloud.fit_to_served(noise, prefix, longer)
        assert n is None and np.array_equal(p, prefix[:spec.chunk_size]) and d == spec.chunk_size
        same = random_noise(spec, rng)
        assert cloud.fit_to_served(same, prefix[:3], 2)[0] is same  # a matching robot is left alone
        obs = random_observation(spec, rng)
        got = cloud.predict(obs, 20.0, Encoding("raw"), noise=noise, rtc_prefix=prefix, rtc_delay=3)
        assert got.actions.shape == (spec.chunk_size, spec.action_dim) and np.isfinite(got.actions).all()
        want = local_engine.predict(obs, noise=random_noise(spec, rng), rtc_prefix=prefix[:spec.chunk_size],
                                    rtc_delay=3)
        # guided toward the same continuation: the first (executed-meanwhile) rows follow the prefix on both
        np.testing.assert_allclose(got.actions[:2], want.actions[:2], atol=0.5)
    finally:
        cloud.close()

"""The real cloud tier on loopback: `edgefm-cloud serve` (MLServer + our runtime + nginx with a bearer
token and TLS) against the local engine on the same tiny checkpoint.

One server serves the whole module; the last test kills it and starts it again.
"""
from __future__ import annotations

import base64
import http.client
import json
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cloud_support import TOKEN, ServerProcess, free_port, need_server_deps, random_noise, random_observation
from edgefm_ros.cloud import (BreakerConfig, ClientConfig, CloudDeadlineExceeded, CloudPolicy, CloudRejected,
                              CloudUnavailable, Encoding)
from edgefm_ros.cloud.images import decode_image, encode_image
from edgefm_ros.cloud.core.protocol import request_body
from edgefm_ros.cloud.tasks.vla import encode_request

SLACK_S = 0.2  # scheduling slack on a shared 2-core machine (the injected delays are 0.8 s and more)
MAX_BODY_MB = 1


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed (needed to make a test certificate)")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem")], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture(scope="module")
def server(tiny_dirs, tls_files, tmp_path_factory):
    need_server_deps()
    d = tmp_path_factory.mktemp("cloud")
    (d / "token").write_text(TOKEN + "\n")
    port, grpc_port = free_port(), free_port()
    srv = ServerProcess(["--checkpoint", str(tiny_dirs[0]), "--vlm", str(tiny_dirs[1]), "--port", str(port),
                         "--grpc-port", str(grpc_port), "--token-file", str(d / "token"),
                         "--tls-cert", str(tls_files[0]), "--tls-key", str(tls_files[1]),
                         "--max-body-mb", str(MAX_BODY_MB), "--fault-injection"], d / "server.log")
    srv.url, srv.port, srv.grpc_port, srv.cert = f"https://127.0.0.1:{port}", port, grpc_port, str(tls_files[0])
    srv.start().wait_ready(srv.url)
    yield srv
    srv.stop()


def client(server, **kw) -> CloudPolicy:
    config = kw.pop("config", ClientConfig())
    return CloudPolicy(server.url, kw.pop("token", TOKEN), ca_file=server.cert, config=config, **kw)


def post(server, path: str, body: bytes, token: str | None = TOKEN) -> tuple[int, dict, dict]:
    ctx = ssl.create_default_context(cafile=server.cert)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=ctx)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = {"raw": data.decode("utf-8", "replace")}
    return r.status, parsed, dict(r.getheaders())


INFER = "/v2/models/smolvla/infer"


def test_exact_chunk_identical_to_local_engine(server, local_engine, rng):
    spec = local_engine.spec
    cloud = client(server)
    obs, noise = random_observation(spec, rng), random_noise(spec, rng)
    chunk = cloud.predict(obs, 20.0, Encoding("raw"), noise=noise, seq=7, dt=0.05)
    local = local_engine.predict(obs, noise=noise, dt=0.05, seq=7)
    assert chunk.source == "cloud" and chunk.seq == 7 and chunk.dt == 0.05 and chunk.stamp == obs.stamp
    assert chunk.actions.dtype == np.float32 and chunk.actions.shape == (spec.chunk_size, spec.action_dim)
    np.testing.assert_array_equal(chunk.actions, local.actions)  # bit for bit
    timing = cloud.last.server
    assert timing["prefill_s"] > 0 and timing["decode_s"] > 0 and timing["queue_s"] >= 0
    assert timing["server_s"] >= timing["prefill_s"] + timing["decode_s"]
    assert cloud.last.upload_bytes > sum(im.nbytes for im in obs.images.values())

    # other noise, other chunk: the noise sent is the noise used
    other = cloud.predict(obs, 20.0, Encoding("raw"), noise=random_noise(spec, rng))
    assert not np.array_equal(other.actions, chunk.actions)

    # float32 (3, H, W) images travel raw and exactly too
    obs_f = random_observation(spec, rng)
    chw = {k: (v.transpose(2, 0, 1) / np.float32(255)).astype(np.float32) for k, v in obs_f.images.items()}
    obs_f = type(obs_f)(chw, obs_f.state, obs_f.task, obs_f.stamp)
    np.testing.assert_array_equal(cloud.predict(obs_f, 20.0, noise=noise).actions,
                                  local_engine.predict(obs_f, noise=noise).actions)

    # JPEG: the server runs on the decoded JPEG, exactly as the local engine does on the same pixels
    enc = Encoding("jpeg", 70)
    seen = {k: decode_image(*encode_image(v, enc), 4096) for k, v in obs.images.items()}
    assert any(not np.array_equal(seen[k], obs.images[k]) for k in seen)  # lossy indeed
    cloud_jpeg = cloud.predict(obs, 20.0, enc, noise=noise)
    local_jpeg = local_engine.predict(type(obs)(seen, obs.state, obs.task, obs.stamp), noise=noise)
    np.testing.assert_array_equal(cloud_jpeg.actions, local_jpeg.actions)
    assert cloud.stats()["cloud"] == 4


def test_health_is_open_everything_else_needs_the_token(server, local_engine, rng):
    ctx = ssl.create_default_context(cafile=server.cert)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=5, context=ctx)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    conn.close()
    body = request_body(encode_request(random_observation(local_engine.spec, rng), Encoding(), request_id="a", dt=0.1))
    for token in (None, TOKEN[:-1] + "x", TOKEN + "x"):
        status, err, headers = post(server, INFER, body, token=token)
        assert status == 401, (token, status, err)
        assert "token" in err["error"] and headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert post(server, INFER, body)[0] == 200

    # the client reports 401 as a rejection (no retry) and the breaker stays closed
    anon = client(server, token=None)
    for _ in range(4):
        with pytest.raises(CloudRejected) as e:
            anon.predict(random_observation(local_engine.spec, rng), 5.0)
        assert e.value.status == 401
    assert anon.stats()["breaker"] == "closed" and anon.stats()["sent"] == 4
    assert client(server).healthy() and not anon.healthy()


def test_tls_verification_and_plain_http(server, local_engine, rng):
    obs = random_observation(local_engine.spec, rng)
    untrusting = CloudPolicy(server.url, TOKEN)  # system CAs only: the self-signed certificate fails
    with pytest.raises(CloudUnavailable) as e:
        untrusting.predict(obs, 5.0)
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    plain = CloudPolicy(f"http://127.0.0.1:{server.port}", TOKEN)
    with pytest.raises(CloudRejected) as e:  # nginx: plain HTTP sent to the HTTPS port
        plain.predict(obs, 5.0)
    assert e.value.status == 400


def test_grpc_auth_and_exact_inference(server, local_engine, rng):
    grpc = pytest.importorskip("grpc")
    from mlserver.grpc import dataplane_pb2 as pb
    from mlserver.grpc import dataplane_pb2_grpc as pb_grpc

    creds = grpc.ssl_channel_credentials(root_certificates=Path(server.cert).read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", creds) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelReady(pb.ModelReadyRequest(name="smolvla"), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        meta = (("authorization", f"Bearer {TOKEN}"),)
        assert stub.ModelReady(pb.ModelReadyRequest(name="smolvla"), timeout=5, metadata=meta).ready
        # a whole inference over gRPC: raw image bytes, no base64
        spec = local_engine.spec
        obs, noise = random_observation(spec, rng), random_noise(spec, rng)
        T = pb.ModelInferRequest.InferInputTensor
        inputs = [T(name="state", datatype="FP32", shape=[spec.state_dim],
                    contents=pb.InferTensorContents(fp32_contents=obs.state.tolist())),
                  T(name="task", datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[obs.task.encode()])),
                  T(name="noise", datatype="FP32", shape=list(noise.shape),
                    contents=pb.InferTensorContents(fp32_contents=noise.ravel().tolist()))]
        for k, img in obs.images.items():  # raw uint8 bytes; the shape as text (gRPC parameters hold no lists)
            params = {"image_encoding": pb.InferParameter(string_param="raw"),
                      "image_dtype": pb.InferParameter(string_param="uint8"),
                      "image_shape": pb.InferParameter(string_param=",".join(map(str, img.shape)))}
            inputs.append(T(name=k, datatype="BYTES", shape=[1], parameters=params,
                            contents=pb.InferTensorContents(bytes_contents=[img.tobytes()])))
        req = pb.ModelInferRequest(model_name="smolvla", id="g1", inputs=inputs)
        resp = stub.ModelInfer(req, timeout=10, metadata=meta)
        local = local_engine.predict(obs, noise=noise)
        out = resp.outputs[0]
        actions = np.asarray(out.contents.fp32_contents or np.frombuffer(resp.raw_output_contents[0], np.float32),
                             dtype=np.float32).reshape(list(out.shape))
        np.testing.assert_array_equal(actions, local.actions)
        # a malformed request gets INVALID_ARGUMENT naming the problem
        req.inputs[-1].parameters["image_shape"].string_param = "1,2"
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=10, metadata=meta)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "image_shape" in e.value.details()


def _runs(server, local_engine, rng) -> int:
    body = request_body(encode_request(random_observation(local_engine.spec, rng), Encoding(), request_id="r", dt=0.1))
    status, resp, _ = post(server, INFER, body)
    assert status == 200, resp
    return int(resp["parameters"]["runs"])


def test_oversize_and_malformed_refused_before_the_model(server, local_engine, rng):
    spec = local_engine.spec
    before = _runs(server, local_engine, rng)
    good = encode_request(random_observation(spec, rng), Encoding(), request_id="m", dt=0.1)

    def variant(fn) -> bytes:
        req = json.loads(json.dumps(good))
        fn(req)
        return request_body(req)

    def inp(req, name):
        return next(i for i in req["inputs"] if i["name"] == name)

    cam = spec.camera_keys[0]
    big = random_observation(spec, rng, size=(600, 600))  # 2 x 1.08 MB raw, over the 1 MB limit
    cases = {
        "oversize": (request_body(encode_request(big, Encoding(), request_id="o", dt=0.1)), 413, "limit"),
        "not json": (b"{inputs: nope", 400, ""),
        "no inputs": (b'{"id": "x"}', 400, ""),
        "too many cameras": (variant(lambda r: r["inputs"].append(dict(inp(r, cam), name="observation.images.extra"))),
                             400, "too many cameras"),
        "unknown camera": (variant(lambda r: inp(r, cam).update(name="observation.images.nope")), 400, "unknown input"),
        "state shape": (variant(lambda r: inp(r, "state").update(shape=[spec.state_dim + 1],
                                                                  data=[0.5] * (spec.state_dim + 1))), 400, "'state'"),
        "state type": (variant(lambda r: inp(r, "state").update(datatype="INT32")), 400, "FP32"),
        "state nan": (variant(lambda r: inp(r, "state")["data"].__setitem__(0, "NaN")), 400, "state"),
        "no task": (variant(lambda r: r["inputs"].remove(inp(r, "task"))), 400, "'task'"),
        "image bytes": (variant(lambda r: inp(r, cam)["data"].__setitem__(0, base64.b64encode(b"\0" * 100).decode())),
                        400, "do not match"),
        "image shape": (variant(lambda r: inp(r, cam)["parameters"].update(image_shape=[3, 48, 64])), 400, "(H, W, 3)"),
        "not base64": (variant(lambda r: inp(r, cam)["data"].__setitem__(0, "%%%")), 400, "base64"),
        "not jpeg": (variant(lambda r: inp(r, cam)["parameters"].update(image_encoding="jpeg")), 400, "not a JPEG"),
        "noise shape": (variant(lambda r: r["inputs"].append({"name": "noise", "datatype": "FP32", "shape": [2, 2],
                                                              "data": [0.1] * 4})), 400, "'noise'"),
        "bad missing": (variant(lambda r: r["parameters"].update(missing=["observation.images.zzz"])), 400, "missing"),
        "seq float": (variant(lambda r: r["parameters"].update(seq=2.5)), 400, "parameter 'seq'"),
        "seq bool": (variant(lambda r: r["parameters"].update(seq=True)), 400, "parameter 'seq'"),
        "deadline text": (variant(lambda r: r["parameters"].update(deadline_s="soon")), 400, "parameter 'deadline_s'"),
        "deadline negative": (variant(lambda r: r["parameters"].update(deadline_s=-1)), 400, "parameter 'deadline_s'"),
    }
    for name, (body, status, text) in cases.items():
        got, err, _ = post(server, INFER, body)
        assert got == status or (status == 400 and 400 <= got < 500), (name, got, err)
        assert text in json.dumps(err), (name, err)
    assert _runs(server, local_engine, rng) == before + 1  # none of them ran the model


def test_tritonclient_infers_from_the_metadata_alone(server, local_engine, rng):
    """The KServe ecosystem's own client, as a new user would use it: tensor names, datatypes, shapes and
    the image convention come from GET /v2/models/smolvla; the chunk is the local engine's, bit for bit."""
    import cv2
    import tritonclient.http as triton

    spec, headers = local_engine.spec, {"Authorization": f"Bearer {TOKEN}"}
    with triton.InferenceServerClient(f"127.0.0.1:{server.port}", ssl=True,
                                      ssl_options={"ca_certs": server.cert}) as tc:
        assert tc.is_model_ready("smolvla", headers=headers)
        meta = tc.get_model_metadata("smolvla", headers=headers)
        inputs = {t["name"]: t for t in meta["inputs"]}
        assert set(inputs) == {"state", "task", "noise", "rtc_prefix", *spec.camera_keys}
        assert (inputs["state"]["datatype"], inputs["state"]["shape"]) == ("FP32", [spec.state_dim])
        assert (inputs["noise"]["datatype"], inputs["noise"]["shape"]) == ("FP32", [spec.chunk_size,
                                                                                    spec.max_action_dim])
        for k in spec.camera_keys:
            assert (inputs[k]["datatype"], inputs[k]["shape"]) == ("BYTES", [1])
            assert {"image_encoding", "image_dtype", "image_shape"} <= set(inputs[k]["parameters"])
            assert "base64" in inputs[k]["parameters"]["data"]
        (out,) = meta["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == ("actions", "FP32", [spec.chunk_size, spec.action_dim])
        assert {"seq", "dt", "deadline_s", "missing", "image_encoding"} <= set(meta["parameters"])

        obs, noise = random_observation(spec, rng), random_noise(spec, rng)
        jpegs = {k: cv2.imencode(".jpg", np.ascontiguousarray(v[:, :, ::-1]))[1].tobytes()  # RGB -> BGR
                 for k, v in obs.images.items()}
        arrays = {"state": obs.state, "task": np.array([obs.task.encode()], dtype=object), "noise": noise,
                  **{k: np.array([base64.b64encode(b)], dtype=object) for k, b in jpegs.items()}}
        req = []
        for name, a in arrays.items():  # one InferInput per declared tensor, as the metadata says
            req.append(triton.InferInput(name, list(a.shape), inputs[name]["datatype"]))
            req[-1].set_data_from_numpy(a, binary_data=False)
        res = tc.infer("smolvla", req, outputs=[triton.InferRequestedOutput("actions", binary_data=False)],
                       headers=headers, parameters={"image_encoding": "jpeg", "seq": 11, "dt": 0.05})
    seen = {k: decode_image(b, {"image_encoding": "jpeg"}, 4096) for k, b in jpegs.items()}
    local = local_engine.predict(type(obs)(seen, obs.state, obs.task, obs.stamp), noise=noise, dt=0.05, seq=11)
    np.testing.assert_array_equal(res.as_numpy("actions"), local.actions)
    assert res.get_response()["parameters"]["seq"] == 11


def test_slow_server_deadline_fallback(server, local_engine, rng):
    spec = local_engine.spec
    obs, noise = random_observation(spec, rng), random_noise(spec, rng)
    slow = client(server, config=ClientConfig(request_parameters=(("fault_delay_s", 0.8),)))
    t0 = time.monotonic()
    with pytest.raises(CloudDeadlineExceeded):
        slow.predict(obs, 0.3, noise=noise)
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed <= 0.3 + SLACK_S

    # hedged: the edge runs at once in parallel; the cloud misses its deadline; the edge chunk is used
    edge_s = []

    def edge():
        t = time.monotonic()
        chunk = local_engine.predict(obs, noise=noise, seq=3)
        edge_s.append(time.monotonic() - t)
        return chunk

    t0 = time.monotonic()
    chunk = slow.predict_or_edge(obs, 0.3, edge, hedge=True, noise=noise, seq=3)
    elapsed = time.monotonic() - t0
    assert chunk.source == "edge-fallback" and elapsed <= max(0.3, edge_s[0]) + SLACK_S, (elapsed, edge_s)
    np.testing.assert_array_equal(chunk.actions, edge().actions)
    st = slow.stats()
    # the hedged call ends at its deadline, or - when the edge took longer than that - with the server's
    # 504 for a request that queued past its budget behind the first one
    assert st["fail_deadline"] + st.get("fail_server_error", 0) == 2 and st["fail_deadline"] >= 1, st
    assert st["edge-fallback"] == 1

    # a queued request whose budget ran out is dropped by the server (504), not run
    time.sleep(0.8)  # let the delayed requests drain
    fast = client(server, config=ClientConfig(max_attempts=1))
    hold = client(server, config=ClientConfig(request_parameters=(("fault_delay_s", 1.2),)))
    blocker = threading.Thread(target=lambda: _swallow(hold.submit(obs, 3.0).result))
    before = _runs(server, local_engine, rng)
    blocker.start()
    time.sleep(0.4)  # the blocker holds the engine for 1.2 s
    with pytest.raises((CloudUnavailable, CloudDeadlineExceeded)):
        fast.predict(obs, 0.4)
    blocker.join()
    time.sleep(0.5)
    assert _runs(server, local_engine, rng) == before + 2  # the blocker and this probe; not the dropped one


def _swallow(fn):
    try:
        fn()
    except Exception:
        pass


def test_server_killed_breaker_opens_and_closes_after_restart(server, local_engine, rng):
    """Runs last in the module: kills the server (whole process group) mid-request and restarts it."""
    from edgefm_ros.routing.link import LinkConfig, LinkEstimator

    spec = local_engine.spec
    obs, noise = random_observation(spec, rng), random_noise(spec, rng)
    link = LinkEstimator(LinkConfig(min_sample_bytes=1024))
    cfg = ClientConfig(breaker=BreakerConfig(failures=3, cooldown_s=5.0))
    cloud = client(server, config=cfg, link=link)
    slow = client(server, config=ClientConfig(request_parameters=(("fault_delay_s", 2.0),)), link=link)

    def edge():
        return local_engine.predict(obs, noise=noise)

    assert cloud.predict_or_edge(obs, 2.0, edge, noise=noise).source == "cloud"
    assert link.rtt_s(cloud.clock()) >= 0 and link.bandwidth_mbps(cloud.clock()) > 0

    # killed while a request is in flight: the caller learns it at once, well before the deadline
    pending = slow.submit(obs, 5.0, noise=noise)
    time.sleep(0.3)
    t0 = time.monotonic()
    server.kill()
    with pytest.raises(CloudUnavailable):
        pending.result()
    assert time.monotonic() - t0 < 1.0

    # the robot keeps getting chunks within each deadline; the breaker opens after 3 failures
    expected = edge().actions
    edge_s: list[float] = []

    def timed_edge():
        t = time.monotonic()
        try:
            return edge()
        finally:
            edge_s.append(time.monotonic() - t)

    cloud_s, chunks = [], []
    for _ in range(6):
        t0 = time.monotonic()
        chunks.append(cloud.predict_or_edge(obs, 0.25, timed_edge, edge_reserve_s=0.0, noise=noise))
        cloud_s.append(time.monotonic() - t0 - edge_s[-1])  # the cloud attempt alone
    assert [c.source for c in chunks] == ["edge-fallback"] * 6
    for c in chunks:
        np.testing.assert_array_equal(c.actions, expected)
    assert max(cloud_s) <= 0.25 + SLACK_S, cloud_s  # never past the deadline: the robot is never kept waiting
    st = cloud.stats()
    assert st["breaker"] in ("open", "half_open") and st["breaker_opened"] == 1
    assert st["sent"] == 4 and st["fallback_breaker_open"] == 3  # 1 before the kill, 3 failing; then not sent
    assert link.breaker_open(cloud.clock())

    # back up: after the cool-down one probe goes through and closes the breaker
    server.start().wait_ready(server.url)
    deadline = time.monotonic() + 15.0
    source = None
    while time.monotonic() < deadline and source != "cloud":
        source = cloud.predict_or_edge(obs, 1.0, edge, noise=noise).source
        time.sleep(0.1)
    assert source == "cloud"
    st = cloud.stats()
    assert st["breaker"] == "closed" and cloud.breaker.closed_again == 1
    assert not link.breaker_open(cloud.clock())
    np.testing.assert_array_equal(cloud.predict(obs, 2.0, noise=noise).actions, edge().actions)

"""The cloud scene-question endpoint for real: `edgefm-cloud serve --task vqa` (MLServer + VqaRuntime +
nginx with a bearer token) on loopback serving a random tiny SmolVLM2, against the local LlmEngine on the
same weights: plain and streamed answers (token by token through nginx, a stalled stream abandoned at
its deadline); then scene_query_node, whose link probe opens the router's guard, streaming a cloud answer
and falling back to the edge when the server is killed mid-answer. One server serves the module; the
last test kills it."""
from __future__ import annotations

import base64
import http.client
import json
import math
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vqa_support (test files are imported by path)

from vqa_support import QUESTIONS, TOKEN, start_vqa_server, write_router_yaml  # noqa: E402

from edgefm_ros.cloud import (BreakerConfig, CloudDeadlineExceeded, CloudRejected, CloudUnavailable,  # noqa: E402
                              Encoding)
from edgefm_ros.cloud.client.base import ClientConfig  # noqa: E402
from edgefm_ros.cloud.client.vqa import VqaClient  # noqa: E402
from edgefm_ros.cloud.core.protocol import request_body  # noqa: E402
from edgefm_ros.cloud.images import decode_image, encode_image  # noqa: E402
from edgefm_ros.cloud.tasks.vqa import encode_vqa_request  # noqa: E402
from edgefm_ros.cloud.prompt import vqa_messages  # noqa: E402

SLACK_S = 0.3  # scheduling slack on a shared 2-core machine
SYSTEM = "Answer briefly."


@pytest.fixture
def rng():
    return np.random.default_rng()  # fresh inputs every run


@pytest.fixture(scope="module")
def server(tiny_vlm, tmp_path_factory):
    srv = start_vqa_server(tiny_vlm[0], tmp_path_factory.mktemp("vqa_cloud"), "--fault-injection")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def local(tiny_vlm):
    """The local engine on the server's weights, with room for two images."""
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    return LlmEngine.from_dir(tiny_vlm[0], LlmEngineConfig(capacity=512))


def greedy(engine, question: str, images: list, n: int, system: str | None = SYSTEM):
    from edgefm_ros.generation.generate import SamplingConfig

    return engine.generate(vqa_messages(question, len(images), system), SamplingConfig(max_new_tokens=n), None,
                           images or None)


def post(server, body: bytes, token: str | None = TOKEN) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        conn.request("POST", "/v2/models/vqa/infer", body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def test_cloud_answer_is_the_local_greedy_answer(server, local, rng):
    from edgefm_ros.routing.link import LinkEstimator

    link = LinkEstimator()
    client = VqaClient(server.url, TOKEN, link=link)
    try:
        assert client.healthy()
        images = [rng.integers(0, 256, size=(int(rng.integers(24, 96)), int(rng.integers(24, 96)), 3), dtype=np.uint8)
                  for _ in range(2)]
        question, n = str(rng.choice(QUESTIONS)), int(rng.integers(4, 9))
        a = client.ask(question, images, 30.0, system=SYSTEM, max_new_tokens=n)
        ref = greedy(local, question, images, n)
        assert a.tokens == tuple(ref.tokens) and a.text == ref.text and a.stop_reason == ref.stop_reason
        assert a.model == "smolvlm2" and a.attempts == 1 and a.upload_bytes > sum(i.nbytes for i in images)
        s = a.server
        assert 0 < s["prefill_s"] <= s["engine_s"] <= s["server_s"] < a.total_s and s["queue_s"] >= 0
        assert np.isfinite(link.snapshot(time.monotonic()).rtt_s)  # the call fed the router's link estimate
        # JPEG, downscaled: the answer the local engine gives for the pixels the server decoded
        enc = Encoding("jpeg", int(rng.integers(60, 95)), 32)
        a = client.ask(question, images[:1], 30.0, encoding=enc, system=SYSTEM, max_new_tokens=n)
        seen = decode_image(encode_image(images[0], enc)[0], {"image_encoding": "jpeg"}, 4096)
        assert a.tokens == tuple(greedy(local, question, [seen], n).tokens)
        assert client.stats()["cloud"] == 2
    finally:
        client.close()


def test_refusals_name_the_bad_field(server, rng):
    img = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    good = encode_vqa_request("what is this?", [img], request_id="ok", max_new_tokens=2)
    assert post(server, request_body(good), token=None)[0] == 401
    assert post(server, request_body(good))[0] == 200
    cases = {"question": {**good, "inputs": good["inputs"][1:]},
             "max_new_tokens": {**good, "parameters": {"max_new_tokens": 10 ** 6}},
             "too many images": encode_vqa_request("what?", [img] * 5, request_id="many"),
             "image_0": {**good, "inputs": [good["inputs"][0], {**good["inputs"][1], "data": ["%%%"]}]},
             "deadline_s": {**good, "parameters": {**good["parameters"], "deadline_s": "soon"}},
             "seed": {**good, "parameters": {**good["parameters"], "seed": 1.5}}}
    for field, req in cases.items():
        status, body = post(server, request_body(req))
        assert status == 400 and field in json.loads(body)["error"], (field, status, body)
    client = VqaClient(server.url, TOKEN)
    with pytest.raises(CloudRejected, match="too many images"):
        client.ask("what?", [img] * 5, 10.0)
    assert client.breaker.state(time.monotonic()) == "closed"  # a refusal is not a server failure
    client.close()


def test_tritonclient_infers_from_the_metadata_alone(server, local, rng):
    """The KServe ecosystem's own client: GET /v2/models/vqa declares every input, output and request
    parameter; an answer asked with tritonclient from that alone is the local greedy answer."""
    import tritonclient.http as triton

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with triton.InferenceServerClient(f"127.0.0.1:{server.port}") as tc:
        meta = tc.get_model_metadata("vqa", headers=headers)
        inputs = {t["name"]: t for t in meta["inputs"]}
        assert set(inputs) == {"question", "system", "image_0", "image_1", "image_2", "image_3"}
        assert all((t["datatype"], t["shape"]) == ("BYTES", [1]) for t in inputs.values())
        assert {"image_encoding", "image_dtype", "image_shape"} <= set(inputs["image_0"]["parameters"])
        outputs = {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]}
        assert outputs == {"answer": ("BYTES", [1]), "tokens": ("INT64", [-1]), "delta": ("BYTES", [1])}
        assert {"max_new_tokens", "temperature", "top_k", "top_p", "seed", "deadline_s",
                "image_encoding"} <= set(meta["parameters"])

        img = rng.integers(0, 256, size=(int(rng.integers(24, 64)), int(rng.integers(24, 64)), 3), dtype=np.uint8)
        question, n = str(rng.choice(QUESTIONS)), int(rng.integers(3, 7))
        arrays = {"question": np.array([question.encode()], dtype=object),
                  "system": np.array([SYSTEM.encode()], dtype=object),
                  "image_0": np.array([base64.b64encode(img.tobytes())], dtype=object)}
        req = []
        for name, a in arrays.items():
            req.append(triton.InferInput(name, list(a.shape), inputs[name]["datatype"]))
            req[-1].set_data_from_numpy(a, binary_data=False)
        outs = [triton.InferRequestedOutput(name, binary_data=False) for name in ("answer", "tokens")]
        res = tc.infer("vqa", req, outputs=outs, headers=headers,
                       parameters={"max_new_tokens": n, "image_encoding": "raw", "image_dtype": "uint8",
                                   "image_shape": list(img.shape)})
    ref = greedy(local, question, [img], n)
    answer = res.as_numpy("answer")[0]
    assert (answer.decode() if isinstance(answer, bytes) else answer) == ref.text
    assert res.as_numpy("tokens").tolist() == list(ref.tokens)


def test_deadline_on_a_slow_server_and_504_when_queued_past_it(server, rng):
    img = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    slow = VqaClient(server.url, TOKEN,
                     config=ClientConfig.for_task("vqa", request_parameters=(("fault_delay_s", 1.5),)))
    t0 = time.monotonic()
    with pytest.raises(CloudDeadlineExceeded):
        slow.ask("what is this?", [img], 0.5, max_new_tokens=2)
    assert time.monotonic() - t0 < 0.5 + SLACK_S
    slow.close()
    # the slow request still holds the engine for ~1 s: a request with a 0.2 s budget waits longer than that
    status, body = post(server, request_body(encode_vqa_request("what?", [img], request_id="late",
                                                                max_new_tokens=2, deadline_s=0.2)))
    assert status == 504 and "deadline" in json.loads(body)["error"]


def slow_tokens(delay_s: float, **kw) -> ClientConfig:
    """A client whose requests make the server (--fault-injection) take ``delay_s`` per token."""
    return ClientConfig.for_task("vqa", request_parameters=(("fault_token_delay_s", delay_s),), **kw)


def test_streamed_answer_arrives_token_by_token_and_is_the_local_greedy_answer(server, local, rng):
    from edgefm_ros.routing.link import LinkEstimator

    delay = 0.05
    link = LinkEstimator()
    client = VqaClient(server.url, TOKEN, link=link, config=slow_tokens(delay))
    try:
        images = [rng.integers(0, 256, size=(int(rng.integers(24, 80)), int(rng.integers(24, 80)), 3),
                               dtype=np.uint8) for _ in range(int(rng.integers(1, 3)))]
        question, n = str(rng.choice(QUESTIONS)), int(rng.integers(6, 11))
        partials: list[tuple[float, str]] = []
        t0 = time.monotonic()
        a = client.ask_stream(question, images, 30.0, on_partial=lambda t: partials.append((time.monotonic(), t)),
                              system=SYSTEM, max_new_tokens=n)
        t_final = time.monotonic()
        ref = greedy(local, question, images, n)
        assert a.tokens == tuple(ref.tokens) and a.text == ref.text and a.stop_reason == ref.stop_reason
        texts = [t for _, t in partials]
        assert texts and texts[-1] == a.text and all(b.startswith(x) and b != x for x, b in zip(texts, texts[1:]))
        # the partials were not held back (by nginx or the server) until the end: they came while the
        # answer was generated, at the pace of the tokens
        times = [t for t, _ in partials]
        assert times[0] < t_final - 0.5 * delay * (len(texts) - 1) and times[-1] - times[0] >= 0.5 * delay * (
            len(texts) - 1), (times, t_final)
        assert 0 < a.first_text_s <= times[0] - t0 + 0.01 and a.first_text_s < a.total_s
        assert a.server["prefill_s"] <= a.server["engine_s"] and a.attempts == 1
        assert np.isfinite(link.snapshot(time.monotonic()).rtt_s)  # the stream fed the link estimate
        # the plain call still answers the same, in one piece
        b = client.ask(question, images, 30.0, system=SYSTEM, max_new_tokens=n)
        assert b.tokens == a.tokens and np.isnan(b.first_text_s)
        assert client.stats()["cloud"] == 2
    finally:
        client.close()


def test_stalled_stream_is_abandoned_at_its_deadline_and_counted_as_a_failure(server, rng):
    from edgefm_ros.routing.link import LinkEstimator

    img = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    link = LinkEstimator()
    client = VqaClient(server.url, TOKEN, link=link, config=slow_tokens(0.3, breaker=BreakerConfig(1, 60.0)))
    partials = []
    t0 = time.monotonic()
    with pytest.raises(CloudDeadlineExceeded, match="did not finish"):
        client.ask_stream("what is this?", [img], 1.0, on_partial=partials.append, max_new_tokens=12)
    assert time.monotonic() - t0 < 1.0 + SLACK_S and partials  # some text came, the answer never did
    assert client.stats()["fail_deadline"] == 1 and link.consecutive_failures == 1
    with pytest.raises(CloudUnavailable, match="breaker"):  # a failure like any other: the breaker opened
        client.ask_stream("what is this?", [img], 1.0, max_new_tokens=2)
    client.close()
    # the server stopped generating for the client that went away: the engine is free long before the
    # ~3 s the abandoned answer still had to go
    again = VqaClient(server.url, TOKEN)
    a = again.ask("what is this?", [img], 10.0, max_new_tokens=2)
    assert a.server["queue_s"] < 1.0, a.server
    again.close()


def test_node_streams_cloud_answers_then_falls_back_when_the_server_dies_mid_answer(server, local, tmp_path, rng,
                                                                            ros_domain_id, spin_in_background):
    rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 Jazzy wheels) is not installed")
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.context import Context
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from edgefm_ros.nodes.scene_query_node import SceneQueryNode
    from edgefm_ros.ros import qos
    from edgefm_ros.ros.diagnostics import status_values

    timeout_s, n, delay = 6.0, 8, 0.1
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    # no static link: the node's link probe (/edgefm/probe on the server's nginx) gives the router its estimate
    params = [Parameter("camera_topics", value=["/vqa_cam"]), Parameter("max_new_tokens", value=n),
              Parameter("question_topic", value="/vqa_q"), Parameter("answer_topic", value="/vqa_a"),
              Parameter("partial_topic", value="/vqa_p"), Parameter("info_topic", value="/vqa_info"),
              Parameter("system_prompt", value=SYSTEM), Parameter("cloud_url", value=server.url),
              Parameter("cloud_token_file", value=str(server.token_file)),
              Parameter("cloud_timeout_s", value=timeout_s), Parameter("probe_period_s", value=0.5),
              Parameter("router_config", value=str(write_router_yaml(tmp_path / "router.yaml"))),
              Parameter("diagnostics_period_s", value=0.2), Parameter("max_image_age_s", value=120.0)]
    # the server takes `delay` per token for this client: its answers are still streaming when it is killed
    cloud = VqaClient(server.url, TOKEN, config=slow_tokens(delay))
    node = SceneQueryNode(engine=local, cloud=cloud, context=ctx, parameter_overrides=params)
    cloud.link = node.answerer.router.link  # as make_cloud_client wires it
    peer = rclpy.create_node("vqa_peer", context=ctx)
    answers, partials, infos, diags = [], [], [], []
    kill_on_partial = threading.Event()

    def on_partial(m):
        partials.append((time.monotonic(), m.data))
        if kill_on_partial.is_set():
            kill_on_partial.clear()
            threading.Thread(target=server.kill, daemon=True).start()

    peer.create_subscription(String, "/vqa_a", lambda m: answers.append((time.monotonic(), m.data)), qos.RELIABLE)
    peer.create_subscription(String, "/vqa_p", on_partial, qos.LATEST)
    peer.create_subscription(String, "/vqa_info", lambda m: infos.append(json.loads(m.data)), qos.RELIABLE)
    peer.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diags.extend(m.status), qos.DIAGNOSTICS)
    cam = peer.create_publisher(Image, "/vqa_cam", qos.SENSOR)
    ask = peer.create_publisher(String, "/vqa_q", qos.RELIABLE)
    ex = MultiThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(peer)

    def wait_for(cond, what: str, limit_s: float = 30.0):
        end = time.monotonic() + limit_s
        while not cond() and time.monotonic() < end:
            time.sleep(0.05)
        assert cond(), f"{what} within {limit_s} s"

    spinner = spin_in_background(ex, ctx)
    rgb = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    img = Image(height=48, width=64, encoding="rgb8", step=64 * 3, data=rgb.tobytes())
    q1, q2 = (str(q) for q in rng.choice(QUESTIONS, size=2, replace=False))
    try:
        assert math.isnan(node.answerer.router.link.snapshot(time.monotonic()).bandwidth_mbps)
        wait_for(lambda: node._prober.ok >= 1, "a link probe", 10.0)
        wait_for(lambda: cam.publish(img) or node._latest_frames(), "a camera frame")
        ask.publish(String(data=q1))
        wait_for(lambda: len(infos) == 1 and answers, "the cloud answer")
        info = infos[0]
        assert (info["source"], info["target"], info["candidate"], info["reason"]) == \
            ("cloud", "cloud", "cloud-vqa", "cloud_gain"), info  # the probe opened the bandwidth guard
        ref1 = greedy(local, q1, [rgb], n).text
        assert answers[0][1] == ref1.strip() and node._cloud.stats()["cloud"] == 1
        # streamed: growing partials, published while the answer was generated, ending in the answer
        texts = [t for _, t in partials]
        assert len(texts) >= 2 and texts[-1] == ref1 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))
        assert partials[0][0] < answers[0][0] - delay * (len(texts) - 1) / 2, (partials, answers)

        partials.clear()
        kill_on_partial.set()  # the first partial of the next answer kills the server mid-stream
        ask.publish(String(data=q2))
        wait_for(lambda: len(infos) == 2 and len(answers) == 2, "the fallback answer")
        info = infos[1]
        assert (info["source"], info["target"]) == ("edge-fallback", "cloud") and \
            info["fallback"].startswith("connection") and "stream" in info["fallback"], info
        assert info["cloud_s"] < timeout_s  # gave up on the cloud at once, not at its timeout
        ref2 = greedy(local, q2, [rgb], n).text
        assert answers[1][1] == ref2.strip() and len(answers) == 2  # the edge's whole answer, never the half one
        texts = [t for _, t in partials]
        assert texts[-1] == ref2 and any(ref2.startswith(t) for t in texts)  # the edge's answer streamed too

        def fallback_reported():
            v = [status_values(s) for s in list(diags) if s.name.endswith("scene questions")]
            return v and v[-1].get("last_source") == "edge-fallback" and v[-1].get("source_cloud") == "1" \
                and v[-1].get("fallback_connection") == "1" and int(v[-1].get("probe_ok", 0)) >= 1
        wait_for(fallback_reported, "diagnostics reporting the fallback", 5.0)
    finally:
        node._stop_worker()
        ex.shutdown()
        node.destroy_node()
        peer.destroy_node()
        rclpy.try_shutdown(context=ctx)
        spinner.join(timeout=5)

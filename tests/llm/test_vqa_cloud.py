"""The cloud scene-question endpoint for real: `edgefm-cloud serve --task vqa` (MLServer + VqaRuntime +
nginx with a bearer token) on loopback serving a random tiny SmolVLM2, against the local LlmEngine on the
same weights; then scene_query_node routing a question to it, and falling back to the edge once the
server is killed. One server serves the module; the last test kills it."""
from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vqa_support (test files are imported by path)

from vqa_support import QUESTIONS, TOKEN, start_vqa_server, write_router_yaml  # noqa: E402

from edgefm_ros.cloud import CloudDeadlineExceeded, CloudRejected, Encoding  # noqa: E402
from edgefm_ros.cloud.images import decode_image, encode_image  # noqa: E402
from edgefm_ros.cloud.protocol import request_body  # noqa: E402
from edgefm_ros.cloud.vqa_client import VqaClient, VqaClientConfig  # noqa: E402
from edgefm_ros.cloud.vqa_protocol import encode_vqa_request, vqa_messages  # noqa: E402

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
    from edgefm_ros.runtime.generate import LlmEngine, LlmEngineConfig

    return LlmEngine.from_dir(tiny_vlm[0], LlmEngineConfig(capacity=512))


def greedy(engine, question: str, images: list, n: int, system: str | None = SYSTEM):
    from edgefm_ros.runtime.generate import SamplingConfig

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
             "image_0": {**good, "inputs": [good["inputs"][0], {**good["inputs"][1], "data": ["%%%"]}]}}
    for field, req in cases.items():
        status, body = post(server, request_body(req))
        assert status == 400 and field in json.loads(body)["error"], (field, status, body)
    client = VqaClient(server.url, TOKEN)
    with pytest.raises(CloudRejected, match="too many images"):
        client.ask("what?", [img] * 5, 10.0)
    assert client.breaker.state(time.monotonic()) == "closed"  # a refusal is not a server failure
    client.close()


def test_deadline_on_a_slow_server_and_504_when_queued_past_it(server, rng):
    img = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    slow = VqaClient(server.url, TOKEN, config=VqaClientConfig(request_parameters=(("fault_delay_s", 1.5),)))
    t0 = time.monotonic()
    with pytest.raises(CloudDeadlineExceeded):
        slow.ask("what is this?", [img], 0.5, max_new_tokens=2)
    assert time.monotonic() - t0 < 0.5 + SLACK_S
    slow.close()
    # the slow request still holds the engine for ~1 s: a request with a 0.2 s budget waits longer than that
    status, body = post(server, request_body(encode_vqa_request("what?", [img], request_id="late",
                                                                max_new_tokens=2, deadline_s=0.2)))
    assert status == 504 and "deadline" in json.loads(body)["error"]


def test_node_asks_the_cloud_then_falls_back_to_the_edge_when_it_is_killed(server, local, tmp_path, rng,
                                                                            ros_domain_id):
    rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 Jazzy wheels) is not installed")
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.context import Context
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from edgefm_ros.nodes.scene_query_node import SceneQueryNode
    from edgefm_ros.ros import qos
    from edgefm_ros.ros.diagnostics import status_values

    timeout_s, n = 4.0, 6
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    params = [Parameter("camera_topics", value=["/vqa_cam"]), Parameter("max_new_tokens", value=n),
              Parameter("question_topic", value="/vqa_q"), Parameter("answer_topic", value="/vqa_a"),
              Parameter("partial_topic", value="/vqa_p"), Parameter("info_topic", value="/vqa_info"),
              Parameter("system_prompt", value=SYSTEM), Parameter("cloud_url", value=server.url),
              Parameter("cloud_token_file", value=str(server.token_file)),
              Parameter("cloud_timeout_s", value=timeout_s), Parameter("static_bandwidth_mbps", value=100.0),
              Parameter("router_config", value=str(write_router_yaml(tmp_path / "router.yaml"))),
              Parameter("diagnostics_period_s", value=0.2)]
    node = SceneQueryNode(engine=local, context=ctx, parameter_overrides=params)
    peer = rclpy.create_node("vqa_peer", context=ctx)
    answers, partials, infos, diags = [], [], [], []
    peer.create_subscription(String, "/vqa_a", lambda m: answers.append(m.data), qos.RELIABLE)
    peer.create_subscription(String, "/vqa_p", lambda m: partials.append(m.data), qos.LATEST)
    peer.create_subscription(String, "/vqa_info", lambda m: infos.append(json.loads(m.data)), qos.RELIABLE)
    peer.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diags.extend(m.status), qos.DIAGNOSTICS)
    cam = peer.create_publisher(Image, "/vqa_cam", qos.SENSOR)
    ask = peer.create_publisher(String, "/vqa_q", qos.RELIABLE)
    ex = MultiThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(peer)

    def spin():
        try:
            while ctx.ok():
                ex.spin_once(timeout_sec=0.05)
        except ExternalShutdownException:
            pass

    def wait_for(cond, what: str, limit_s: float = 30.0):
        end = time.monotonic() + limit_s
        while not cond() and time.monotonic() < end:
            time.sleep(0.05)
        assert cond(), f"{what} within {limit_s} s"

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    rgb = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    img = Image(height=48, width=64, encoding="rgb8", step=64 * 3, data=rgb.tobytes())
    q1, q2 = (str(q) for q in rng.choice(QUESTIONS, size=2, replace=False))
    try:
        wait_for(lambda: cam.publish(img) or node._latest_frames(), "a camera frame")
        ask.publish(String(data=q1))
        wait_for(lambda: len(infos) == 1 and answers, "the cloud answer")
        info = infos[0]
        assert (info["source"], info["target"], info["candidate"], info["reason"]) == \
            ("cloud", "cloud", "cloud-vqa", "cloud_gain"), info
        assert answers[0] == greedy(local, q1, [rgb], n).text.strip() and not partials  # cloud: final only
        assert node._cloud.stats()["cloud"] == 1

        server.kill()
        ask.publish(String(data=q2))
        wait_for(lambda: len(infos) == 2 and len(answers) == 2, "the fallback answer")
        info = infos[1]
        assert (info["source"], info["target"]) == ("edge-fallback", "cloud") and \
            info["fallback"].startswith("connection"), info
        assert info["cloud_s"] < timeout_s  # gave up on the cloud within its timeout
        assert answers[1] == greedy(local, q2, [rgb], n).text.strip() and partials[-1].strip() == answers[1]

        def fallback_reported():
            v = [status_values(s) for s in list(diags) if s.name.endswith("scene questions")]
            return v and v[-1].get("last_source") == "edge-fallback" and v[-1].get("source_cloud") == "1" \
                and v[-1].get("fallback_connection") == "1"
        wait_for(fallback_reported, "diagnostics reporting the fallback", 5.0)
    finally:
        node._stop_worker()
        ex.shutdown()
        node.destroy_node()
        peer.destroy_node()
        rclpy.try_shutdown(context=ctx)
        spinner.join(timeout=5)

"""scene_query_node over ROS: camera frame + question in, streamed partial answers and the final answer out."""
import time

import numpy as np
import pytest

from skips import require_module


def test_scene_question_answered_with_streaming(tiny_vlm, ros_domain_id, spin_in_background):
    rclpy = require_module("rclpy", "rclpy (ROS 2 Jazzy wheels) is not installed")
    from rclpy.context import Context
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from edgefm_ros.nodes.scene_query_node import SceneAnswerer, SceneQueryNode, make_config
    from edgefm_ros.ros import qos

    engine = tiny_vlm[2]
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    params = [Parameter("camera_topics", value=["/scene_cam"]), Parameter("max_new_tokens", value=10),
              Parameter("question_topic", value="/scene_q"), Parameter("answer_topic", value="/scene_a"),
              Parameter("partial_topic", value="/scene_p")]
    node = SceneQueryNode(engine=engine, context=ctx, parameter_overrides=params)
    peer = rclpy.create_node("scene_peer", context=ctx)
    answers, partials = [], []
    peer.create_subscription(String, "/scene_a", lambda m: answers.append(m.data), qos.RELIABLE)
    peer.create_subscription(String, "/scene_p", lambda m: partials.append(m.data), qos.LATEST)
    cam = peer.create_publisher(Image, "/scene_cam", qos.SENSOR)
    ask = peer.create_publisher(String, "/scene_q", qos.RELIABLE)
    ex = MultiThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(peer)
    spinner = spin_in_background(ex, ctx)
    rgb = np.random.default_rng().integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    try:
        bad = Image(height=48, width=64, encoding="rgb8", step=10, data=bytes(100))  # malformed: ignored
        img = Image(height=48, width=64, encoding="rgb8", step=64 * 3, data=rgb.tobytes())
        deadline = time.monotonic() + 30
        while not node._latest_frames() and time.monotonic() < deadline:
            cam.publish(bad)
            cam.publish(img)
            time.sleep(0.1)
        assert node.bad_messages >= 1 and node._latest_frames()
        ask.publish(String(data="what is on the table?"))
        while not answers and time.monotonic() < deadline:
            time.sleep(0.1)
        assert answers, "no answer within 30 s"
        # the answer is what the same answerer computes directly from the same frame
        direct = SceneAnswerer(engine, make_config(node.values)).answer(
            "what is on the table?", {"/scene_cam": rgb}, lambda t: None)
        assert answers[0] == direct.text and direct.source == "edge" and direct.reason == "no router"
        direct = direct.text
        assert partials and partials[-1].strip() == direct
        assert all(b.startswith(a) for a, b in zip(partials, partials[1:]))  # partials grow
    finally:
        node._stop_worker()
        ex.shutdown()
        node.destroy_node()
        peer.destroy_node()
        rclpy.try_shutdown(context=ctx)
        spinner.join(timeout=5)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_cloud_decision_without_a_reachable_cloud_is_answered_on_the_edge(tiny_vlm, tmp_path, stream):
    """A cloud decision: no client -> edge-fallback; a dead endpoint -> connection, then the breaker opens
    and the next question is not even sent; every answer is the edge's own (cloud_stream on and off)."""
    require_module("rclpy", "rclpy (ROS 2 Jazzy wheels) is not installed")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vqa_support import QUESTIONS, write_router_yaml

    from edgefm_ros.cloud import BreakerConfig
    from edgefm_ros.cloud.client.base import ClientConfig
    from edgefm_ros.cloud.client.vqa import VqaClient
    from edgefm_ros.cloud.server.settings import free_port
    from edgefm_ros.nodes.scene_query_node import PARAMS, SceneAnswerer, make_config
    from edgefm_ros.ros.params import validate
    from edgefm_ros.routing.router import Router

    engine = tiny_vlm[2]
    cfg = make_config(validate(PARAMS, {"max_new_tokens": 5, "cloud_timeout_s": 2.0, "static_bandwidth_mbps": 50.0,
                                        "system_prompt": "Be brief.", "cloud_stream": stream}))
    router = Router.from_yaml(write_router_yaml(tmp_path / "router.yaml"))
    rng = np.random.default_rng()
    frames = {"/cam": rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)}
    q = str(rng.choice(QUESTIONS))
    edge = SceneAnswerer(engine, cfg).answer(q, frames, lambda t: None)
    assert (edge.source, edge.target) == ("edge", "edge")
    a = SceneAnswerer(engine, cfg, router).answer(q, frames, lambda t: None)
    assert (a.source, a.target, a.reason, a.fallback) == ("edge-fallback", "cloud", "cloud_gain", "no cloud_url")
    assert a.text == edge.text and a.cloud_s < 0.1
    dead = VqaClient(f"http://127.0.0.1:{free_port()}", config=ClientConfig.for_task("vqa", breaker=BreakerConfig(failures=1)),
                     link=router.link)
    answerer = SceneAnswerer(engine, cfg, router, dead)
    partials = []
    first = answerer.answer(q, frames, partials.append)
    second = answerer.answer(q, frames, lambda t: None)
    assert first.fallback.startswith("connection") and second.fallback.startswith("breaker_open")
    assert first.source == second.source == "edge-fallback" and first.text == second.text == edge.text
    assert partials and partials[-1].strip() == edge.text  # the fallback answer streams like any edge answer
    assert dead.stats()["sent"] == 1 and first.cloud_s < cfg.cloud_timeout_s
    dead.close()

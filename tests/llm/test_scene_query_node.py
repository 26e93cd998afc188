"""scene_query_node over ROS: camera frame + question in, streamed partial answers and the final answer out (the
answerer on its own, without ROS: test_scene_answerer.py)."""
import time

import numpy as np

from skips import require_module

rclpy = require_module("rclpy", "rclpy (ROS 2 Jazzy wheels) is not installed")  # else the module is skipped
from rclpy.context import Context  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from edgefm_ros.nodes.scene_query_node import SceneQueryNode, make_config  # noqa: E402
from edgefm_ros.placement.vqa import SceneAnswerer  # noqa: E402
from edgefm_ros.ros import qos  # noqa: E402


def test_scene_question_answered_with_streaming(tiny_vlm, ros_domain_id, spin_in_background):
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

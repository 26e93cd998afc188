"""The instruction subscriptions (qos.instruction_subscriptions) take a task from any reliable publisher:
a volatile one (what ``ros2 topic pub`` offers by default) reaching a running node, and a latched one
reaching a node started after it; a latched message that arrives on both subscriptions is delivered once."""
from __future__ import annotations

import time

import numpy as np
import pytest


@pytest.fixture
def ctx(ros, ros_domain_id):
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    c = Context()
    ros.init(context=c, domain_id=ros_domain_id)
    ex = SingleThreadedExecutor(context=c)
    yield c, ex
    ex.shutdown(timeout_sec=1.0)
    c.try_shutdown()


def _spin_until(ex, pred, timeout=5.0, settle=0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        ex.spin_once(timeout_sec=0.05)
    end = time.monotonic() + settle  # duplicates would arrive now
    while time.monotonic() < end:
        ex.spin_once(timeout_sec=0.05)


@pytest.mark.parametrize("publisher,order", [("volatile", "node_first"), ("latched", "node_first"),
                                             ("latched", "node_late")])
def test_instruction_reaches_the_node_once(ctx, publisher, order):
    import rclpy
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from edgefm_ros.ros import qos

    c, ex = ctx
    topic = f"/instruction_{np.random.default_rng().integers(1 << 30)}"
    # the CLI's default publisher QoS (ros2 topic pub): reliable, volatile, depth 1
    cli = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
    pub_node = rclpy.create_node("task_source", context=c)
    sub_node = rclpy.create_node("robot", context=c)
    ex.add_node(pub_node)
    ex.add_node(sub_node)
    got: list[str] = []
    pub = None
    if order == "node_late":
        pub = pub_node.create_publisher(String, topic, qos.LATCHED)
        pub.publish(String(data="stack the blocks"))
        _spin_until(ex, lambda: False, timeout=0.3, settle=0.0)
    qos.instruction_subscriptions(sub_node, String, topic, lambda m: got.append(m.data))
    if pub is None:
        pub = pub_node.create_publisher(String, topic, cli if publisher == "volatile" else qos.LATCHED)
        _spin_until(ex, lambda: pub.get_subscription_count() >= 1)
        pub.publish(String(data="stack the blocks"))
    _spin_until(ex, lambda: bool(got))
    assert got == ["stack the blocks"]
    pub.publish(String(data="stack the blocks"))  # sent again on purpose: delivered again, once
    _spin_until(ex, lambda: len(got) > 1, timeout=3.0)
    assert got == ["stack the blocks"] * 2

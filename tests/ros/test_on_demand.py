"""On-demand subscriptions (ros/on_demand.py) over real DDS: nothing is delivered until take(), then only the
newest message of each topic, once; the helper node keeps its own name under the process's remappings."""
from __future__ import annotations

import time

import numpy as np
import pytest

RNG = np.random.default_rng()


@pytest.fixture
def ctx(ros, ros_domain_id):
    from rclpy.context import Context

    c = Context()
    # the process-wide node-name remap that `ros2 launch` passes to a node's process
    ros.init(args=["--ros-args", "-r", "__node:=vla_node"], context=c, domain_id=ros_domain_id)
    yield c
    c.try_shutdown()


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_take_delivers_the_newest_message_once(ros, ctx):
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import Int64

    from edgefm_ros.ros import qos
    from edgefm_ros.ros.on_demand import OnDemandSubscriptions

    owner = ros.create_node("anything", context=ctx)
    pub_node = ros.create_node("publisher_side", context=ctx, use_global_arguments=False)
    sub = OnDemandSubscriptions(owner, "cameras")
    got: dict[str, list[int]] = {"a": [], "b": []}
    try:
        assert owner.get_name() == "vla_node" and sub.node.get_name() == "vla_node_cameras"
        for k in got:
            sub.subscribe(Int64, f"/on_demand_{k}", lambda m, k=k: got[k].append(m.data), qos.SENSOR_NEWEST)
        pubs = {k: pub_node.create_publisher(Int64, f"/on_demand_{k}", qos.RELIABLE) for k in got}
        assert _wait(lambda: all(p.get_subscription_count() == 1 for p in pubs.values()))
        # the owner's executor spinning does not deliver them
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(owner)
        sent = {k: [int(x) for x in RNG.integers(0, 2**40, int(RNG.integers(5, 20)))] for k in got}
        for k, values in sent.items():
            for v in values:
                pubs[k].publish(Int64(data=v))
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.05)
        assert got == {"a": [], "b": []} and sub.taken == 0
        # take(): the newest of each, once (the ones before it were overwritten unread)
        assert _wait(lambda: (sub.take(), all(got[k] for k in got))[1])
        assert got == {k: [v[-1]] for k, v in sent.items()}, (got, sent)
        assert sub.taken == 2
        sub.take()
        assert got == {k: [v[-1]] for k, v in sent.items()} and sub.taken == 2  # nothing new: nothing delivered
        pubs["b"].publish(Int64(data=7))
        assert _wait(lambda: (sub.take(), len(got["b"]) == 2)[1])
        assert got["b"][-1] == 7 and len(got["a"]) == 1 and sub.taken == 3
        ex.shutdown()
    finally:
        sub.close()
        owner.destroy_node()
        pub_node.destroy_node()


def test_every_take_gets_every_topics_newest(ros, ctx):
    """Three topics, each published once per round: every take gets all three (a private executor spun by
    take() left one of the last two a round behind)."""
    from std_msgs.msg import Int64

    from edgefm_ros.ros import qos
    from edgefm_ros.ros.on_demand import OnDemandSubscriptions

    from rclpy.executors import SingleThreadedExecutor

    owner = ros.create_node("owner", context=ctx, use_global_arguments=False)
    pub_node = ros.create_node("publisher_side", context=ctx, use_global_arguments=False)
    witness = ros.create_node("witness", context=ctx, use_global_arguments=False)
    sub = OnDemandSubscriptions(owner)
    keys = ("a", "b", "c")
    got: dict[str, list[int]] = {k: [] for k in keys}
    seen: dict[str, int] = {}
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(witness)
    try:
        for k in keys:
            sub.subscribe(Int64, f"/rounds_{k}", lambda m, k=k: got[k].append(m.data), qos.SENSOR_NEWEST)
            witness.create_subscription(Int64, f"/rounds_{k}", lambda m, k=k: seen.__setitem__(k, m.data), qos.RELIABLE)
        pubs = {k: pub_node.create_publisher(Int64, f"/rounds_{k}", qos.RELIABLE) for k in keys}
        assert _wait(lambda: all(p.get_subscription_count() == 2 for p in pubs.values()))
        for r in range(6):
            value = int(RNG.integers(0, 2**40))
            for p in pubs.values():
                p.publish(Int64(data=value))
            # delivered to this process (the witness has all three), then one take
            assert _wait(lambda: (ex.spin_once(timeout_sec=0.01), all(seen.get(k) == value for k in keys))[1])
            time.sleep(0.05)
            sub.take()
            assert all(got[k][-1] == value and len(got[k]) == r + 1 for k in keys), (r, value, got)
    finally:
        ex.shutdown()
        sub.close()
        for n in (owner, pub_node, witness):
            n.destroy_node()


def test_a_take_that_fails_is_counted_not_raised(ros, ctx):
    """A subscription whose take raises (here: destroyed under it) is logged and counted; the others are
    still taken."""
    from std_msgs.msg import Int64

    from edgefm_ros.ros import qos
    from edgefm_ros.ros.on_demand import OnDemandSubscriptions

    owner = ros.create_node("owner", context=ctx, use_global_arguments=False)
    pub_node = ros.create_node("publisher_side", context=ctx, use_global_arguments=False)
    sub = OnDemandSubscriptions(owner)
    got: list[int] = []
    try:
        sub.subscribe(Int64, "/broken", lambda m: got.append(-1), qos.SENSOR_NEWEST)
        sub.subscribe(Int64, "/fine", lambda m: got.append(m.data), qos.SENSOR_NEWEST)
        pub = pub_node.create_publisher(Int64, "/fine", qos.RELIABLE)
        assert _wait(lambda: pub.get_subscription_count() == 1)
        sub.node.destroy_subscription(next(s for s in sub.node.subscriptions if s.topic_name == "/broken"))
        value = int(RNG.integers(0, 2**40))
        pub.publish(Int64(data=value))
        assert _wait(lambda: (sub.take(), got)[1])
        assert got == [value] and sub.taken == 1 and sub.failed >= 1
    finally:
        sub.close()
        owner.destroy_node()
        pub_node.destroy_node()


def test_deeper_history_is_refused(ros, ctx):
    from std_msgs.msg import Int64

    from edgefm_ros.ros import qos
    from edgefm_ros.ros.on_demand import OnDemandSubscriptions

    owner = ros.create_node("owner", context=ctx, use_global_arguments=False)
    sub = OnDemandSubscriptions(owner)
    try:
        assert sub.node.get_name() == "owner_on_demand"
        with pytest.raises(ValueError, match="depth must be 1, got 5"):
            sub.subscribe(Int64, "/x", lambda m: None, qos.SENSOR)
    finally:
        sub.close()
        owner.destroy_node()


def test_vla_node_converts_only_the_frames_it_uses(ros, ros_domain_id, tiny_model):
    """vla_node's executor takes no camera frame; a chunk request (or diagnostics) converts the newest of each."""
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn as R
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    from edgefm_ros.nodes.vla_node import VlaNode
    from edgefm_ros.ros import qos
    from edgefm_ros.ros.convert import rgb_to_image_msg

    c = Context()
    ros.init(context=c, domain_id=ros_domain_id)
    ckpt, vlm = tiny_model
    keys = ["observation.images.camera1", "observation.images.camera2"]
    node = VlaNode(context=c, parameter_overrides=[Parameter(k, value=v) for k, v in dict(
        checkpoint=ckpt, vlm_dir=vlm, threads=1, camera_topics=["/od_c1", "/od_c2"], camera_keys=keys,
        camera_transports=["raw", "raw"], state_joint_names=[f"j{i}" for i in range(6)],
        diagnostics_period_s=60.0).items()])  # diagnostics take frames too: not during this test
    peer = ros.create_node("camera_side", context=c)
    ex = SingleThreadedExecutor(context=c)
    try:
        assert node.trigger_configure() == R.SUCCESS
        ex.add_node(node)
        pubs = [peer.create_publisher(Image, t, qos.SENSOR) for t in ("/od_c1", "/od_c2")]
        assert _wait(lambda: all(p.get_subscription_count() == 1 for p in pubs))
        frames = [[RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(15)] for _ in pubs]
        for i in range(15):
            for p, f in zip(pubs, frames):
                p.publish(rgb_to_image_msg(f[i], time.time()))
            ex.spin_once(timeout_sec=0.01)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.05)
        assert node.cache.snapshot(0.0).frames == {} and node._cameras.taken == 0
        assert _wait(lambda: node._diag_values(node._now())["frames_taken"] == 2)
        got = node.cache.snapshot(0.0).frames
        for k, f in zip(keys, frames):
            np.testing.assert_array_equal(got[k].rgb, f[-1])  # the newest frame, the 14 before it never read
    finally:
        ex.shutdown()
        node.trigger_cleanup()
        assert node._cameras is None
        node.destroy_node()
        peer.destroy_node()
        c.try_shutdown()

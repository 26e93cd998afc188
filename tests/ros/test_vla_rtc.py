"""vla_node with real-time chunking: each chunk after the first is computed with the previous chunk's
actions from its observation's time on (raw units, the model's columns) and the estimated delay; an empty
action queue (the robot holds) starts afresh; diagnostics report the delay."""
from __future__ import annotations

import time

import numpy as np
import pytest

RNG = np.random.default_rng()


@pytest.fixture
def ctx(ros, ros_domain_id):
    from rclpy.context import Context

    c = Context()
    ros.init(context=c, domain_id=ros_domain_id)
    yield c
    c.try_shutdown()


def test_vla_node_passes_prefix_and_delay(ctx, tiny_model):
    from rclpy.lifecycle import TransitionCallbackReturn as R
    from rclpy.parameter import Parameter

    from edgefm_ros.control.rtc import continuation
    from edgefm_ros.nodes.vla_node import VlaNode
    from edgefm_ros.ros.convert import msg_to_chunk
    from edgefm_ros.sensors.observation import Frame, SensorCache

    ckpt, vlm = tiny_model
    keys = ["observation.images.camera1", "observation.images.camera2"]
    rate = 10.0
    node = VlaNode(context=ctx, parameter_overrides=[Parameter(k, value=v) for k, v in dict(
        checkpoint=ckpt, vlm_dir=vlm, threads=1, camera_topics=["/c1", "/c2"], camera_keys=keys,
        state_joint_names=[f"j{i}" for i in range(6)], action_rate_hz=rate, rtc_enabled=True,
        rtc_delay_warmup=0, rtc_execution_horizon=5).items()])
    try:
        assert node.trigger_configure() == R.SUCCESS
        assert node.trigger_activate() == R.SUCCESS
        sent, calls = [], []
        node._chunk_pub.publish = sent.append
        predict = node.engine.predict

        def recording(obs, **kw):
            calls.append((obs.stamp, kw.get("rtc_prefix"), kw.get("rtc_delay")))
            return predict(obs, **kw)
        node.engine.predict = recording

        def snapshot():
            now = node._now()
            cache = SensorCache(tuple(keys))
            for k in keys:
                cache.put_frame(k, Frame(now - 0.01, rgb=RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8)))
            cache.put_state(RNG.normal(size=6).astype(np.float32), now - 0.01)
            cache.put_task("pick", now)
            return cache.snapshot(now)

        assert node._compute(snapshot(), None) == 1
        assert calls[0][1] is None  # nothing to continue yet
        first = msg_to_chunk(sent[0])
        latency = node._rtc.delay.latency_s()
        assert 0 < latency < 5
        time.sleep(0.25)  # 2-3 control ticks at 10 Hz
        assert node._compute(snapshot(), None) == 2
        stamp2, prefix, delay = calls[1]
        want = continuation(first.actions, first.stamp, first.dt, stamp2, 1.0 / rate, node.engine.spec.chunk_size)
        assert want is not None and 0 < want.shape[0] < node.engine.spec.chunk_size
        # stamps are epoch seconds (float64 ulp ~2e-7 s) and the message's are rounded to ns: the interpolated
        # rows may differ by that time error times their slope; a prefix a tick off differs by far more
        np.testing.assert_allclose(prefix, want, rtol=1e-6, atol=1e-4)
        assert delay == min(int(np.ceil(latency * rate - 1e-9)), node.engine.spec.chunk_size)
        values = node._diag_values(node._now())
        assert values["rtc_chunks"] == 1 and values["rtc_delay_ticks"] == delay
        assert values["rtc_prefix_rows"] == want.shape[0]
        assert values["rtc_latency_estimate_ms"] == pytest.approx(node._rtc.delay.latency_s() * 1e3)
        assert values["rtc_delay_estimate_ticks"] == node._rtc.delay.ticks() >= 1
        # the queue ran empty (the robot holds): no prefix
        assert node._compute(snapshot(), None, True) == 3
        assert calls[2][1] is None
    finally:
        node.trigger_deactivate()
        node.trigger_cleanup()
        node.destroy_node()


def test_rtc_parameters_validated(ctx, tiny_model):
    from rclpy.lifecycle import TransitionCallbackReturn as R
    from rclpy.parameter import Parameter

    from edgefm_ros.nodes.vla_node import VlaNode

    ckpt, vlm = tiny_model
    keys = ["observation.images.camera1", "observation.images.camera2"]
    # the paper's guidance needs a differentiable expert: exact mode's kernels refuse it at configure,
    # reference mode takes it
    for mode, want in (("exact", R.FAILURE), ("reference", R.SUCCESS)):
        node = VlaNode(context=ctx, parameter_overrides=[Parameter(k, value=v) for k, v in dict(
            checkpoint=ckpt, vlm_dir=vlm, threads=1, camera_topics=["/c1", "/c2"], camera_keys=keys, mode=mode,
            state_joint_names=[f"j{i}" for i in range(6)], rtc_enabled=True, rtc_guidance="vjp").items()])
        try:
            assert node.trigger_configure() == want, mode
        finally:
            node.destroy_node()


def test_sim_graph_params_pair_rtc_merge_with_rtc_guidance(ros):
    """`edgefm-sim eval --exec ros --aggregate rtc`: action_node's rtc merge comes with vla_node's guidance."""
    from edgefm_ros.tools.sim_ros import graph_params

    on = graph_params("ckpt", ["reach:1000"], aggregate="rtc")
    assert on["action_node"]["aggregate"] == "rtc" and on["vla_node"]["rtc_enabled"] is True
    off = graph_params("ckpt", ["reach:1000"], aggregate="latest_only")
    assert off["action_node"]["aggregate"] == "latest_only" and not off["vla_node"].get("rtc_enabled", False)
    # `--mode fast`: vla_node's engine mode; the config's (exact) otherwise; an unknown one named
    assert graph_params("ckpt", ["reach:1000"], engine_mode="fast")["vla_node"]["mode"] == "fast"
    assert off["vla_node"].get("mode", "exact") == "exact"
    with pytest.raises(ValueError, match="'turbo'"):
        graph_params("ckpt", ["reach:1000"], engine_mode="turbo")

"""The nodes in-process: lifecycle transitions (configure, activate, deactivate = hold, cleanup) and
parameter validation."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

RNG = np.random.default_rng()
NAMES = ("a", "b", "c")


@pytest.fixture
def ctx(ros, ros_domain_id):
    from rclpy.context import Context

    c = Context()
    ros.init(context=c, domain_id=ros_domain_id)
    yield c
    c.try_shutdown()


def _params(**kw):
    from rclpy.parameter import Parameter

    return [Parameter(k, value=v) for k, v in kw.items()]


def _state(node) -> str:
    """The node's lifecycle state label (rclpy has no public in-process getter; the get_state service reads
    the same state machine)."""
    return node._state_machine.current_state[1]


def _entities(node) -> tuple[int, int]:
    """(publishers, subscriptions) the node holds now."""
    return len(list(node.publishers)), len(list(node.subscriptions))


def _wait(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.02)
    return pred()


def test_action_node_lifecycle_holds_on_deactivate(ctx, spin_in_background):
    from rclpy.lifecycle import TransitionCallbackReturn as R
    from sensor_msgs.msg import JointState

    from edgefm_ros.msg import ActionChunk
    from edgefm_ros.nodes.action_node import ActionNode
    from edgefm_ros.ros import qos
    from edgefm_ros.ros.convert import to_sec, to_stamp
    from edgefm_ros.ros.diagnostics import DiagnosticArray

    node = ActionNode(context=ctx, parameter_overrides=_params(
        joint_names=list(NAMES), command_type="joint_state", command_topic="/cmd", diagnostics_period_s=0.1,
        aggregate="latest_only"))
    probe = __import__("rclpy").create_node("probe", context=ctx)
    cmds, diags = [], []
    probe.create_subscription(JointState, "/cmd", cmds.append, qos.RELIABLE)
    probe.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diags.append(m.status[0]), qos.DIAGNOSTICS)
    chunk_pub = probe.create_publisher(ActionChunk, "edgefm/action_chunk", qos.RELIABLE)
    from rclpy.executors import SingleThreadedExecutor

    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(probe)
    spin_in_background(ex, ctx)
    try:
        assert node.trigger_configure() == R.SUCCESS
        assert node.trigger_activate() == R.SUCCESS
        assert _wait(lambda: chunk_pub.get_subscription_count() > 0)
        a = RNG.normal(size=(30, 3)).astype(np.float32)
        m = ActionChunk(joint_names=list(NAMES), chunk_size=30, action_dim=3, dt=0.02, actions=a.reshape(-1).tolist(),
                        source="edge", sequence=1)
        m.header.stamp = to_stamp(time.time())
        chunk_pub.publish(m)
        assert _wait(lambda: len(cmds) >= 10)
        assert node.trigger_deactivate() == R.SUCCESS
        n_at_deactivate = len(cmds)
        time.sleep(0.4)
        hold = cmds[-1]
        assert len(cmds) <= n_at_deactivate + 1, "commands published while inactive"
        assert list(hold.position) == list(cmds[-2].position)  # the last commanded position, repeated
        assert list(hold.name) == list(NAMES)
        assert all(to_sec(c.header.stamp) > 0 for c in cmds)
        assert _wait(lambda: any(d.message.startswith("holding") and "inactive" in d.message for d in diags[-3:]))
        assert node.trigger_cleanup() == R.SUCCESS
    finally:
        node.stop_for_exit()


def _can_use_fifo(priority: int) -> bool:
    """Whether this process may put a thread on SCHED_FIFO (root, CAP_SYS_NICE or RLIMIT_RTPRIO), tried on a
    throwaway thread."""
    ok = []

    def body():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            ok.append(True)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return ok[0]


def test_action_node_puts_the_executor_thread_scheduling_back(ctx):
    """activate runs on one thread (the executor's) and puts it on SCHED_FIFO (realtime_priority - 1);
    deactivate, here from another thread, puts back exactly what that thread had (SCHED_BATCH here, not
    the default policy). Without the right to use SCHED_FIFO nothing is applied and nothing changes."""
    from rclpy.lifecycle import TransitionCallbackReturn as R

    from edgefm_ros.nodes.action_node import ActionNode
    from edgefm_ros.threads.realtime import Scheduling, scheduling_of

    node = ActionNode(context=ctx, parameter_overrides=_params(
        joint_names=list(NAMES), command_type="joint_state", command_topic="/cmd_rt", realtime_priority=3))
    seen: dict = {}
    activated, finish = threading.Event(), threading.Event()

    def executor_thread():
        tid = threading.get_native_id()
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        seen["before"] = scheduling_of(tid)
        seen["configure"], seen["activate"] = node.trigger_configure(), node.trigger_activate()
        seen["during"] = scheduling_of(tid)
        activated.set()
        finish.wait(10)
        seen["after"] = scheduling_of(tid)

    fifo = _can_use_fifo(2)
    t = threading.Thread(target=executor_thread)
    t.start()
    try:
        assert activated.wait(10)
        assert seen["configure"] == R.SUCCESS and seen["activate"] == R.SUCCESS
        before = seen["before"]
        assert before.policy == os.SCHED_BATCH
        if fifo:
            assert seen["during"] == Scheduling(before.tid, os.SCHED_FIFO, 2)
            assert node.executor_rt.previous == before
        else:
            assert seen["during"] == before and node.executor_rt.previous is None
        assert node.trigger_deactivate() == R.SUCCESS  # from this thread, not the one it changed
        assert scheduling_of(before.tid) == before
        assert node.executor_rt.previous is None
    finally:
        finish.set()
        t.join(5)
        node.stop_for_exit()
    assert seen["after"] == seen["before"]  # as the thread itself sees it
    assert node.trigger_cleanup() == R.SUCCESS and node.core is None


def test_action_node_keeps_a_control_thread_that_does_not_stop(ctx, capfd):
    """A control thread that does not end within stop_timeout_s (held here on the queue's lock) is not
    dropped: deactivate errs, the node ends finalized with the thread still tracked, and the thread ends once
    it can see the stop."""
    from rclpy.lifecycle import TransitionCallbackReturn as R

    from edgefm_ros.nodes.action_node import ActionNode

    node = ActionNode(context=ctx, parameter_overrides=_params(
        joint_names=list(NAMES), command_type="joint_state", command_topic="/cmd_stuck"))
    node.stop_timeout_s = 0.5
    assert node.trigger_configure() == R.SUCCESS and node.trigger_activate() == R.SUCCESS
    assert node.control_thread_running
    core = node.core
    with core.lock:  # the control thread blocks in its next tick (one period is 20 ms), past its stop check
        time.sleep(0.2)
        t0 = time.monotonic()
        assert node.trigger_deactivate() == R.ERROR
        took = time.monotonic() - t0
        assert node.control_thread_running, "the control thread was dropped while still running"
        assert _state(node) == "finalized"
        assert node.core is core  # nothing it uses was released under it
    assert took >= 2 * node.stop_timeout_s  # it gave up only after its bound: deactivate's wait, then error's
    assert _wait(lambda: not node.control_thread_running, 2.0)
    err = capfd.readouterr().err
    assert "the control thread did not stop within 0.5 s" in err
    assert "finalized" in err


@pytest.mark.parametrize("name,value,match", [("command_type", "bogus", "command_type"),
                                              ("aggregate", "median", "aggregate"),
                                              ("control_rate_hz", 5000.0, "control_rate_hz")])
def test_action_node_rejects_invalid_parameters(ctx, name, value, match):
    from rclpy.exceptions import ParameterException

    from edgefm_ros.nodes.action_node import ActionNode

    with pytest.raises((ValueError, ParameterException), match=match):
        ActionNode(context=ctx, parameter_overrides=_params(**{name: value}))


def test_vla_node_configure_fails_cleanly_then_works_on_the_same_node(ctx, tiny_model, tmp_path, capfd):
    """One node: configure fails (no checkpoint yet), fails again at its very last step (the shadow log
    cannot be opened) after the model, the cloud client, its link publisher, the chunk publisher and the
    subscriptions were made, then works once the cause is gone; every failure and cleanup leaves the node
    holding what it held before configure."""
    from rclpy.lifecycle import TransitionCallbackReturn as R

    from edgefm_ros.nodes.vla_node import VlaNode

    ckpt, vlm = tiny_model
    common = dict(camera_topics=["/c1", "/c2"],
                  camera_keys=["observation.images.camera1", "observation.images.camera2"],
                  state_joint_names=[f"j{i}" for i in range(6)], vlm_dir=vlm, threads=1)
    ckpt_link, blocker = tmp_path / "ckpt", tmp_path / "logs"  # the checkpoint appears later (mount, copy)
    node = VlaNode(context=ctx, parameter_overrides=_params(
        checkpoint=str(ckpt_link), cloud_url="http://127.0.0.1:9", shadow_fraction=0.5,
        shadow_log=str(blocker / "shadow.jsonl"), **common))
    base = _entities(node)  # /diagnostics, parameter events, rosout
    assert node.trigger_configure() == R.FAILURE
    assert node.engine is None and node.remote is None and _entities(node) == base
    assert _state(node) == "unconfigured"

    ckpt_link.symlink_to(ckpt)
    blocker.write_text("")  # a file where the shadow log's directory should be
    capfd.readouterr()
    assert node.trigger_configure() == R.FAILURE
    assert "configure failed: shadow mode" in capfd.readouterr().err  # failed last, after acquiring the rest
    assert node.engine is None and node.remote is None and _entities(node) == base
    assert _state(node) == "unconfigured"

    blocker.unlink()
    for cycle in range(2):  # configure after cleanup works as well
        assert node.trigger_configure() == R.SUCCESS and node.engine.spec.chunk_size == 8
        pubs, subs = _entities(node)
        assert pubs == base[0] + 2 and subs >= base[1] + 5  # chunks and link samples; cameras, joints, ...
        assert node.remote is not None
        assert node.trigger_activate() == R.SUCCESS and node._worker.is_alive()
        assert node.trigger_deactivate() == R.SUCCESS and node._worker is None
        assert node.trigger_cleanup() == R.SUCCESS
        assert node.engine is None and node.remote is None and _entities(node) == base, cycle
    assert (blocker / "shadow.jsonl").is_file()  # the log was opened by the configures that worked

    wrong_dim = VlaNode(context=ctx, parameter_overrides=_params(
        checkpoint=ckpt, **{**common, "state_joint_names": ["j0", "j1"]}))
    before = _entities(wrong_dim)
    assert wrong_dim.trigger_configure() == R.FAILURE
    assert wrong_dim.engine is None and _entities(wrong_dim) == before


class _Remote:
    """A RemotePolicy (edgefm_ros.cloud) for the seam: answers with a chunk, raises, or answers late."""

    def __init__(self, mode, engine):
        self.mode, self.engine, self.calls = mode, engine, 0

    def predict(self, obs, deadline_s, encoding=None, *, noise=None, seq=0, dt=1 / 30, request_id=None):
        self.calls += 1
        if self.mode == "raise":
            raise ConnectionError("link down")
        if self.mode == "late":
            time.sleep(deadline_s + 0.05)
        c = self.engine.predict(obs)
        return c.__class__(**{**c.__dict__, "source": "cloud", "actions": c.actions + 1000.0})

    def stats(self):
        return {"calls": self.calls}

    def close(self):
        pass


@pytest.mark.parametrize("route,mode,want", [(None, "ok", "edge"), ("edge", "ok", "edge"), ("cloud", "ok", "cloud"),
                                             ("cloud", "raise", "edge-fallback"), ("cloud", "late", "edge-fallback"),
                                             ("moon", "ok", "edge")])
def test_vla_node_follows_the_route_and_falls_back_to_the_edge(ctx, tiny_model, route, mode, want):
    from rclpy.lifecycle import TransitionCallbackReturn as R

    from edgefm_ros.nodes.vla_node import VlaNode
    from edgefm_ros.ros.convert import msg_to_chunk
    from edgefm_ros.sensors.observation import Frame, SensorCache
    from edgefm_ros.types import RouteDecision

    ckpt, vlm = tiny_model
    keys = ["observation.images.camera1", "observation.images.camera2"]
    node = VlaNode(context=ctx, parameter_overrides=_params(
        checkpoint=ckpt, vlm_dir=vlm, threads=1, camera_topics=["/c1", "/c2"], camera_keys=keys,
        state_joint_names=[f"j{i}" for i in range(6)], cloud_deadline_s=0.2))
    try:
        assert node.trigger_configure() == R.SUCCESS
        node.remote = _Remote(mode, node.engine)
        assert node.trigger_activate() == R.SUCCESS
        sent = []
        node._chunk_pub.publish = sent.append
        now = node._now()
        cache = SensorCache(tuple(keys))
        for k in keys:
            cache.put_frame(k, Frame(now - 0.01, rgb=RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8)))
        cache.put_state(RNG.normal(size=6).astype(np.float32), now - 0.005)
        cache.put_task("pick", now)
        if route == "moon":  # a malformed decision on the topic: counted and named, the edge serves
            from edgefm_ros.msg import RouteDecision as RouteDecisionMsg

            node._on_route(RouteDecisionMsg(target="moon", candidate="moon-x", reason="test"))
            assert node._route is None and node.bad_messages["route"] == 1
            assert "moon" in node.diagnostics()[1] + str(node.diagnostics()[2]), node.diagnostics()
            decision = node._route
        else:
            decision = None if route is None else (RouteDecision(route, f"{route}-x", "test"), now)
        seq = node._compute(cache.snapshot(now), decision)
        assert seq == 1 and len(sent) == 1
        chunk = msg_to_chunk(sent[0])
        assert chunk.source == want and chunk.joint_names == tuple(f"j{i}" for i in range(6))
        assert (chunk.actions.min() > 500) == (want == "cloud")  # the cloud's actions, or the edge's
        assert node.remote.calls == (1 if route == "cloud" else 0)
        assert node.requests.routes[want] == 1
    finally:
        node.trigger_deactivate()


def _physics_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "physics" and t.is_alive()]


def test_sim_node_releases_everything_and_puts_the_executor_scheduling_back(ctx):
    """sim_node: a configure that fails after the simulator thread was built and some publishers were made
    (an invalid topic name) leaves no thread and no publisher behind; one that works, configured twice on
    the same node, puts the executor thread's scheduling back at deactivate and ends its thread at cleanup."""
    from skips import require_module

    require_module("metaworld", "the simulator (metaworld, mujoco) is not installed")
    from rclpy.lifecycle import TransitionCallbackReturn as R

    from edgefm_ros.nodes.sim_node import SimNode
    from edgefm_ros.threads.realtime import Scheduling, scheduling_of

    one = dict(episodes=["button-press-topdown:1000"], joint_states_topic="/sim_lc/joint_states",
               instruction_topic="/sim_lc/instruction", command_topic="/sim_lc/command")
    bad = SimNode(context=ctx, parameter_overrides=_params(camera_topics=["/sim_lc/scene", "not a topic"], **one))
    base = _entities(bad)
    assert bad.trigger_configure() == R.FAILURE
    assert _entities(bad) == base and bad.env is None and bad.live is None and not _physics_threads()

    node = SimNode(context=ctx, parameter_overrides=_params(
        camera_topics=["/sim_lc/scene", "/sim_lc/wrist"], realtime_priority=3, **one))
    base = _entities(node)
    fifo = _can_use_fifo(2)
    tid = threading.get_native_id()
    before = scheduling_of(tid)
    try:
        for cycle in range(2):
            assert node.trigger_configure() == R.SUCCESS, cycle
            assert len(_physics_threads()) == 1 and _entities(node)[0] > base[0]
            assert node.trigger_activate() == R.SUCCESS
            want = Scheduling(tid, os.SCHED_FIFO, 2) if fifo else before
            assert scheduling_of(tid) == want
            assert node.trigger_deactivate() == R.SUCCESS
            assert scheduling_of(tid) == before and node.executor_rt.previous is None
            assert node.trigger_cleanup() == R.SUCCESS
            assert _entities(node) == base and node.env is None and not _physics_threads(), cycle
    finally:
        node.stop_for_exit()
        os.sched_setscheduler(tid, before.policy, os.sched_param(before.priority))

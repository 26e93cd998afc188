"""The lifecycle base every node shares (edgefm_ros/ros/lifecycle.py), on a real rclpy node of its own: the
transitions release every publisher, subscription and timer configure made (cleanup, error processing, a
failed configure) and the node's other resources; a thread that does not stop keeps them; autostart
configures and activates a node built with its own state; runtime parameters are checked and applied, a
bad one refused with a reason naming it; diagnostics carry the lifecycle state."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from edgefm_ros.params.spec import NodeConfig, param

RNG = np.random.default_rng()


class ProbeConfig(NodeConfig, node="lifecycle_probe"):
    topic: str = param("probe/out", "Output.")
    fail_configure: bool = param(False, "Raise at the end of configure (after making everything).")
    fail_activate: bool = param(False, "Raise in activate (an erring transition: error processing).")
    gain: float = param(0.5, "Changes at runtime.", range=(0.0, 1.0), read_only=False)
    diagnostics_period_s: float = param(0.05, "Period of /diagnostics.", range=(0.05, 60.0))


@pytest.fixture
def ctx(ros, ros_domain_id):
    from rclpy.context import Context

    c = Context()
    ros.init(context=c, domain_id=ros_domain_id)
    yield c
    c.try_shutdown()


def _probe_class():
    from std_msgs.msg import String

    from edgefm_ros.ros import diagnostics as diag
    from edgefm_ros.ros import qos
    from edgefm_ros.ros.lifecycle import ManagedNode

    class Probe(ManagedNode):
        CONFIG = ProbeConfig
        STATUS = "probe"

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.made_at_configure = None
            self.released = 0
            self.stuck = False  # stop() reports a thread that would not end
            self.applied: list[dict] = []

        def configure(self, cfg):
            self.made_at_configure = self.released  # the node's own state exists before autostart configures
            self.create_lifecycle_publisher(String, cfg.topic, qos.RELIABLE)
            self.create_lifecycle_publisher(String, cfg.topic + "_b", qos.LATEST)
            self.create_publisher(String, "probe/plain", qos.RELIABLE)
            self.create_subscription(String, "probe/in", lambda m: None, qos.RELIABLE)
            qos.instruction_subscriptions(self, String, "/probe_instruction", lambda m: None)
            self.create_timer(0.5, lambda: None)
            if cfg.fail_configure:
                raise ValueError("configure: fails last, after everything was made")

        def on_activate(self, state):
            if self.cfg.fail_activate:
                raise RuntimeError("activate raised")
            return super().on_activate(state)

        def stop(self) -> bool:
            return not self.stuck

        def release(self):
            self.released += 1

        def apply_parameters(self, changed):
            if changed.get("gain") == 0.0:
                raise ValueError("gain 0.0 would stop the probe")
            self.applied.append(changed)

        def diagnostics(self):
            return diag.OK, "probing", {"gain": self.cfg.gain}

    return Probe


def _inventory(node) -> tuple[set, set, set]:
    """What rclpy says the node holds: its publishers, subscriptions and timers."""
    return set(map(id, node.publishers)), set(map(id, node.subscriptions)), set(map(id, node.timers))


def _params(**kw):
    from rclpy.parameter import Parameter

    return [Parameter(k, value=v) for k, v in kw.items()]


def test_cleanup_releases_everything_configure_made(ctx):
    from rclpy.lifecycle import TransitionCallbackReturn as R

    node = _probe_class()(context=ctx)
    try:
        base = _inventory(node)  # /diagnostics, its timer, rclpy's own
        for cycle in range(2):
            assert node.trigger_configure() == R.SUCCESS
            pubs, subs, timers = _inventory(node)
            assert (len(pubs - base[0]), len(subs - base[1]), len(timers - base[2])) == (3, 3, 1), cycle
            assert node.trigger_activate() == R.SUCCESS and node.lifecycle_state == "active"
            assert node.trigger_deactivate() == R.SUCCESS
            assert node.trigger_cleanup() == R.SUCCESS
            assert _inventory(node) == base and node.cfg is None and node.released == cycle + 1
            assert node.lifecycle_state == "unconfigured"
    finally:
        node.destroy_node()


def test_a_failed_configure_and_error_processing_release_everything(ctx):
    from rclpy.lifecycle import TransitionCallbackReturn as R

    Probe = _probe_class()
    failing = Probe(context=ctx, parameter_overrides=_params(fail_configure=True))
    erring = Probe(context=ctx, parameter_overrides=_params(fail_activate=True))
    try:
        base = _inventory(failing)
        assert failing.trigger_configure() == R.FAILURE
        assert _inventory(failing) == base and failing.released == 1 and failing.lifecycle_state == "unconfigured"

        base = _inventory(erring)
        assert erring.trigger_configure() == R.SUCCESS and _inventory(erring) != base
        assert erring.trigger_activate() == R.ERROR  # the callback raised: error processing releases
        assert _inventory(erring) == base and erring.released == 1 and erring.cfg is None
        assert erring.lifecycle_state == "unconfigured"
        assert erring.trigger_configure() == R.SUCCESS  # and the node can be configured again
    finally:
        failing.destroy_node()
        erring.destroy_node()


def test_a_thread_that_does_not_stop_keeps_what_it_uses(ctx):
    """While the node's thread still runs, cleanup fails (inactive, holding everything) and error processing
    ends finalized, holding everything."""
    from rclpy.lifecycle import TransitionCallbackReturn as R

    node = _probe_class()(context=ctx, parameter_overrides=_params(fail_activate=True))
    try:
        assert node.trigger_configure() == R.SUCCESS
        held = _inventory(node)
        node.stuck = True
        assert node.trigger_cleanup() == R.FAILURE and node.lifecycle_state == "inactive"
        assert _inventory(node) == held and node.released == 0
        assert node.trigger_activate() == R.ERROR
        assert node.lifecycle_state == "finalized" and _inventory(node) == held and node.cfg is not None
    finally:
        node.destroy_node()


def test_autostart_configures_and_activates_a_node_built_with_its_own_state(ctx):
    node = _probe_class()(context=ctx, parameter_overrides=_params(autostart=True))
    try:
        assert node.lifecycle_state == "active" and node.made_at_configure == 0
    finally:
        node.destroy_node()


def test_runtime_parameters_are_checked_applied_and_refused_with_a_reason(ctx):
    from rclpy.lifecycle import TransitionCallbackReturn as R

    node = _probe_class()(context=ctx)
    try:
        bad = float(RNG.uniform(1.01, 50))
        r = node.set_parameters(_params(gain=bad))[0]
        assert not r.successful and "'gain'" in r.reason and repr(bad) in r.reason, r.reason
        assert node.trigger_configure() == R.SUCCESS
        good = float(RNG.uniform(0.01, 1.0))
        assert node.set_parameters(_params(gain=good))[0].successful
        assert node.cfg.gain == good and node.values["gain"] == good and node.applied[-1] == {"gain": good}
        r = node.set_parameters(_params(gain=0.0))[0]  # the node's own check refuses it
        assert not r.successful and r.reason == "gain 0.0 would stop the probe"
        assert node.cfg.gain == good and node.get_parameter("gain").value == good
        r = node.set_parameters(_params(topic="other"))[0]
        assert not r.successful and "read-only" in r.reason
    finally:
        node.destroy_node()


def test_diagnostics_carry_the_lifecycle_state(ctx, spin_in_background):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn as R

    from edgefm_ros.ros import qos
    from edgefm_ros.ros.diagnostics import DiagnosticArray, status_values

    node = _probe_class()(context=ctx)
    peer = rclpy.create_node("probe_peer", context=ctx)
    seen: list[tuple[str, dict]] = []
    lock = threading.Lock()

    def on(msg):
        with lock:
            seen.extend((s.message, status_values(s)) for s in msg.status if s.name == "lifecycle_probe: probe")
    peer.create_subscription(DiagnosticArray, "/diagnostics", on, qos.DIAGNOSTICS)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(peer)
    stop = threading.Event()
    spinner = spin_in_background(ex, ctx, stop)

    def last(pred, timeout=10.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with lock:
                hit = next((s for s in reversed(seen) if pred(s)), None)
            if hit is not None:
                return hit
            time.sleep(0.05)
        return None

    try:
        assert last(lambda s: s[1].get("state") == "unconfigured") == ("unconfigured", {"state": "unconfigured"})
        assert node.trigger_configure() == R.SUCCESS and node.trigger_activate() == R.SUCCESS
        message, values = last(lambda s: s[1].get("state") == "active")
        assert message == "probing" and values == {"state": "active", "gain": "0.5"}
    finally:
        stop.set()
        spinner.join(timeout=5)
        ex.shutdown()
        node.destroy_node()
        peer.destroy_node()

"""placement/vla.py without ROS: edge, cloud, fallback to the edge (late, raising, malformed, no client),
shadow runs of the other placement with the same noise and RTC request, and RTC's prefix and delay given
identically to the edge engine and the remote policy. A real tiny Engine (random weights); the remote side
is a test double of the RemotePolicy protocol (the real server path: tests/ros/test_cloud_graph.py)."""
from __future__ import annotations

import dataclasses
import time
from collections import Counter

import numpy as np
import pytest

from edgefm_ros.cloud.client.policy import RemotePolicy
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.control.delay import DelayConfig, DelayEstimator
from edgefm_ros.control.rtc import ChunkContinuation, continuation
from edgefm_ros.placement.runs import PlacementRun
from edgefm_ros.placement.vla import Placement, PlacementConfig, Rejected
from edgefm_ros.runtime.engine import Engine
from edgefm_ros.training.random_checkpoint import make_checkpoint
from edgefm_ros.types import Observation, RouteDecision

DT = 0.1
KEYS = ("observation.images.camera1", "observation.images.camera2")
RNG = np.random.default_rng()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = make_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", "tiny", cameras=2, raw_hw=(32, 32), dim=4)
    return Engine.from_checkpoint(out, threads=1)


class FakeRemote:
    """A RemotePolicy: the same engine (so equal noise and RTC give equal actions) plus ``offset``;
    ``mode``: ok, raise, late (answers after the deadline), wide (one action column too many) or nan."""

    def __init__(self, engine, mode="ok", offset=0.0):
        self.engine, self.mode, self.offset = engine, mode, offset
        self.calls: list[dict] = []

    def predict(self, obs, deadline_s, encoding=Encoding(), *, noise=None, seq=0, dt=1 / 30, request_id=None,
                rtc_prefix=None, rtc_delay=0):
        self.calls.append(dict(deadline_s=deadline_s, encoding=encoding, noise=noise, seq=seq, dt=dt,
                               rtc_prefix=rtc_prefix, rtc_delay=rtc_delay))
        if self.mode == "raise":
            raise ConnectionError("link down")
        if self.mode == "late":
            time.sleep(deadline_s + 0.05)
        c = self.engine.predict(obs, noise=noise, dt=dt, seq=seq, rtc_prefix=rtc_prefix, rtc_delay=rtc_delay)
        actions = c.actions + self.offset
        if self.mode == "wide":
            actions = np.concatenate([actions, actions[:, :1]], axis=1)
        if self.mode == "nan":
            actions = actions.copy()
            actions[3, 1] = np.nan
        return dataclasses.replace(c, actions=actions, source="cloud")

    def stats(self):
        return {"calls": len(self.calls)}

    def close(self):
        pass


class RecordingEngine:
    """The engine with its predict calls' keywords recorded."""

    def __init__(self, engine):
        self.inner, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def predict(self, obs, **kw):
        self.calls.append(kw)
        return self.inner.predict(obs, **kw)


class FakeShadow:
    """A ShadowSink that shadows every routed request and keeps what it is given."""

    def __init__(self):
        self.rng, self.records, self.skipped = np.random.default_rng(), [], Counter()

    def wants(self, decision):
        return decision is not None

    def noise(self, shape):
        self.last_noise = self.rng.standard_normal(shape).astype(np.float32)
        return self.last_noise

    def record(self, request_id, decision, served, other):
        self.records.append((request_id, decision, served, other))
        return True

    def stats(self):
        return {"shadow_logged": len(self.records)}

    def close(self):
        self.closed = True


def observation(engine, stamp=0.0, state_dim=None):
    spec = engine.spec
    images = {k: RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8) for k in KEYS}
    state = RNG.normal(size=state_dim or spec.state_dim).astype(np.float32)
    return Observation(images, state, "open the drawer", stamp=stamp)


def decision(target, **params):
    return RouteDecision(target, f"{target}-x", "test", params=params)


def placer(engine, deadline=0.5, **kw):
    logs = []
    p = Placement(engine, PlacementConfig(DT, deadline, "r"), log=lambda kind, msg: logs.append((kind, msg)), **kw)
    return p, logs


def test_fake_remote_is_a_remote_policy(engine):
    assert isinstance(FakeRemote(engine), RemotePolicy)


@pytest.mark.parametrize("route", [None, "edge"])
def test_edge_only(engine, route):
    remote = FakeRemote(engine, offset=1000.0)
    p, logs = placer(engine)
    out = p.compute(observation(engine), None if route is None else decision(route), 1, remote)
    assert out.source == "edge" and out.served.placement == "edge" and not remote.calls and not logs
    assert out.chunk.actions.shape == (engine.spec.chunk_size, engine.spec.action_dim)
    assert np.abs(out.chunk.actions).max() < 500 and out.chunk.seq == 1 and out.chunk.dt == DT
    assert (p.lat["prefill"].count, p.lat["compute"].count, p.lat["cloud_call"].count) == (1, 1, 0)


def test_cloud_success(engine):
    remote = FakeRemote(engine, offset=1000.0)
    p, logs = placer(engine, deadline=2.0)
    out = p.compute(observation(engine), decision("cloud", jpeg_quality=80, resolution=24), 7, remote)
    assert out.source == "cloud" and out.served.placement == "cloud" and not logs
    assert out.chunk.actions.min() > 500  # the remote's actions
    np.testing.assert_array_equal(out.served.actions, out.chunk.actions)
    (call,) = remote.calls
    assert call["encoding"] == Encoding("jpeg", 80, 24) and call["deadline_s"] == 2.0
    assert (call["seq"], call["dt"], call["noise"], call["rtc_prefix"]) == (7, DT, None, None)
    # the cloud's time counts as the served chunk's compute; the edge did not run
    assert (p.lat["prefill"].count, p.lat["compute"].count, p.lat["cloud_call"].count) == (0, 1, 1)


@pytest.mark.parametrize("mode,why", [("late", "deadline"), ("raise", "link down"), ("wide", "action_dim"),
                                      ("nan", "non-finite"),
                                      (None, "no cloud client")])
def test_cloud_failure_falls_back_to_the_edge(engine, mode, why):
    remote = None if mode is None else FakeRemote(engine, mode, offset=1000.0)
    p, logs = placer(engine, deadline=0.2)
    out = p.compute(observation(engine), decision("cloud"), 3, remote)
    assert out.source == "edge-fallback" and out.chunk.source == "edge-fallback"
    assert out.served.placement == "edge" and np.abs(out.chunk.actions).max() < 500  # the engine's chunk
    assert len(logs) == 1 and logs[0][0] == "cloud_failed" and why in logs[0][1]
    assert (p.lat["prefill"].count, p.lat["cloud_call"].count) == (1, 0)


def test_stopping_skips_the_fallback_and_rejected_observations(engine):
    rec = RecordingEngine(engine)
    p, _ = placer(rec)
    assert p.compute(observation(engine), decision("cloud"), 1, FakeRemote(engine, "raise"),
                     active=lambda: False) is None
    assert not rec.calls  # no edge run once stopping
    with pytest.raises(Rejected, match="state"):
        p.compute(observation(engine, state_dim=engine.spec.state_dim + 3), None, 1)


@pytest.mark.parametrize("route", ["cloud", "edge"])
def test_shadow_runs_the_other_placement_with_the_same_noise(engine, route):
    rec, remote, shadow = RecordingEngine(engine), FakeRemote(engine), FakeShadow()
    p, logs = placer(rec, deadline=5.0, shadow=shadow)
    d = decision(route, jpeg_quality=70)
    out = p.compute(observation(engine, stamp=1.0), d, 4, remote)
    assert out.source == route and out.shadowed and not shadow.records  # nothing before publishing
    p.published(out, dataclasses.replace(out.chunk, stamp=1.0, dt=DT), 0.05)
    ((rid, logged_decision, served, other),) = shadow.records
    assert rid == "r-4" and logged_decision is d and served is out.served and not logs
    assert (served.placement, other.placement) == (route, "edge" if route == "cloud" else "cloud")
    # both placements ran once, on the shared noise; equal noise, equal model: equal actions
    assert len(rec.calls) == 1 and len(remote.calls) == 1
    assert rec.calls[0]["noise"] is shadow.last_noise and remote.calls[0]["noise"] is shadow.last_noise
    np.testing.assert_allclose(other.actions, served.actions, atol=1e-5)
    # the cloud runs as routed when serving, with raw images when it is the shadow reference
    assert remote.calls[0]["encoding"] == (Encoding("jpeg", 70) if route == "cloud" else Encoding())
    assert p.lat["prefill"].count == (1 if route == "edge" else 0)  # a shadow edge run is not a served chunk
    assert other.latency_s > 0


@pytest.mark.parametrize("mode", ["raise", "served_ok_shadow_raises"])
def test_shadow_with_a_failed_cloud_run(engine, mode):
    rec, shadow = RecordingEngine(engine), FakeShadow()
    p, logs = placer(rec, deadline=5.0, shadow=shadow)
    remote = FakeRemote(engine, "raise" if mode == "raise" else "ok")
    out = p.compute(observation(engine), decision("cloud" if mode == "raise" else "edge"), 2, remote)
    remote.mode = "raise"
    p.published(out, out.chunk, 0.05)
    ((_, _, served, other),) = shadow.records
    assert served.placement == "edge" and other == PlacementRun("cloud", None, 0.0)
    assert len(rec.calls) == 1  # a fallback is not run a second time on the edge
    kinds = [k for k, _ in logs]
    assert kinds == (["cloud_failed"] if mode == "raise" else ["shadow_failed"])


def test_shadow_log_errors_are_counted(engine):
    class Broken(FakeShadow):
        def record(self, *a):
            raise OSError("disk full")

    shadow = Broken()
    p, logs = placer(engine, deadline=5.0, shadow=shadow)
    out = p.compute(observation(engine), decision("edge"), 1, FakeRemote(engine))
    p.published(out, out.chunk, 0.05)
    assert shadow.skipped["log_error"] == 1 and logs == [("shadow_log", "shadow log: disk full")]


def test_rtc_prefix_and_delay_are_the_same_for_edge_cloud_and_shadow(engine):
    n = engine.spec.chunk_size
    rtc = ChunkContinuation(DelayEstimator(DelayConfig(warmup=0, max_ticks=n), DT), n)
    rec, remote, shadow = RecordingEngine(engine), FakeRemote(engine), FakeShadow()
    p, _ = placer(rec, deadline=5.0, rtc=rtc, shadow=shadow)
    out = p.compute(observation(engine, stamp=10.0), None, 1, remote)
    assert rec.calls[0].get("rtc_prefix") is None and out.rtc is None  # nothing to continue yet
    first = dataclasses.replace(out.chunk, stamp=10.0, dt=DT)
    p.published(out, first, 0.23)  # 0.23 s at 10 Hz: 3 ticks run while the next chunk is computed
    assert p.rtc_chunks == 0 and p.rtc_estimate == (pytest.approx(0.23), 3)

    obs = observation(engine, stamp=10.0 + 0.2)  # 2 ticks into the first chunk
    want = continuation(first.actions, 10.0, DT, 10.2, DT, n)
    assert want.shape == (n - 2, engine.spec.action_dim)
    edge = p.compute(obs, None, 2, remote)
    cloud = p.compute(obs, decision("cloud"), 3, remote)
    np.testing.assert_allclose(edge.rtc.prefix, want, rtol=1e-6)
    assert edge.rtc.delay == cloud.rtc.delay == 3 and p.last_rtc is cloud.rtc
    got_edge, got_cloud = rec.calls[1], remote.calls[0]
    np.testing.assert_array_equal(got_edge["rtc_prefix"], got_cloud["rtc_prefix"])
    assert got_edge["rtc_delay"] == got_cloud["rtc_delay"] == 3
    # the shadow edge run of the cloud-served request continues the same prefix, on the same noise
    p.published(cloud, dataclasses.replace(cloud.chunk, stamp=10.2, dt=DT), 0.2)
    shadow_edge = rec.calls[2]
    np.testing.assert_array_equal(shadow_edge["rtc_prefix"], got_cloud["rtc_prefix"])
    assert shadow_edge["rtc_delay"] == 3 and shadow_edge["noise"] is got_cloud["noise"]
    assert p.rtc_chunks == 1
    # an empty queue: the robot holds, nothing to continue (the delay estimate stays)
    again = p.compute(observation(engine, stamp=10.3), None, 4, remote, queue_empty=True)
    assert again.rtc is None and rec.calls[-1].get("rtc_prefix") is None and rtc.delay.ticks() == 3
    # what vla_node reports: shadow mode's values, then RTC's (the last request's, the estimate after publishing)
    v = p.stats()
    assert v["shadow_logged"] == len(shadow.records) == 1 and v["rtc_chunks"] == 1
    assert v["rtc_delay_ticks"] == v["rtc_prefix_rows"] == 0  # the last request had nothing to continue
    assert v["rtc_delay_estimate_ticks"] == 3
    assert v["rtc_latency_estimate_ms"] == pytest.approx(rtc.delay.latency_s() * 1e3)
    p.close()
    assert shadow.closed and p.shadow is None and "shadow_logged" not in p.stats()


def test_config_is_validated():
    with pytest.raises(ValueError, match="dt"):
        PlacementConfig(0.0, 0.2)
    with pytest.raises(ValueError, match="cloud_deadline_s"):
        PlacementConfig(0.1, float("nan"))

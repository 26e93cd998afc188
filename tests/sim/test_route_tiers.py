"""Where a chunk is computed on the simulated clock (edgefm_ros.sim.tiers) and the route evaluation's sums
(edgefm_ros.sim.route_eval): scripted engines, real Router, real queue."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest

from edgefm_ros.routing.config import Candidate, PolicyConfig, RouterConfig, design_names
from edgefm_ros.routing.features import FeatureConfig
from edgefm_ros.routing.router import Router
from edgefm_ros.sim.async_loop import run_served_episode
from edgefm_ros.sim.route_eval import RoutedEpisode, oracle, pgr, summarize
from edgefm_ros.sim.tiers import EngineTier, EpisodeServing, Link, RandomTier, RouterTier, chunk_spread, \
    jpeg_roundtrip
from edgefm_ros.types import ActionChunk

RNG = np.random.default_rng()
HZ = 20.0


@dataclass
class _Spec:
    chunk_size: int
    max_action_dim: int = 6
    action_dim: int = 4
    camera_keys: tuple = ("observation.images.scene", "observation.images.wrist")


class TaggedEngine:
    """Row i of a chunk: [tag, stamp tick + i, 0, 0]: which model and which tick."""

    def __init__(self, tag: float, chunk_size: int):
        self.tag, self.spec, self.calls = tag, _Spec(chunk_size), []

    def predict(self, obs, *, noise, dt=0.05, rtc_prefix=None, rtc_delay=0):
        assert noise.shape == (self.spec.chunk_size, self.spec.max_action_dim)
        self.calls.append((obs, None if rtc_prefix is None else np.array(rtc_prefix), rtc_delay))
        rows = np.arange(self.spec.chunk_size)
        a = np.stack([np.full(len(rows), self.tag), round(obs.stamp * HZ) + rows, np.zeros(len(rows)),
                      np.zeros(len(rows))], axis=1).astype(np.float32)
        return ActionChunk(actions=a, dt=dt, stamp=obs.stamp)


@dataclass
class _Cfg:
    control_hz: float = HZ


class DarkOrBrightEnv:
    """Renders grey frames whose brightness the test sets; succeeds after ``ticks``."""

    def __init__(self, ticks: int, level: int = 128):
        self.config, self.ticks, self.level, self.sim_time, self.commanded = _Cfg(), ticks, level, 0.0, []

    def reset(self, task, seed):
        self.sim_time, self.commanded = 0.0, []

    def render(self):
        rng = np.random.default_rng(int(self.sim_time * HZ))
        img = np.clip(self.level + rng.normal(0, 12, (64, 64, 3)), 0, 255).astype(np.uint8)
        return {"scene": img, "wrist": img.copy()}

    def state(self):
        return np.zeros(4, np.float32)

    def set_command(self, cmd):
        self.commanded.append((round(self.sim_time * HZ), np.asarray(cmd).copy()))

    def advance(self, s):
        self.sim_time += s

    def success(self):
        return self.sim_time * HZ >= self.ticks - 1e-6


def _router_cfg(*, guard_mbps: float = 15.0, signals: tuple[str, ...] = ()) -> RouterConfig:
    """Edge good on well-exposed frames, bad on dark or bright ones; the cloud indifferent to exposure."""
    feats = FeatureConfig(signals=signals)
    n = len(design_names(feats))
    edge = [0.0] * n
    edge[0], edge[design_names(feats).index("exposure_abs")] = 2.0, -8.0
    cloud = [0.0] * n
    cloud[0] = 0.5
    return RouterConfig(
        candidates=(Candidate("edge", "m", "fp32", 64, "edge", 0.0006, 0.6, coefficients=tuple(edge)),
                    Candidate("cloud", "m", "fp32", 128, "cloud", 0.0014, 0.7, coefficients=tuple(cloud))),
        features=feats, policy=PolicyConfig(delta_min=0.05, guard_mbps=guard_mbps, guard_hysteresis_mbps=1.0))


def _tiers(link=Link(20.0, 40.0), edge_chunk=8, cloud_chunk=6):
    edge = EngineTier("edge", TaggedEngine(1.0, edge_chunk), 0.02)
    cloud = EngineTier("cloud", TaggedEngine(2.0, cloud_chunk), 0.03, link=link, jpeg_quality=80)
    return edge, cloud


def _images(level=128):
    return {f"observation.images.{k}": v for k, v in DarkOrBrightEnv(1, level).render().items()}


def test_link_parse_and_transfer_time():
    link = Link.parse("8,25")
    assert (link.mbps, link.rtt_ms) == (8.0, 25.0)
    assert link.transfer_s(10_000) == pytest.approx(0.025 + 10_000 * 8 / 8e6)
    for bad in ("8", "0,10", "8,-1", "x,1", "1,2,3", "nan,5"):
        with pytest.raises(ValueError, match="--link"):
            Link.parse(bad)


def test_cloud_tier_charges_compute_round_trip_and_upload():
    edge, cloud = _tiers()
    for t in (edge, cloud):
        t.start(1 / HZ)
    imgs = _images()
    s = cloud.serve(imgs, np.zeros(4, np.float32), "go", RNG, 0.0, None, 1 / HZ)
    _, nbytes = jpeg_roundtrip(imgs, 80)
    assert s.placement == "cloud" and s.upload_bytes == nbytes > 0
    assert s.latency_s == pytest.approx(0.03 + 0.040 + nbytes * 8 / 20e6)
    seen = cloud.engine.calls[-1][0].images  # the server sees the JPEG-decoded frames
    assert all(v.shape == imgs[k].shape and not np.array_equal(v, imgs[k]) for k, v in seen.items())
    e = edge.serve(imgs, np.zeros(4, np.float32), "go", RNG, 0.0, None, 1 / HZ)
    assert (e.placement, e.upload_bytes, e.latency_s) == ("edge", 0, pytest.approx(0.02))


@pytest.mark.parametrize("level,target", [(128, "edge"), (12, "cloud"), (245, "cloud")])
def test_router_tier_sends_badly_exposed_frames_to_the_cloud(level, target):
    edge, cloud = _tiers()
    tier = RouterTier(Router(_router_cfg()), edge, cloud, decision_s=0.001)
    tier.start(1 / HZ, 7)
    s = tier.serve(_images(level), np.zeros(4, np.float32), "open the drawer", RNG, 0.0, None, 1 / HZ)
    assert s.placement == target and s.decision.target == target
    assert s.latency_s == pytest.approx((0.02 if target == "edge" else 0.03 + cloud.link.transfer_s(s.upload_bytes))
                                        + 0.001)


def test_router_tier_keeps_to_the_edge_below_the_guard():
    edge, cloud = _tiers(link=Link(5.0, 40.0))
    tier = RouterTier(Router(_router_cfg(guard_mbps=15.0)), edge, cloud)
    tier.start(1 / HZ)
    s = tier.serve(_images(12), np.zeros(4, np.float32), "go", RNG, 0.0, None, 1 / HZ)
    assert s.placement == "edge" and s.decision.reason == "guard"


def test_router_tier_measures_edge_spread_without_touching_the_served_noise():
    edge, cloud = _tiers()
    tier = RouterTier(Router(_router_cfg(signals=("edge_spread",))), edge, cloud, decision_s=0.0)
    tier.start(1 / HZ, 3)
    rng = np.random.default_rng(5)
    s = tier.serve(_images(128), np.zeros(4, np.float32), "go", rng, 0.0, None, 1 / HZ)
    assert s.decision.features[-1] == 0.0  # the scripted draws agree exactly
    assert len(edge.engine.calls) == 3 and s.placement == "edge"
    assert s.latency_s == pytest.approx(2 * 0.02)  # two draws charged; the first is the answer
    # the served chunk's generator advanced by one chunk of noise, as under edge-only
    ref = np.random.default_rng(5)
    ref.standard_normal((8, 6))
    assert rng.standard_normal(3).tolist() == ref.standard_normal(3).tolist()
    with pytest.raises(ValueError, match="signal"):
        RouterTier(Router(_router_cfg(signals=("gpu_temp",))), edge, cloud)


def test_chunk_spread():
    a = RNG.normal(size=(10, 6))
    b = a.copy()
    b[:, :3] += [0.03, 0.0, 0.04]
    assert chunk_spread(a, b) == pytest.approx(0.05)
    assert chunk_spread(a, a) == 0.0


@pytest.mark.parametrize("p,expect", [(0.0, {"edge"}), (1.0, {"cloud"})])
def test_random_tier_extremes(p, expect):
    edge, cloud = _tiers()
    tier = RandomTier(p, edge, cloud)
    tier.start(1 / HZ, 1)
    got = {tier.serve(_images(), np.zeros(4, np.float32), "go", RNG, 0.0, None, 1 / HZ).placement for _ in range(20)}
    assert got == expect
    with pytest.raises(ValueError, match="offload probability"):
        RandomTier(1.5, edge, cloud)


def test_switching_placement_under_rtc_continues_the_motion():
    """Dark frames go to the cloud (chunk 6), bright ones... well-exposed to the edge (chunk 8): every command
    is its chunk's row for its tick, and each prefix fits the chunk of the model that serves it."""
    edge, cloud = _tiers()
    tier = RouterTier(Router(_router_cfg()), edge, cloud)
    env = DarkOrBrightEnv(80)
    levels = iter([128, 12] * 40)

    def flip(images, state, instruction, now, rtc):
        env.level = next(levels)
        return None

    serving = EpisodeServing()
    r = run_served_episode(env, tier, "reach", 1000, aggregate="rtc", serving=serving, on_request=flip,
                           restamp_held=False)
    assert r.success and {"edge", "cloud"} <= set(serving.placements)
    for tick, cmd in env.commanded:
        assert abs(cmd[1] - tick) < 1e-6, (tick, cmd)
    for eng in (edge.engine, cloud.engine):
        for _, prefix, delay in eng.calls:
            if prefix is not None:
                assert len(prefix) <= eng.spec.chunk_size and 0 < delay <= eng.spec.chunk_size
    lat = dict(zip(serving.placements, serving.latency_s))
    assert lat["cloud"] > lat["edge"]


def _ep(task, seed, cond, success, placements, nbytes=0):
    s = EpisodeServing()
    for p in placements:
        s.placements.append(p)
        s.latency_s.append(0.05 if p == "edge" else 0.12)
        s.upload_bytes.append(nbytes if p == "cloud" else 0)
        s.reasons.append("")
        s.features.append(())
    return RoutedEpisode(task, seed, cond, "x", success, s)


def test_summaries_oracle_and_pgr():
    edge = [_ep("reach", 1, "clean", True, ["edge"] * 3), _ep("reach", 2, "dark", False, ["edge"] * 5)]
    cloud = [_ep("reach", 1, "clean", True, ["cloud"] * 2, 1000), _ep("reach", 2, "dark", True, ["cloud"] * 4, 1000)]
    s = summarize(cloud)
    assert s["success_rate"] == 1.0 and s["offload_rate"] == 1.0 and s["upload_mb"] == pytest.approx(0.006)
    assert s["by_condition"]["dark"]["success_rate"] == 1.0 and s["by_task"]["reach"]["episodes"] == 2
    assert s["chunk_latency_ms"]["p50"] == pytest.approx(120.0)
    o = oracle(edge, cloud)
    assert [e.serving.placements[0] for e in o] == ["edge", "cloud"] and summarize(o)["success_rate"] == 1.0
    assert summarize(o)["offload_rate"] == pytest.approx(4 / 7)
    assert pgr(0.75, 0.5, 1.0) == pytest.approx(0.5) and pgr(0.5, 0.5, 0.5) is None
    with pytest.raises(ValueError, match="oracle"):
        oracle(edge, cloud[:1])
    # placement switches: changes between an episode's consecutive chunks, never across episodes
    mixed = [_ep("reach", 1, "clean", True, ["edge", "cloud", "cloud", "edge"]), _ep("reach", 2, "dark", True, ["edge"]),
             _ep("reach", 3, "dark", True, ["cloud", "cloud"])]
    assert [e.summary()["switches"] for e in mixed] == [2, 0, 0]
    assert summarize(mixed)["switches_per_episode"] == pytest.approx(2 / 3)


def test_cloud_fault_and_link_impairments_are_parsed_or_refused_by_name(capsys):
    from edgefm_ros.tools.cloud_outage import CloudOutage
    from edgefm_ros.tools.sim_cli import main as sim_main

    assert CloudOutage.parse("2,8") == CloudOutage(2, 8.0, kind="crash")
    assert CloudOutage.parse("3,6,hang") == CloudOutage(3, 6.0, kind="hang")
    for bad, named in (("2,8,freeze", "freeze"), ("0,8", "0,8"), ("2", "'2'"), ("2,-1,hang", "-1")):
        with pytest.raises(ValueError, match=named):
            CloudOutage.parse(bad)
    # the proxy's impairments shape real connections: the simulated clock refuses them, naming them
    for flags, named in ((["--jitter-ms", "20"], "--jitter-ms 20.0"), (["--loss", "0.01"], "--loss 0.01"),
                         (["--handshake"], "--handshake")):
        assert sim_main(["route-eval", "--seeds", "1000", "--tasks", "reach", *flags]) == 2
        err = capsys.readouterr().err
        assert named in err and "--exec ros" in err, err

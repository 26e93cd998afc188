"""Decisions: edge first with delta_min, the guard's hysteresis, deadlines, breaker, stale estimates."""
import math
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgefm_ros.routing.config import (DESIGN_NAMES, Candidate, LatencyModel, PolicyConfig, RouterConfig,
                                       load_router_config)
from edgefm_ros.routing.link import LinkConfig, LinkEstimator, LinkSnapshot
from edgefm_ros.routing.pareto import dominates, frontier
from edgefm_ros.routing.payload import request_bytes
from edgefm_ros.routing.router import REASONS, Router, choose
from edgefm_ros.types import CandidatePrediction

ROOT = Path(__file__).resolve().parents[2]
GOOD = LinkSnapshot(bandwidth_mbps=100.0, rtt_s=0.02)


def coeffs(bias: float, blur: float = 0.0) -> tuple[float, ...]:
    c = [0.0] * len(DESIGN_NAMES)
    c[0], c[1] = bias, blur
    return tuple(c)


def two_candidates(edge_s=0.2, cloud_s=0.05, cloud_blur=2.0, **policy) -> RouterConfig:
    """Edge quality is constant; the cloud's rises with the blur feature (coefficient cloud_blur)."""
    edge = Candidate("edge", "m", "bf16", 256, "edge", 0.5, 0.7, latency=LatencyModel(edge_s, 0.0, 0.0),
                     coefficients=coeffs(0.0))
    cloud = Candidate("cloud", "m", "fp32", 512, "cloud", 0.5, 0.7, latency=LatencyModel(cloud_s, 0.0, 0.0),
                      jpeg_quality=80, coefficients=coeffs(-1.0, cloud_blur))
    return RouterConfig(candidates=(edge, cloud), policy=PolicyConfig(**policy))


def features(blur: float) -> np.ndarray:
    rng = np.random.default_rng()
    x = rng.uniform(0, 1, 10)
    x[0] = blur
    return x


def gain(d) -> float:
    q = {p.placement: p.quality for p in d.predictions}
    return q["cloud"] - q["edge"]


def test_edge_first_cloud_only_above_delta_min():
    rng = np.random.default_rng()
    router = Router(two_candidates())
    seen = set()
    for blur in rng.uniform(0, 1, 200):
        d = router.decide_features(features(blur), upload_bytes={"cloud": 50_000}, deadline_s=1.0, link=GOOD)
        g = gain(d)
        assert (d.target == "cloud") == (g > 0.03), (g, d.reason)
        assert d.reason == ("cloud_gain" if g > 0.03 else "edge_first")
        seen.add(d.target)
    assert seen == {"edge", "cloud"}


def test_delta_min_changes_at_runtime():
    router = Router(two_candidates())
    x = features(0.7)  # gain = sigmoid(0.4) - 0.5 ~ 0.099
    assert router.decide_features(x, deadline_s=1.0, link=GOOD).target == "cloud"
    router.set_thresholds(delta_min=0.12)
    d = router.decide_features(x, deadline_s=1.0, link=GOOD)
    assert (d.target, d.reason) == ("edge", "edge_first") and d.params["delta_min"] == 0.12


@pytest.mark.parametrize("kwargs, bad", [({"delta_min": 1.5}, "delta_min"), ({"delta_min": float("nan")}, "delta_min"),
                                         ({"guard_mbps": -1.0}, "guard_mbps"),
                                         ({"guard_hysteresis_mbps": math.inf}, "guard_hysteresis_mbps"),
                                         ({"cloud_hysteresis": -0.01}, "cloud_hysteresis"),
                                         ({"delta_min": 0.1, "cloud_hysteresis": 1.5}, "cloud_hysteresis"),
                                         ({"delta": 0.1}, "delta")])
def test_set_thresholds_validates(kwargs, bad):
    router = Router(two_candidates())
    with pytest.raises(ValueError, match=bad):
        router.set_thresholds(**kwargs)
    assert router.thresholds == {"delta_min": 0.03, "guard_mbps": 15.0, "guard_hysteresis_mbps": 5.0,
                                 "cloud_hysteresis": 0.0}


def blur_for_gain(gain: float) -> float:
    """The blur feature at which two_candidates' cloud beats its edge (quality 0.5) by ``gain``."""
    return (math.log((0.5 + gain) / (0.5 - gain)) + 1.0) / 2.0


def test_cloud_hysteresis_enters_above_delta_min_plus_it_and_leaves_below_delta_min():
    router = Router(two_candidates(delta_min=0.03, cloud_hysteresis=0.05))
    # (gain of the cloud, target): from the edge the cloud needs > 0.08; in the cloud it stays while > 0.03
    seq = [(0.06, "edge"), (0.079, "edge"), (0.09, "cloud"), (0.06, "cloud"), (0.031, "cloud"), (0.02, "edge"),
           (0.06, "edge"), (0.3, "cloud"), (-0.1, "edge")]
    for gain, target in seq:
        d = router.decide_features(features(blur_for_gain(gain)), deadline_s=1.0, link=GOOD)
        q = {p.name: p.quality for p in d.predictions}
        assert q["cloud"] - q["edge"] == pytest.approx(gain, abs=1e-6)
        assert d.target == target, (gain, d.reason, d.params["gain_needed"])
        assert d.reason == ("cloud_gain" if target == "cloud" else "edge_first")
    # a decision the guard forces to the edge counts as the last one: the cloud must win by the full margin again
    router.decide_features(features(blur_for_gain(0.3)), deadline_s=1.0, link=GOOD)
    assert router.decide_features(features(blur_for_gain(0.3)), deadline_s=1.0,
                                  link=LinkSnapshot(5.0, 0.02)).reason == "guard"
    assert router.decide_features(features(blur_for_gain(0.06)), deadline_s=1.0, link=GOOD).target == "edge"
    # 0 (the default) is the rule without memory
    router.set_thresholds(cloud_hysteresis=0.0)
    assert router.decide_features(features(blur_for_gain(0.06)), deadline_s=1.0, link=GOOD).target == "cloud"


def test_bandwidth_guard_has_hysteresis():
    router = Router(two_candidates(guard_mbps=15.0, guard_hysteresis_mbps=5.0))
    x = features(1.0)  # the cloud is much better
    seq = [(30, "cloud"), (14, "edge"), (17, "edge"), (19.9, "edge"), (21, "cloud"), (16, "cloud"), (15.5, "cloud"),
           (14.9, "edge"), (math.nan, "edge")]
    for bw, target in seq:
        d = router.decide_features(x, deadline_s=1.0, link=LinkSnapshot(bandwidth_mbps=bw, rtt_s=0.02))
        assert d.target == target, (bw, d.reason)
        assert d.guard_open == (target == "edge")
        assert d.reason == ("guard" if target == "edge" else "cloud_gain")
    router.set_thresholds(guard_mbps=5.0, guard_hysteresis_mbps=0.0)
    assert router.decide_features(x, deadline_s=1.0, link=LinkSnapshot(8.0, 0.02)).target == "cloud"


def test_deadline_driven_fallback():
    x = features(1.0)
    # the cloud would win but cannot make the deadline: edge
    router = Router(two_candidates(edge_s=0.2, cloud_s=0.6))
    d = router.decide_features(x, deadline_s=0.5, link=GOOD)
    assert (d.target, d.reason) == ("edge", "deadline_edge")
    # the edge cannot make it but the cloud can: cloud, even when it is worse
    router = Router(two_candidates(edge_s=0.8, cloud_s=0.1, cloud_blur=0.0))
    d = router.decide_features(x, deadline_s=0.5, link=GOOD)
    assert (d.target, d.reason) == ("cloud", "deadline_cloud") and gain(d) < 0
    # nothing makes it: the fastest edge candidate
    d = router.decide_features(x, deadline_s=0.05, link=GOOD)
    assert (d.target, d.reason) == ("edge", "deadline_fastest")
    # and with the cloud blocked by the guard, a late edge still beats nothing
    d = router.decide_features(x, deadline_s=0.5, link=LinkSnapshot(1.0, 0.02))
    assert (d.target, d.reason) == ("edge", "deadline_fastest")


def test_upload_bytes_over_bandwidth_count_against_the_deadline():
    router = Router(two_candidates(edge_s=0.2, cloud_s=0.05))
    x = features(1.0)
    link = LinkSnapshot(bandwidth_mbps=20.0, rtt_s=0.05)
    small = router.decide_features(x, upload_bytes={"cloud": 100_000}, deadline_s=0.5, link=link)
    big = router.decide_features(x, upload_bytes={"cloud": 2_000_000}, deadline_s=0.5, link=link)
    lat = {p.name: p.latency_s for p in big.predictions}
    assert lat["cloud"] == pytest.approx(0.05 + 0.05 + 2_000_000 * 8 / 20e6)
    assert small.target == "cloud" and (big.target, big.reason) == ("edge", "deadline_edge")


def test_circuit_breaker_keeps_requests_on_the_edge():
    link = LinkEstimator(LinkConfig(breaker_failures=2, breaker_cooldown_s=5.0))
    router = Router(two_candidates(), link=link)
    for t in range(3):
        link.observe(300_000, 300_000 * 8 / 50e6, 0.03, now=float(t))
    x = features(1.0)
    assert router.decide_features(x, deadline_s=1.0, now=3.0).target == "cloud"
    link.observe_failure(3.0)
    link.observe_failure(3.5)
    d = router.decide_features(x, deadline_s=1.0, now=4.0)
    assert (d.target, d.reason) == ("edge", "breaker") and d.params["breaker_open"] is True
    assert router.decide_features(x, deadline_s=1.0, now=8.6).target == "cloud"  # half open: one trial


def test_stale_estimates_move_requests_to_the_edge():
    link = LinkEstimator(LinkConfig(stale_after_s=5.0, stale_half_life_s=2.0))
    router = Router(two_candidates(guard_mbps=15.0), link=link)
    link.observe(400_000, 400_000 * 8 / 40e6, 0.03, now=0.0)
    x = features(1.0)
    d = router.decide_features(x, deadline_s=1.0, now=1.0)
    assert d.target == "cloud" and d.bandwidth_mbps == pytest.approx(40.0)
    d = router.decide_features(x, deadline_s=1.0, now=9.0)  # 40 Mbps halved twice: 10 < 15
    assert (d.target, d.reason) == ("edge", "guard") and d.bandwidth_mbps == pytest.approx(10.0)
    assert d.rtt_s == pytest.approx(0.12)


def test_unknown_link_and_no_cloud():
    router = Router(two_candidates())
    d = router.decide_features(features(1.0), deadline_s=1.0, now=0.0)
    assert (d.target, d.reason) == ("edge", "guard") and math.isnan(d.bandwidth_mbps)
    cfg = two_candidates()
    edge_only = RouterConfig(candidates=cfg.candidates[:1])
    d = Router(edge_only).decide_features(features(1.0), deadline_s=1.0, link=GOOD)
    assert (d.target, d.reason) == ("edge", "edge_only")


def random_preds(rng, n):
    return [CandidatePrediction(f"c{i}", "edge" if i % 2 else "cloud", float(rng.uniform()),
                                float(rng.uniform(0.01, 1)), float(rng.uniform(0.1, 10))) for i in range(n)]


def test_pareto_frontier_matches_brute_force():
    rng = np.random.default_rng()
    for _ in range(50):
        preds = random_preds(rng, int(rng.integers(1, 8)))
        mask = frontier(preds)
        for i, p in enumerate(preds):
            assert mask[i] == (not any(dominates(q, p) for q in preds if q is not p))
        assert mask.any()


def test_choice_is_on_its_placements_frontier_and_respects_rules():
    rng = np.random.default_rng()
    for _ in range(200):
        preds = random_preds(rng, int(rng.integers(2, 8)))
        i, reason = choose(preds, delta_min=0.03, deadline_s=0.6, guard_active=False, breaker_open=False)
        assert reason in REASONS
        same = [p for p in preds if p.placement == preds[i].placement]
        assert not any(dominates(q, preds[i]) for q in same)
        edges = [p for p in preds if p.placement == "edge" and p.latency_s <= 0.6]
        if edges and preds[i].placement == "cloud":
            assert preds[i].quality - max(p.quality for p in edges) > 0.03 and preds[i].latency_s <= 0.6


def test_decide_on_images_fills_the_decision():
    rng = np.random.default_rng()
    cfg = load_router_config(ROOT / "config" / "router.yaml")
    link = LinkEstimator(cfg.link)
    router = Router(cfg, link=link)
    for t in range(5):
        link.observe(500_000, 500_000 * 8 / 60e6, 0.03, now=float(t))
    img = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    ok, jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 60])
    images = {"observation.images.camera1": img, "observation.images.camera2": jpg.tobytes()}
    d = router.decide(images, "put the red block left of the cup", deadline_s=1.0, now=5.0)
    assert len(d.features) == len(d.feature_names) == 10 and d.feature_names[0] == "blur"
    assert [p.name for p in d.predictions] == [c.name for c in cfg.candidates]
    assert all(0 < p.quality < 1 and p.latency_s > 0 and p.energy_j > 0 for p in d.predictions)
    chosen = cfg.candidate(d.candidate)
    assert d.target == chosen.placement and d.params["resolution"] == chosen.resolution
    assert d.params["jpeg_quality"] == (chosen.jpeg_quality if chosen.placement == "cloud" else 0)
    assert d.bandwidth_mbps == pytest.approx(60.0) and not d.guard_open
    cloud = [c for c in cfg.candidates if c.placement == "cloud"][0]
    pred = {p.name: p for p in d.predictions}[cloud.name]
    nbytes = request_bytes(images, cloud.resolution, cloud.jpeg_quality)
    comp = cloud.latency.fixed_s + cloud.latency.per_gparam_s * cloud.params_b + \
        cloud.latency.per_mpix_s * 2 * cloud.resolution ** 2 / 1e6
    assert pred.latency_s == pytest.approx(0.03 + nbytes * 8 / 60e6 + comp)
    assert 0 < d.params["decision_s"] < 1.0


def test_measured_latency_history_moves_predictions():
    router = Router(two_candidates(edge_s=0.2))
    x = features(0.0)
    before = {p.name: p.latency_s for p in router.decide_features(x, deadline_s=1.0, link=GOOD).predictions}
    for _ in range(30):
        router.observe_latency("edge", 0.4)
    after = {p.name: p.latency_s for p in router.decide_features(x, deadline_s=1.0, link=GOOD).predictions}
    assert before["edge"] == pytest.approx(0.2) and after["edge"] == pytest.approx(0.4, rel=0.01)
    with pytest.raises(ValueError, match="unknown candidate"):
        router.observe_latency("nope", 0.1)


def test_request_bytes_are_the_bytes_the_cloud_client_sends():
    """One decode and one resize per resolution serve every quality, and each count is the length of what
    the cloud client encodes for that candidate (cloud/images.encode_image), on fresh random images."""
    from edgefm_ros.cloud.images import Encoding, encode_image
    from edgefm_ros.routing.payload import request_bytes_for

    rng = np.random.default_rng()
    h, w = int(rng.integers(200, 500)), int(rng.integers(200, 700))
    rgb = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (0, 0), float(rng.uniform(0.5, 3)))
    chw = rng.random((3, int(rng.integers(64, 300)), int(rng.integers(64, 300))), dtype=np.float32)
    images = {"a": rgb, "b": chw}
    keys = [(512, 90), (512, 85), (224, 90), (128, 0), (224, 90)]
    got = request_bytes_for(images, keys)
    assert list(got) == [(512, 90), (512, 85), (224, 90), (128, 0)]
    for (res, q), n in got.items():
        sent = sum(len(encode_image(img, Encoding.from_route(q, res))[0]) for img in images.values())
        assert n == sent == request_bytes(images, res, q), ((res, q), n, sent)
    # a JPEG already small enough and of no higher quality goes as it is
    ok, jpg = cv2.imencode(".jpg", rgb[:100, :120], [cv2.IMWRITE_JPEG_QUALITY, 70])
    assert request_bytes_for({"c": jpg.tobytes()}, [(512, 90)])[(512, 90)] == jpg.size
    with pytest.raises(ValueError, match="quality"):
        request_bytes_for(images, [(512, 101)])


@pytest.mark.parametrize("shape,resolution", [((480, 640), 512), ((480, 640), 224), ((1080, 1920), 300),
                                              ((300, 200), 512), ((97, 401), 100)])
def test_downscale_fits_the_longer_side_and_stays_close_to_area_averaging(shape, resolution):
    """The fast rule (whole factors of two by area, the rest bilinear) against OpenCV's INTER_AREA on a fresh
    smooth random image: the same size, never enlarged, and mean error under 2 grey levels."""
    from edgefm_ros.routing.payload import downscale

    rng = np.random.default_rng()
    img = cv2.GaussianBlur(rng.integers(0, 256, (*shape, 3), dtype=np.uint8), (0, 0), 1.5)
    out = downscale(img, resolution)
    h, w = shape
    s = min(1.0, resolution / max(h, w))
    assert out.shape == (max(1, round(h * s)), max(1, round(w * s)), 3) and out.dtype == np.uint8
    if s == 1.0:
        assert out is img
        return
    ref = cv2.resize(img, out.shape[1::-1], interpolation=cv2.INTER_AREA)
    assert np.abs(out.astype(np.int16) - ref).mean() < 2.0

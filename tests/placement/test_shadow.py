"""Shadow mode without ROS (placement/shadow.py, placement/shadow_log.py): pairs scored against the cloud and
logged under the right candidates, sampling, and the log in the format the router's calibration reads."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.placement.runs import PlacementRun
from edgefm_ros.placement.shadow import Shadow, ShadowConfig
from edgefm_ros.placement.shadow_log import ShadowLogger, ShadowResult
from edgefm_ros.routing.calibrate import calibrate
from edgefm_ros.routing.chunk_quality import chunk_quality
from edgefm_ros.routing.config import load_router_config
from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.routing.log import read_log
from edgefm_ros.types import CandidatePrediction, RouteDecision

ROOT = Path(__file__).resolve().parents[2]


def _decision(target: str, rng):
    return RouteDecision(target, f"{target}-routed", "test", stamp=float(rng.uniform(0, 100)),
                         feature_names=FEATURE_NAMES, features=tuple(rng.uniform(0, 1, len(FEATURE_NAMES))),
                         bandwidth_mbps=float(rng.uniform(20, 200)), rtt_s=0.01)


def test_shadow_pairs_are_scored_against_the_cloud_and_named(tmp_path):
    rng = np.random.default_rng()
    std = rng.uniform(0.5, 2.0, 6)
    cfg = ShadowConfig(1.0, str(tmp_path / "s.jsonl"), 0.5, "edge-x", "cloud-x")
    shadow = Shadow(cfg, std, n_cameras=2)
    cloud = rng.normal(size=(8, 6)).astype(np.float32)
    edge = (cloud + rng.normal(0, 0.1, cloud.shape)).astype(np.float32)
    d_edge, d_cloud = _decision("edge", rng), _decision("cloud", rng)
    assert shadow.record("a", d_edge, PlacementRun("edge", edge, 0.05), PlacementRun("cloud", cloud, 0.09, 1234))
    assert shadow.record("b", d_cloud, PlacementRun("cloud", cloud, 0.08, 999), PlacementRun("edge", edge, 0.04))
    # a failed cloud run (fallback, or a failed shadow call) leaves no reference: nothing is logged
    assert not shadow.record("c", d_cloud, PlacementRun("edge", edge, 0.04), PlacementRun("cloud", None, 0.5))
    shadow.close()
    recs = read_log(cfg.log)
    assert [(r.request_id, r.placement, r.served) for r in recs] == [
        ("a", "edge", True), ("a", "cloud", False), ("b", "cloud", True), ("b", "edge", False)]
    # served: the routed candidate; shadow: the configured one
    assert [r.candidate for r in recs] == ["edge-routed", "cloud-x", "cloud-routed", "edge-x"]
    want = chunk_quality(edge, cloud, std, 0.5)
    assert 0 < want < 1
    assert [r.quality for r in recs] == pytest.approx([want, 1.0, 1.0, want])
    assert recs[1].upload_bytes == 1234 and recs[0].features == pytest.approx(d_edge.features, abs=1e-6)
    assert shadow.logged == 2 and shadow.skipped["cloud_failed"] == 1


def test_shadow_samples_its_fraction_and_rejects_bad_config(tmp_path):
    rng = np.random.default_rng()
    frac = float(rng.uniform(0.2, 0.8))
    shadow = Shadow(ShadowConfig(frac, str(tmp_path / "s.jsonl")), np.ones(6), 1)
    d = _decision("edge", rng)
    hits = sum(shadow.wants(d) for _ in range(4000))
    assert abs(hits / 4000 - frac) < 0.04
    assert not shadow.wants(None)  # unrouted requests have no features to log
    assert not shadow.wants(RouteDecision("edge", "e", "r")) and shadow.skipped["no_features"] == 1
    n = shadow.noise((8, 32))
    assert n.dtype == np.float32 and n.shape == (8, 32) and abs(float(n.std()) - 1) < 0.2
    shadow.close()
    with pytest.raises(ValueError, match="fraction"):
        ShadowConfig(1.5, "x")
    with pytest.raises(ValueError, match="log"):
        ShadowConfig(0.1, "")
    with pytest.raises(ValueError, match="tolerance"):
        ShadowConfig(0.1, "x", tolerance=0.0)


def test_shadow_log_feeds_calibration(tmp_path):
    rng = np.random.default_rng()
    cfg = load_router_config(ROOT / "config" / "router.yaml")
    edge, ref = cfg.edge_only, cfg.cloud_only
    path = tmp_path / "shadow" / "log.jsonl"
    with ShadowLogger(path) as logger:
        for i in range(40):
            x = rng.uniform(0, 1, 10)
            d = RouteDecision(target="edge", candidate=edge, reason="edge_first", stamp=float(i),
                              feature_names=FEATURE_NAMES, features=tuple(x), bandwidth_mbps=30.0, rtt_s=0.04,
                              predictions=(CandidatePrediction(edge, "edge", 0.8, 0.3, 4.0),),
                              params={"deadline_s": 0.5, "breaker_open": False})
            ref_chunk = rng.normal(0, 1, (50, 6))
            q = {ref: 1.0, edge: chunk_quality(ref_chunk + rng.normal(0, x[0], ref_chunk.shape), ref_chunk)}
            logger.log(f"req{i}", d, [ShadowResult(edge, "edge", q[edge], 0.3, 4.0, served=True),
                                      ShadowResult(ref, "cloud", q[ref], 0.2, 1.0, upload_bytes=60_000)])
    records = read_log(path)
    assert len(records) == 80
    assert {r.candidate for r in records} == {edge, ref}
    first = [r for r in records if r.request_id == "req0"]
    assert {r.served for r in first} == {True, False} and first[0].deadline_s == 0.5
    assert all(r.quality == 1.0 for r in records if r.candidate == ref)
    res = calibrate(cfg, records, test_fraction=0.25)  # the format calibrate reads
    assert {r.name for r in res.reports} == {edge, ref}

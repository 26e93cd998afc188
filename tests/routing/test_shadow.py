"""Shadow mode: the action-chunk quality definition and the log calibrate reads."""
import math
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.routing.calibrate import calibrate
from edgefm_ros.routing.config import load_router_config
from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.routing.log import read_log
from edgefm_ros.routing.shadow import ShadowLogger, ShadowResult, chunk_error, chunk_quality
from edgefm_ros.types import CandidatePrediction, RouteDecision

ROOT = Path(__file__).resolve().parents[2]



def test_chunk_quality_definition():
    rng = np.random.default_rng()
    ref = rng.normal(0, 1, (50, 6)).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, 6)
    assert chunk_quality(ref, ref) == 1.0
    # an error of one scale unit on every entry: e = 1, scoring exp(-1) at tolerance 1
    off = ref + scale
    assert chunk_error(off, ref, scale) == pytest.approx(1.0)
    assert chunk_quality(off, ref, scale, tolerance=1.0) == pytest.approx(math.exp(-1))
    assert chunk_quality(off, ref, scale, tolerance=0.5) == pytest.approx(math.exp(-4))
    # larger errors score lower; only the executed horizon counts
    q = [chunk_quality(ref + k * rng.normal(0, 0.1, ref.shape), ref) for k in (0.5, 1, 2, 4)]
    assert all(a > b for a, b in zip(q, q[1:]))
    late = ref.copy()
    late[25:] += 10.0
    assert chunk_quality(late, ref, horizon=25) == 1.0 and chunk_quality(late, ref) < 1e-6


def test_chunk_quality_rejects_bad_input():
    rng = np.random.default_rng()
    a = rng.normal(0, 1, (10, 3))
    with pytest.raises(ValueError, match="shapes"):
        chunk_quality(a, a[:, :2])
    with pytest.raises(ValueError, match="scale"):
        chunk_quality(a, a, scale=np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="horizon"):
        chunk_quality(a, a, horizon=11)
    with pytest.raises(ValueError, match="non-finite"):
        chunk_quality(a * np.nan, a)


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

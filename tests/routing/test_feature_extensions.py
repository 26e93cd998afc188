"""The router's feature extensions: an instruction embedding (hashed content words) and signals the caller
measures (e.g. the edge model's own spread), through config, log, calibration (with ablations) and decisions."""
from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from edgefm_ros.routing.calibrate import calibrate, group_mask
from edgefm_ros.routing.config import (DESIGN_NAMES, Candidate, RouterConfig, design_names, load_router_config,
                                       write_router_config)
from edgefm_ros.routing.features import FEATURE_NAMES, FeatureConfig, extract_features, feature_names, text_hash
from edgefm_ros.routing.link import LinkSnapshot
from edgefm_ros.routing.log import LogRecord, feature_matrix, read_log, write_records
from edgefm_ros.routing.predictor import predict_quality
from edgefm_ros.routing.router import Router

RNG = np.random.default_rng()
FEATS = FeatureConfig(text_hash_dims=16, signals=("edge_spread",))


def _img(level=128):
    return np.clip(level + RNG.normal(0, 20, (48, 64, 3)), 0, 255).astype(np.uint8)


def test_names_and_lengths():
    names = feature_names(FEATS)
    assert names[:10] == FEATURE_NAMES and names[10] == "text_hash_00" and names[-1] == "edge_spread"
    assert len(names) == 27 and len(design_names(FEATS)) == 28
    assert design_names(FeatureConfig()) == DESIGN_NAMES
    f = extract_features({"a": _img()}, "push the puck to the green spot", FEATS, {"edge_spread": 0.02})
    assert f.shape == (27,) and f[-1] == pytest.approx(0.02)
    assert extract_features({"a": _img()}, "x").shape == (10,)


def test_instruction_embedding_shares_buckets_across_phrasings():
    a = text_hash("push the puck onto the green spot", 16)
    b = text_hash("shove the puck to the green target", 16)
    c = text_hash("Push THE puck, onto the green spot!", 16)
    assert np.array_equal(a, c)  # case and punctuation do not matter
    assert (a * b).sum() >= 2  # "puck" and "green" land in the same buckets
    assert text_hash("the to of onto", 16).sum() == 0  # stop words carry nothing
    assert set(np.unique(a)) <= {0.0, 1.0}


@pytest.mark.parametrize("signals,match", [({}, "edge_spread"), ({"edge_spread": math.nan}, "finite")])
def test_missing_or_bad_signal_is_named(signals, match):
    with pytest.raises(ValueError, match=match):
        extract_features({"a": _img()}, "go", FEATS, signals)


@pytest.mark.parametrize("kw", [{"text_hash_dims": -1}, {"text_hash_dims": 1000}, {"signals": ("blur",)},
                                {"signals": ("a", "a")}, {"signals": ("not an id",)}, {"signals": ("text_hash_01",)}])
def test_bad_feature_config(kw):
    with pytest.raises(ValueError, match="FeatureConfig"):
        FeatureConfig(**kw)


def _cfg(coef=None) -> RouterConfig:
    return RouterConfig(candidates=(Candidate("e", "m", "fp32", 64, "edge", 0.0006, 0.6, coefficients=coef),
                                    Candidate("c", "m", "fp32", 128, "cloud", 0.001, 0.7)), features=FEATS)


def test_config_round_trip_and_coefficient_count(tmp_path):
    coef = tuple(float(v) for v in RNG.normal(size=28))
    cfg = _cfg(coef)
    write_router_config(cfg, tmp_path / "r.yaml")
    back = load_router_config(tmp_path / "r.yaml")
    assert back.features == FEATS and back.candidates[0].coefficients == pytest.approx(coef)
    with pytest.raises(ValueError, match="expected 28"):
        _cfg(coef[:11])
    q = predict_quality(cfg, np.zeros(27))
    assert q.shape == (2,)
    with pytest.raises(ValueError, match="expected 27"):
        predict_quality(cfg, np.zeros(10))


def test_log_round_trip_keeps_extension_names(tmp_path):
    names = feature_names(FEATS)
    r = LogRecord("r1", "e", tuple(RNG.random(27)), 1.0, 0.05, feature_names=names)
    buf = io.StringIO()
    write_records([r], buf)
    d = json.loads(buf.getvalue())
    assert list(d["features"]) == list(names)
    tmp = tmp_path / "log.jsonl"
    tmp.write_text(buf.getvalue())
    back = read_log(tmp)[0]
    assert back.feature_names == names and back.features == pytest.approx(r.features, abs=1e-6)
    base = LogRecord("r2", "e", tuple(RNG.random(10)), 0.0, 0.05)
    with pytest.raises(ValueError, match="edge_spread"):
        feature_matrix([back, base], names)


def _records(n: int, word_bucket: int) -> list[LogRecord]:
    """The edge succeeds unless the instruction's hash bucket ``word_bucket`` is set; blur does not matter."""
    names = feature_names(FEATS)
    out = []
    for i in range(n):
        x = np.zeros(27)
        x[0] = RNG.random()  # blur: noise
        x[10 + word_bucket] = float(RNG.random() < 0.5)
        x[-1] = RNG.random() * 0.05
        p = 0.1 if x[10 + word_bucket] else 0.9
        out.append(LogRecord(f"r{i}", "e", tuple(x), float(RNG.random() < p), 0.05, feature_names=names))
    return out


def test_calibration_finds_the_word_and_ablation_removes_it():
    cfg = _cfg()
    recs = _records(1500, 5)
    full = calibrate(cfg, recs, l2=1.0, min_per_coef=20)
    coef = np.array(full.config.candidates[0].coefficients)
    k = design_names(FEATS).index("text_hash_05")
    assert full.reports[0].method == "logistic" and coef[k] < -2.0
    assert full.reports[0].brier < full.reports[0].brier_prior
    img = calibrate(cfg, recs, l2=1.0, min_per_coef=20, groups=("image",))
    coef_img = np.array(img.config.candidates[0].coefficients)
    mask = group_mask(cfg, ("image",))
    assert np.all(coef_img[~mask] == 0.0) and mask[design_names(FEATS).index("blur")]
    assert img.reports[0].brier > full.reports[0].brier
    with pytest.raises(ValueError, match="feature group"):
        calibrate(cfg, recs, groups=("vibes",))


def test_router_decides_with_the_extensions():
    coef = np.zeros(28)
    coef[0] = 3.0
    coef[-1] = -200.0  # a spread of 2 cm or more: the edge is unlikely to succeed
    cfg = _cfg(tuple(coef))
    router = Router(cfg)
    link = LinkSnapshot(50.0, 0.02, False, 0.0)
    calm = router.decide({"a": _img()}, "go", now=0.0, signals={"edge_spread": 0.001}, link=link)
    unsure = router.decide({"a": _img()}, "go", now=0.0, signals={"edge_spread": 0.05}, link=link)
    assert calm.target == "edge" and unsure.target == "cloud" and unsure.reason == "cloud_gain"
    assert unsure.feature_names[-1] == "edge_spread" and len(unsure.features) == 27

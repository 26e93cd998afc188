"""Calibration recovers known coefficients from synthetic logs; splits are disjoint; metrics are right."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.routing.calibrate import brier, calibrate, ece, fit_platt, split
from edgefm_ros.routing.config import DESIGN_NAMES, load_router_config, with_coefficients
from edgefm_ros.routing.predictor import prior_coefficients, sigmoid
from edgefm_ros.routing.synth import synth_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def base_cfg():
    return load_router_config(ROOT / "config" / "router.yaml")


def random_truth(cfg, rng):
    d = len(DESIGN_NAMES)
    truth = {c.name: tuple(np.concatenate([[rng.uniform(-0.5, 2.0)], rng.uniform(-2.0, 1.0, d - 1)]))
             for c in cfg.candidates}
    return with_coefficients(cfg, truth), truth


def test_soft_targets_recover_coefficients_exactly(base_cfg):
    rng = np.random.default_rng()
    true_cfg, truth = random_truth(base_cfg, rng)
    records = synth_records(true_cfg, 1500, rng, soft=True)
    res = calibrate(base_cfg, records, test_fraction=0.3, seed=int(rng.integers(1 << 30)), l2=1e-6)
    for r in res.reports:
        assert r.method == "logistic"
        np.testing.assert_allclose(r.coefficients, truth[r.name], atol=2e-3)
        assert r.brier < r.brier_prior and r.ece < 0.01


def test_bernoulli_outcomes_recover_coefficients_within_standard_errors(base_cfg):
    rng = np.random.default_rng()
    true_cfg, truth = random_truth(base_cfg, rng)
    records = synth_records(true_cfg, 5000, rng, soft=False)
    assert set(r.quality for r in records) == {0.0, 1.0}
    res = calibrate(base_cfg, records, test_fraction=0.3, seed=int(rng.integers(1 << 30)))
    for r in res.reports:
        z = (np.array(r.coefficients) - np.array(truth[r.name])) / np.array(r.stderr)
        assert np.all(np.abs(z) < 4.5), (r.name, np.round(z, 2))
        assert r.brier <= r.brier_prior + 1e-3
    cal = {c.name: c.coefficients for c in res.config.candidates}
    assert all(cal[n] is not None for n in truth)


def test_split_is_disjoint_by_request(base_cfg):
    rng = np.random.default_rng()
    records = synth_records(base_cfg, 400, rng, soft=True)
    seed = int(rng.integers(1 << 30))
    calib, test = split(records, 0.3, seed)
    ids_c, ids_t = {r.request_id for r in calib}, {r.request_id for r in test}
    assert not ids_c & ids_t and len(ids_c) + len(ids_t) == 400
    assert 0.2 < len(ids_t) / 400 < 0.4
    assert split(records, 0.3, seed)[1] == test  # deterministic for a seed
    with pytest.raises(ValueError, match="test_fraction"):
        split(records, 1.0)


def test_few_lines_get_platt_scaling(base_cfg):
    rng = np.random.default_rng()
    prior = {c.name: prior_coefficients(c, base_cfg.quality) for c in base_cfg.candidates}
    a, b = rng.uniform(0.5, 1.5), rng.uniform(-0.8, 0.8)
    truth = {n: tuple(a * w + b * np.eye(len(w))[0]) for n, w in prior.items()}
    records = synth_records(with_coefficients(base_cfg, truth), 100, rng, soft=True)
    res = calibrate(base_cfg, records, test_fraction=0.2)
    for r in res.reports:
        assert r.method == "platt"
        np.testing.assert_allclose(r.coefficients, truth[r.name], atol=1e-4)


def test_fit_platt_recovers_a_b():
    rng = np.random.default_rng()
    z = rng.normal(0, 2, 500)
    a, b = rng.uniform(0.3, 2), rng.uniform(-1, 1)
    fa, fb = fit_platt(z, sigmoid(a * z + b))
    assert fa == pytest.approx(a, abs=1e-5) and fb == pytest.approx(b, abs=1e-5)


def test_brier_and_ece_by_hand():
    p = np.array([0.1, 0.15, 0.9, 0.8])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    assert brier(p, y) == pytest.approx((0.01 + 0.7225 + 0.01 + 0.04) / 4)
    # bins of width 0.1: {0.1, 0.15} -> |0.125 - 0.5|, {0.8} -> 0.2, {0.9} -> 0.1
    assert ece(p, y) == pytest.approx((2 * 0.375 + 0.2 + 0.1) / 4)


def test_log_naming_unknown_candidates_is_rejected(base_cfg):
    rng = np.random.default_rng()
    records = synth_records(base_cfg, 5, rng)
    records[0] = replace(records[0], candidate="mystery")
    with pytest.raises(ValueError, match="mystery"):
        calibrate(base_cfg, records)

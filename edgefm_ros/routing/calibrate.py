"""Fit the quality model's coefficients from a request log; report Brier score and calibration error.

Requests (not lines) are split into a calibration and a test part by a seeded hash of their
``request_id``, so both results of one request land on the same side and the parts are disjoint.
Per candidate, on its calibration lines:

- ``logistic``: with at least ``min_per_coef`` lines per coefficient, a full logistic regression of
  the observed quality (0/1 or a score in [0, 1]: cross-entropy with soft targets) on
  phi(features) (predictor.design), by Newton's method with a small L2 penalty (not on the bias).
- ``platt``: with fewer (but at least ``min_platt``), Platt scaling of the prior: q = sigmoid(a * z + b)
  with z the prior logit, i.e. coefficients a * beta_prior + b * e_bias.
- ``prior``: with fewer still, the prior stays.

The report compares prior and fitted models on the test part: Brier score (mean squared error of
the probability) and expected calibration error (ECE: |mean predicted - mean observed| weighted
over ``bins`` equal-width probability bins).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edgefm_ros.routing.config import RouterConfig, design_names, with_coefficients
from edgefm_ros.routing.features import feature_names
from edgefm_ros.routing.log import LogRecord, feature_matrix
from edgefm_ros.routing.predictor import coefficients, design, prior_coefficients, sigmoid


def is_test(request_id: str, test_fraction: float, seed: int = 0) -> bool:
    h = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2 ** 64 < test_fraction


def split(records: Sequence[LogRecord], test_fraction: float = 0.3,
          seed: int = 0) -> tuple[list[LogRecord], list[LogRecord]]:
    """(calibration, test): disjoint by request_id."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    calib, test = [], []
    for r in records:
        (test if is_test(r.request_id, test_fraction, seed) else calib).append(r)
    return calib, test


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, w0: np.ndarray | None = None,
                 max_iter: int = 100, tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Newton's method for logistic regression with targets y in [0, 1].

    x: float64 (n, d) with a bias column 0 (not penalised); returns (w (d,), covariance (d, d)),
    the covariance being the inverse Hessian at the optimum (standard errors for Bernoulli targets).
    """
    n, d = x.shape
    if y.shape != (n,) or not np.all((y >= 0) & (y <= 1)):
        raise ValueError(f"targets must be (n,) in [0, 1] for x of shape {x.shape}")
    w = np.zeros(d) if w0 is None else np.asarray(w0, dtype=np.float64).copy()
    reg = np.full(d, l2)
    reg[0] = 0.0

    def loss(w: np.ndarray) -> float:  # cross-entropy with soft targets + L2
        z = x @ w
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(reg * w * w))

    def hessian(w: np.ndarray) -> np.ndarray:
        p = sigmoid(x @ w)
        return (x * (p * (1 - p))[:, None]).T @ x + np.diag(reg) + 1e-9 * np.eye(d)

    current = loss(w)
    for _ in range(max_iter):
        grad = x.T @ (sigmoid(x @ w) - y) + reg * w
        step = np.linalg.solve(hessian(w), grad)
        t = 1.0
        while t > 1e-6 and loss(w - t * step) > current + 1e-12 * abs(current):
            t *= 0.5  # backtracking keeps Newton from overshooting on nearly separable data
        w = w - t * step
        new = loss(w)
        if current - new < tol * max(1.0, abs(new)) and float(np.max(np.abs(t * step))) < 1e-6:
            current = new
            break
        current = new
    return w, np.linalg.inv(hessian(w))


def fit_platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) of q = sigmoid(a * z + b)."""
    w, _ = fit_logistic(np.stack([np.ones_like(z), z], axis=1), y, l2=0.0, w0=np.array([0.0, 1.0]))
    return float(w[1]), float(w[0])


def brier(p: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((p - y) ** 2)) if len(y) else float("nan")


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    if not len(y):
        return float("nan")
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = which == b
        if m.any():
            total += m.sum() * abs(float(p[m].mean()) - float(y[m].mean()))
    return total / len(y)


@dataclass(frozen=True)
class CandidateReport:
    name: str
    method: str  # "logistic" | "platt" | "prior"
    n_calib: int
    n_test: int
    brier_prior: float
    brier: float
    ece_prior: float
    ece: float
    coefficients: tuple[float, ...]  # DESIGN_NAMES order
    stderr: tuple[float, ...]  # NaN unless logistic


@dataclass(frozen=True)
class CalibrationResult:
    config: RouterConfig
    reports: tuple[CandidateReport, ...]
    n_calib_requests: int
    n_test_requests: int


def _xy(records: Sequence[LogRecord], names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    return design(feature_matrix(records, names)), np.array([r.quality for r in records], dtype=np.float64)


GROUPS = ("image", "text", "signals")  # what an ablation may keep (the bias always stays)


def group_mask(cfg: RouterConfig, groups: Sequence[str] = GROUPS) -> np.ndarray:
    """bool (len(design_names),): the bias and the coefficients of the named feature groups: ``image`` (blur,
    exposure, jpeg, detail), ``text`` (the six text features and the instruction embedding), ``signals``."""
    bad = sorted(set(groups) - set(GROUPS))
    if bad:
        raise ValueError(f"unknown feature group(s) {bad}; known: {list(GROUPS)}")
    names = design_names(cfg.features)
    signals = set(cfg.features.signals)

    def group(n: str) -> str:
        return "signals" if n in signals else "text" if n.startswith("text_") else "image"

    return np.array([n == "bias" or group(n) in groups for n in names])


def calibrate(cfg: RouterConfig, records: Sequence[LogRecord], test_fraction: float = 0.3, seed: int = 0,
              l2: float = 1e-3, min_per_coef: int = 20, min_platt: int = 20,
              groups: Sequence[str] = GROUPS) -> CalibrationResult:
    """Fit every candidate that has log lines; the others keep their coefficients. ``groups``: the feature
    groups the fit may use (group_mask); the others' coefficients are 0 (an ablation)."""
    known = {c.name for c in cfg.candidates}
    unknown = sorted({r.candidate for r in records} - known)
    if unknown:
        raise ValueError(f"log names candidates {unknown} that the router config does not have {sorted(known)}")
    calib, test = split(records, test_fraction, seed)
    names = feature_names(cfg.features)
    keep = group_mask(cfg, groups)
    n = len(keep)
    reports, fitted = [], {}
    for c in cfg.candidates:
        cal = [r for r in calib if r.candidate == c.name]
        tst = [r for r in test if r.candidate == c.name]
        if not cal and not tst:
            continue
        start = np.where(keep, coefficients(c, cfg), 0.0)
        w, se, method = start, np.full(n, np.nan), "prior"
        if cal:
            x, y = _xy(cal, names)
            if len(cal) >= min_per_coef * int(keep.sum()):
                wk, cov = fit_logistic(x[:, keep], y, l2=l2, w0=start[keep])
                w, se = np.zeros(n), np.full(n, np.nan)
                w[keep], se[keep] = wk, np.sqrt(np.diag(cov))
                method = "logistic"
            elif len(cal) >= min_platt:
                a, b = fit_platt(x @ start, y)
                w, method = a * start + b * np.eye(n)[0], "platt"
        fitted[c.name] = tuple(float(v) for v in w)
        xt, yt = _xy(tst, names) if tst else (np.zeros((0, n)), np.zeros(0))
        p0, p1 = sigmoid(xt @ start), sigmoid(xt @ w)
        reports.append(CandidateReport(c.name, method, len(cal), len(tst), brier(p0, yt), brier(p1, yt),
                                       ece(p0, yt), ece(p1, yt), fitted[c.name], tuple(float(s) for s in se)))
    return CalibrationResult(with_coefficients(cfg, fitted), tuple(reports),
                             len({r.request_id for r in calib}), len({r.request_id for r in test}))


def format_report(res: CalibrationResult) -> str:
    lines = [f"requests: {res.n_calib_requests} calibration, {res.n_test_requests} test (disjoint)",
             f"{'candidate':<24} {'method':<9} {'n_cal':>6} {'n_test':>6} {'brier0':>8} {'brier':>8} "
             f"{'ece0':>7} {'ece':>7}"]
    for r in res.reports:
        lines.append(f"{r.name:<24} {r.method:<9} {r.n_calib:>6} {r.n_test:>6} {r.brier_prior:>8.4f} "
                     f"{r.brier:>8.4f} {r.ece_prior:>7.4f} {r.ece:>7.4f}")
    return "\n".join(lines)


__all__ = ["GROUPS", "group_mask", "CalibrationResult", "CandidateReport", "brier", "calibrate", "ece", "fit_logistic", "fit_platt",
           "format_report", "is_test", "prior_coefficients", "split"]

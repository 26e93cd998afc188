"""Per-candidate predictions: quality (a calibrated probability), latency and energy.

Quality. For candidate c and feature vector x (FEATURE_NAMES order)
    q_c(x) = sigmoid(beta_c . phi(x)),   phi(x) = [1, blur, |exposure|, jpeg, detail, text...]  (DESIGN_NAMES)
``beta_c`` are the candidate's calibrated coefficients (``edgefm-router calibrate``). Until a candidate
has them, its prior is built from the configuration:
    bias        = logit(base_quality) + precision_logit[precision]
                  + resolution_logit_per_octave * log2(resolution / reference_resolution)
    beta_need   = -penalty[need] * (1 - strength[need]) * (sqrt(reference / resolution) for ``detail``)
where the strength covering each need is: blur, exposure_abs, jpeg -> ``blur`` (robustness);
detail, text_entity -> ``detail`` (detail/OCR); the other text features -> ``reasoning``. So an input
that needs what a candidate lacks costs it quality, and more so at a lower resolution for detail.

Latency (seconds). compute = (fixed + per_gparam * params_b + per_mpix * cameras * resolution^2 / 1e6)
* history, where history is the EWMA of measured/predicted compute time for that candidate
(``LatencyHistory``). Edge: latency = compute. Cloud: latency = RTT + upload + compute, upload =
the images' encoded bytes * 8 / bandwidth; unknown bandwidth makes it infinite.

Energy (joules, the robot's). Edge: power_w * compute. Cloud: radio_power_w * upload + idle_power_w *
(RTT + compute) (the robot idles while the server works).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from edgefm_ros.routing.config import DESIGN_NAMES, Candidate, CostConfig, QualityConfig, RouterConfig, design_names
from edgefm_ros.routing.features import FEATURE_NAMES
from edgefm_ros.routing.link import LinkSnapshot
from edgefm_ros.types import CandidatePrediction

STRENGTH_OF = {"blur": "blur", "exposure_abs": "blur", "jpeg": "blur", "detail": "detail",
               "text_entity": "detail", "text_length": "reasoning", "text_question": "reasoning",
               "text_lexical": "reasoning", "text_reasoning": "reasoning", "text_deictic": "reasoning"}


def design(features: np.ndarray) -> np.ndarray:
    """float (..., 10 + k) FEATURE_NAMES and k extensions -> float64 (..., 11 + k) design_names: bias column,
    |exposure|; the extensions as they are."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] < len(FEATURE_NAMES):
        raise ValueError(f"features must have at least {len(FEATURE_NAMES)} columns ({FEATURE_NAMES}), "
                         f"got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("features hold non-finite values")
    out = np.concatenate([np.ones(x.shape[:-1] + (1,)), x], axis=-1)
    out[..., 2] = np.abs(out[..., 2])
    return out


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def sigmoid(z: np.ndarray | float) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))  # stable for large |z|


def prior_coefficients(c: Candidate, q: QualityConfig, n_extra: int = 0) -> np.ndarray:
    """float64 (11 + n_extra,) design_names: the uncalibrated quality model of one candidate (module
    docstring); the feature extensions start at 0 (no effect until calibrated)."""
    ref = q.reference_resolution
    pen = dict(q.penalties)
    beta = np.empty(len(DESIGN_NAMES))
    beta[0] = (logit(c.base_quality) + dict(q.precision_logit)[c.precision]
               + q.resolution_logit_per_octave * math.log2(c.resolution / ref))
    for i, name in enumerate(DESIGN_NAMES[1:], start=1):
        scale = math.sqrt(ref / c.resolution) if name == "detail" else 1.0
        beta[i] = -pen[name] * (1.0 - getattr(c.strengths, STRENGTH_OF[name])) * scale
    return np.concatenate([beta, np.zeros(n_extra)])


def coefficients(c: Candidate, cfg: RouterConfig) -> np.ndarray:
    """The calibrated coefficients when the candidate has them, else its prior (design_names(cfg.features))."""
    if c.coefficients is not None:
        return np.asarray(c.coefficients, dtype=np.float64)
    return prior_coefficients(c, cfg.quality, len(design_names(cfg.features)) - len(DESIGN_NAMES))


def coefficient_matrix(cfg: RouterConfig) -> np.ndarray:
    """float64 (n_candidates, len(design_names(cfg.features)))."""
    return np.stack([coefficients(c, cfg) for c in cfg.candidates])


def predict_quality(cfg: RouterConfig, features: np.ndarray) -> np.ndarray:
    """float64 (n_candidates,) success probabilities for one feature vector (feature_names(cfg.features))."""
    x = design(features)
    beta = coefficient_matrix(cfg)
    if x.shape[-1] != beta.shape[1]:
        raise ValueError(f"the router's features are {design_names(cfg.features)[1:]}: expected "
                         f"{beta.shape[1] - 1} values, got {x.shape[-1] - 1}")
    return sigmoid(beta @ x)


def compute_s(c: Candidate, n_cameras: int) -> float:
    lat = c.latency
    return lat.fixed_s + lat.per_gparam_s * c.params_b + lat.per_mpix_s * n_cameras * c.resolution ** 2 / 1e6


class LatencyHistory:
    """Measured history: per candidate, an EWMA of measured / predicted compute time."""

    def __init__(self, cost: CostConfig = CostConfig()):
        self._cost = cost
        self._ratio: dict[str, float] = {}

    def factor(self, name: str) -> float:
        return self._ratio.get(name, 1.0)

    def observe(self, name: str, measured_s: float, predicted_s: float) -> None:
        if not (math.isfinite(measured_s) and measured_s >= 0):
            raise ValueError(f"measured latency of {name!r} must be a finite number >= 0, got {measured_s!r}")
        if not (math.isfinite(predicted_s) and predicted_s > 0):
            raise ValueError(f"predicted latency of {name!r} must be > 0, got {predicted_s!r}")
        lo, hi = self._cost.history_clip
        r = min(hi, max(lo, measured_s / predicted_s))
        a = self._cost.history_alpha
        self._ratio[name] = r if name not in self._ratio else (1 - a) * self._ratio[name] + a * r


def predict_costs(c: Candidate, cost: CostConfig, n_cameras: int, upload_bytes: int, link: LinkSnapshot,
                  history: float = 1.0) -> tuple[float, float]:
    """(latency_s, energy_j) of one candidate (module docstring)."""
    comp = compute_s(c, n_cameras) * history
    if c.placement == "edge":
        return comp, c.power_w * comp
    bw, rtt = link.bandwidth_mbps, link.rtt_s
    if not (bw > 0 and math.isfinite(rtt)):
        return math.inf, math.inf
    upload = upload_bytes * 8.0 / (bw * 1e6)
    return rtt + upload + comp, cost.radio_power_w * upload + cost.idle_power_w * (rtt + comp)


def predict(cfg: RouterConfig, features: np.ndarray, n_cameras: int, upload_bytes: Mapping[str, int],
            link: LinkSnapshot, history: LatencyHistory | None = None) -> tuple[CandidatePrediction, ...]:
    """One CandidatePrediction per candidate, in configuration order.

    upload_bytes: candidate name -> bytes the images would take on the wire (cloud candidates).
    """
    q = predict_quality(cfg, features)
    out = []
    for c, qc in zip(cfg.candidates, q):
        nbytes = int(upload_bytes.get(c.name, 0)) if c.placement == "cloud" else 0
        factor = history.factor(c.name) if history is not None else 1.0
        lat, en = predict_costs(c, cfg.cost, n_cameras, nbytes, link, factor)
        out.append(CandidatePrediction(name=c.name, placement=c.placement, quality=float(qc),
                                       latency_s=float(lat), energy_j=float(en)))
    return tuple(out)

"""The decision: edge first, the cloud only when it is clearly better and the link can carry it.

Rules, in order (the first that applies names the ``reason``):

1. ``deadline_cloud`` / ``deadline_fastest``: no edge candidate meets the deadline: the best cloud
   candidate that does (when the cloud is allowed), else the fastest edge candidate.
2. ``edge_only``: there is no cloud candidate.
3. ``breaker``: the circuit breaker is open (repeated cloud failures): best edge candidate.
4. ``guard``: the bandwidth guard is active: best edge candidate. It activates when the bandwidth
   estimate falls below ``guard_mbps`` (or is unknown) and releases only when the estimate is back
   above ``guard_mbps + guard_hysteresis_mbps``, so it does not flap around the threshold.
5. ``no_link``: the cloud's cost cannot be predicted (no RTT yet): best edge candidate.
6. ``deadline_edge``: a cloud candidate would be better by more than delta_min but misses the deadline.
7. ``cloud_gain``: the best cloud candidate that meets the deadline beats the best edge candidate's
   predicted quality by more than ``delta_min``, plus ``cloud_hysteresis`` when the router's last decision
   went to the edge (or there was none). Once in the cloud, it stays while the gain passes ``delta_min``, so a
   gain that wavers around the threshold (a clean frame mid-motion) does not flip the placement every frame.
8. ``edge_first``: otherwise.

"Best" is the highest predicted quality among the candidates of a placement that are on that
placement's Pareto frontier for the request (quality, latency, energy) and meet the deadline; ties go
to lower latency, then energy. The frontier is per placement so that the edge is compared with the
cloud on quality alone (edge first), never ruled out because the cloud is cheaper.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from edgefm_ros.routing.config import THRESHOLDS, RouterConfig, check_thresholds, load_router_config
from edgefm_ros.routing.features import ImageInput, extract_features, feature_names
from edgefm_ros.routing.link import LinkEstimator, LinkSnapshot
from edgefm_ros.routing.pareto import best, placement_frontier
from edgefm_ros.routing.payload import request_bytes_for
from edgefm_ros.routing.predictor import LatencyHistory, compute_s, predict
from edgefm_ros.types import CandidatePrediction, RouteDecision

REASONS = ("deadline_cloud", "deadline_fastest", "edge_only", "breaker", "guard", "no_link", "deadline_edge",
           "cloud_gain", "edge_first")


class BandwidthGuard:
    """Edge-only while the bandwidth is low, with hysteresis (rule 4). Starts active (no estimate yet)."""

    def __init__(self, guard_mbps: float, hysteresis_mbps: float):
        self.guard_mbps = guard_mbps
        self.hysteresis_mbps = hysteresis_mbps
        self.active = True

    def update(self, bandwidth_mbps: float) -> bool:
        if not bandwidth_mbps > 0:  # unknown (NaN) or nothing
            self.active = True
        elif self.active:
            self.active = bandwidth_mbps < self.guard_mbps + self.hysteresis_mbps
        else:
            self.active = bandwidth_mbps < self.guard_mbps
        return self.active


def choose(preds: Sequence[CandidatePrediction], *, delta_min: float, deadline_s: float, guard_active: bool,
           breaker_open: bool, allowed: np.ndarray | None = None) -> tuple[int, str]:
    """(index of the chosen candidate, reason) by the rules of the module docstring; ``delta_min`` is the
    gain the cloud must pass for this request (the caller adds the hysteresis)."""
    n = len(preds)
    allowed = np.ones(n, dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    if allowed.shape != (n,):
        raise ValueError(f"allowed must be a bool mask of {n} candidates, got shape {allowed.shape}")
    is_edge = np.array([p.placement == "edge" for p in preds]) & allowed
    is_cloud = np.array([p.placement == "cloud" for p in preds]) & allowed
    if not is_edge.any():
        raise ValueError("no edge candidate is allowed for this request")
    front = placement_frontier(preds, allowed)
    in_time = np.array([p.latency_s <= deadline_s for p in preds])
    cloud_ok = not breaker_open and not guard_active

    e = best(preds, is_edge & front & in_time)
    c = best(preds, is_cloud & front & in_time)
    if e is None:
        if cloud_ok and c is not None:
            return c, "deadline_cloud"
        return min(np.flatnonzero(is_edge), key=lambda i: preds[i].latency_s), "deadline_fastest"
    if not is_cloud.any():
        return e, "edge_only"
    if breaker_open:
        return e, "breaker"
    if guard_active:
        return e, "guard"
    c_any = best(preds, is_cloud & front & np.isfinite([p.latency_s for p in preds]))
    if c_any is None:
        return e, "no_link"
    if c is not None and preds[c].quality - preds[e].quality > delta_min:
        return c, "cloud_gain"
    if preds[c_any].quality - preds[e].quality > delta_min:
        return e, "deadline_edge"
    return e, "edge_first"


class Router:
    """Input-aware edge-versus-cloud router: features -> predictions -> rules (see routing/__init__)."""

    def __init__(self, cfg: RouterConfig, link: LinkEstimator | None = None):
        self.cfg = cfg
        self.link = link if link is not None else LinkEstimator(cfg.link)
        self.history = LatencyHistory(cfg.cost)
        self.delta_min = cfg.policy.delta_min
        self.cloud_hysteresis = cfg.policy.cloud_hysteresis
        self.guard = BandwidthGuard(cfg.policy.guard_mbps, cfg.policy.guard_hysteresis_mbps)
        self.last_target = ""  # the last decision's placement ("": none yet, counts as the edge)

    @classmethod
    def from_yaml(cls, path: str | Path, link: LinkEstimator | None = None) -> "Router":
        return cls(load_router_config(path), link)

    @property
    def thresholds(self) -> dict[str, float]:
        """The values set_thresholds changes (config.THRESHOLDS), as they are now."""
        return {"delta_min": self.delta_min, "guard_mbps": self.guard.guard_mbps,
                "guard_hysteresis_mbps": self.guard.hysteresis_mbps, "cloud_hysteresis": self.cloud_hysteresis}

    def set_thresholds(self, **changed: float | None) -> None:
        """Change thresholds (config.THRESHOLDS) at runtime; None keeps a value; ValueError naming the bad
        value or name (nothing changes then)."""
        unknown = sorted(set(changed) - set(THRESHOLDS))
        if unknown:
            raise ValueError(f"unknown router thresholds {unknown}; known: {list(THRESHOLDS)}")
        new = {**self.thresholds, **{k: v for k, v in changed.items() if v is not None}}
        check_thresholds(**new)
        self.delta_min, self.cloud_hysteresis = float(new["delta_min"]), float(new["cloud_hysteresis"])
        self.guard.guard_mbps, self.guard.hysteresis_mbps = float(new["guard_mbps"]), float(new["guard_hysteresis_mbps"])

    def decide(self, images: Mapping[str, ImageInput], instruction: str, deadline_s: float | None = None,
               now: float | None = None, signals: Mapping[str, float] | None = None,
               link: LinkSnapshot | None = None) -> RouteDecision:
        """Route one request: camera key -> uint8 (H, W, 3) RGB or JPEG bytes, plus the instruction;
        ``signals``: the values the configuration's ``features.signals`` name; ``link``: the link estimate to
        use (default the estimator's at ``now``)."""
        t0 = time.perf_counter()
        now = time.monotonic() if now is None else now
        feats = extract_features(images, instruction, self.cfg.features, signals)
        link = self.link.snapshot(now) if link is None else link
        nbytes: dict[str, int] = {}
        if link.bandwidth_mbps > 0:  # the bytes matter only when the upload time can be predicted
            cloud = [c for c in self.cfg.candidates if c.placement == "cloud"]
            encoded = request_bytes_for(images, [(c.resolution, c.jpeg_quality) for c in cloud])
            nbytes = {c.name: encoded[(c.resolution, c.jpeg_quality)] for c in cloud}
        return self.decide_features(feats, n_cameras=len(images), upload_bytes=nbytes, deadline_s=deadline_s,
                                    now=now, link=link, t0=t0)

    def decide_features(self, features: np.ndarray, *, n_cameras: int = 1,
                        upload_bytes: Mapping[str, int] | None = None, deadline_s: float | None = None,
                        now: float = 0.0, link: LinkSnapshot | None = None, allowed: np.ndarray | None = None,
                        t0: float | None = None) -> RouteDecision:
        """Route from a feature vector (feature_names(cfg.features)) already computed (replays, tests); ``link`` defaults to
        the estimator's snapshot at ``now``; ``allowed`` masks candidates out."""
        t0 = time.perf_counter() if t0 is None else t0
        deadline = self.cfg.policy.default_deadline_s if deadline_s is None else deadline_s
        if not (isinstance(deadline, (int, float)) and deadline > 0):
            raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")
        link = self.link.snapshot(now) if link is None else link
        guard = self.guard.update(link.bandwidth_mbps)
        preds = predict(self.cfg, features, n_cameras, upload_bytes or {}, link, self.history)
        gain_needed = self.delta_min + (0.0 if self.last_target == "cloud" else self.cloud_hysteresis)
        i, reason = choose(preds, delta_min=gain_needed, deadline_s=deadline, guard_active=guard,
                           breaker_open=link.breaker_open, allowed=allowed)
        c = self.cfg.candidates[i]
        self.last_target = c.placement
        mask = np.ones(len(preds), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
        front = placement_frontier(preds, mask)
        params = {"jpeg_quality": c.jpeg_quality if c.placement == "cloud" else 0, "resolution": c.resolution,
                  "model": c.model, "precision": c.precision, "breaker_open": link.breaker_open,
                  "upload_bytes": int((upload_bytes or {}).get(c.name, 0)), "deadline_s": float(deadline),
                  "delta_min": self.delta_min, "gain_needed": gain_needed,
                  "frontier": tuple(p.name for p, f in zip(preds, front) if f),
                  "decision_s": time.perf_counter() - t0}
        return RouteDecision(target=c.placement, candidate=c.name, reason=reason, stamp=float(now),
                             feature_names=feature_names(self.cfg.features),
                             features=tuple(float(x) for x in features),
                             predictions=preds, guard_open=guard, bandwidth_mbps=float(link.bandwidth_mbps),
                             rtt_s=float(link.rtt_s), params=params)

    def observe_latency(self, candidate: str, measured_s: float, n_cameras: int = 1, upload_bytes: int = 0,
                        now: float | None = None) -> None:
        """A measured end-to-end latency of ``candidate``: updates its latency history. For a cloud
        candidate the predicted network part (RTT + upload at the current estimate) is taken off."""
        c = self.cfg.candidate(candidate)
        measured = measured_s
        if c.placement == "cloud":
            link = self.link.snapshot(time.monotonic() if now is None else now)
            if link.bandwidth_mbps > 0 and math.isfinite(link.rtt_s):
                measured = max(0.0, measured_s - link.rtt_s - upload_bytes * 8.0 / (link.bandwidth_mbps * 1e6))
        self.history.observe(candidate, measured, compute_s(c, n_cameras))

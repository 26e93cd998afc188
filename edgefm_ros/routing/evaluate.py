"""Replay a request log through the router and compare it with baselines.

A request can be evaluated when the log holds the results of the edge-only and (when configured)
cloud-only baseline candidates; the router chooses among the candidates the log holds for it (its
decision uses the logged features, link estimate, bytes and deadline, in stamp order, so the
guard's hysteresis plays out as it would have), and is credited with that candidate's logged
quality, latency and energy. Baselines on the same requests:

- ``edge_only`` / ``cloud_only``: always the configured baseline candidate (policy.edge_only /
  policy.cloud_only, by default the first edge / cloud candidate);
- ``random``: cloud-only's result with probability p, edge-only's otherwise, p being the router's
  cloud share; its numbers are exact expectations (p95: of the mixture), not one random draw;
- ``oracle``: per request the logged candidate of highest quality (ties: edge, then faster).

``accuracy`` is the mean observed quality (the success rate for 0/1 qualities). Performance gap
recovered: ``pgr = (router - edge_only) / (cloud_only - edge_only)`` in accuracy, and the same
against the oracle (``oracle_gap_recovered``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from edgefm_ros.routing.config import RouterConfig
from edgefm_ros.routing.link import LinkSnapshot
from edgefm_ros.routing.log import LogRecord
from edgefm_ros.routing.router import Router


@dataclass(frozen=True)
class Request:
    request_id: str
    stamp: float
    features: np.ndarray  # float64 (10,)
    n_cameras: int
    link: LinkSnapshot
    deadline_s: float
    results: dict  # candidate name -> LogRecord


def group(records: Sequence[LogRecord]) -> list[Request]:
    """Log lines -> requests in stamp order (features, link and deadline from the first line)."""
    by_id: dict[str, list[LogRecord]] = {}
    for r in records:
        by_id.setdefault(r.request_id, []).append(r)
    out = []
    for rid, rs in by_id.items():
        first = rs[0]
        results = {}
        for r in rs:
            if r.candidate in results:
                raise ValueError(f"request {rid!r} logs candidate {r.candidate!r} twice")
            results[r.candidate] = r
        out.append(Request(rid, first.stamp, np.asarray(first.features, dtype=np.float64), first.n_cameras,
                           LinkSnapshot(first.bandwidth_mbps, first.rtt_s, first.breaker_open), first.deadline_s,
                           results))
    out.sort(key=lambda q: (q.stamp, q.request_id))
    return out


@dataclass(frozen=True)
class Outcome:
    name: str
    accuracy: float
    cloud_share: float
    latency_mean_s: float
    latency_p95_s: float
    energy_mean_j: float

    @property
    def edge_share(self) -> float:
        return 1.0 - self.cloud_share


def summarize(name: str, chosen: Sequence[LogRecord]) -> Outcome:
    q = np.array([r.quality for r in chosen])
    lat = np.array([r.latency_s for r in chosen])
    en = np.array([r.energy_j for r in chosen])
    cloud = np.array([r.placement == "cloud" for r in chosen])
    return Outcome(name, float(q.mean()), float(cloud.mean()), float(lat.mean()),
                   float(np.percentile(lat, 95)), float(np.nanmean(en)) if np.isfinite(en).any() else math.nan)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1] - 1e-12)])


def random_mixture(edge: Sequence[LogRecord], cloud: Sequence[LogRecord], p: float) -> Outcome:
    """Exact expectation of serving each request on cloud with probability p, else on edge."""
    def mean(attr: str) -> float:
        e = np.array([getattr(r, attr) for r in edge])
        c = np.array([getattr(r, attr) for r in cloud])
        return float((1 - p) * np.mean(e) + p * np.mean(c))
    lat = np.array([r.latency_s for r in edge] + [r.latency_s for r in cloud])
    w = np.array([1 - p] * len(edge) + [p] * len(cloud))
    return Outcome("random", mean("quality"), p, mean("latency_s"), weighted_quantile(lat, w, 0.95),
                   mean("energy_j"))


def oracle_pick(req: Request) -> LogRecord:
    return min(req.results.values(), key=lambda r: (-r.quality, r.placement != "edge", r.latency_s))


def predicted_gain(d) -> float:
    """Best cloud minus best edge predicted quality of a decision (NaN without a cloud candidate)."""
    q = {"edge": -math.inf, "cloud": -math.inf}
    for p in d.predictions:
        q[p.placement] = max(q[p.placement], p.quality)
    return q["cloud"] - q["edge"] if math.isfinite(q["cloud"]) else math.nan


def replay(cfg: RouterConfig, requests: Sequence[Request], delta_min: float | None = None,
           default_deadline_s: float | None = None) -> list[tuple[str, str, float]]:
    """(chosen candidate, reason, predicted cloud gain) per request, from a fresh router."""
    router = Router(cfg)
    if delta_min is not None:
        router.set_thresholds(delta_min=delta_min)
    names = [c.name for c in cfg.candidates]
    out = []
    for req in requests:
        allowed = np.array([n in req.results for n in names])
        deadline = req.deadline_s if math.isfinite(req.deadline_s) else default_deadline_s
        nbytes = {n: r.upload_bytes for n, r in req.results.items()}
        d = router.decide_features(req.features, n_cameras=req.n_cameras, upload_bytes=nbytes,
                                   deadline_s=deadline, now=req.stamp, link=req.link, allowed=allowed)
        out.append((d.candidate, d.reason, predicted_gain(d)))
    return out


def sweep_deltas(gains: Sequence[float], n: int = 21) -> list[float]:
    """delta_min values spanning every cloud share the router can reach: quantiles of the predicted
    gains (each just below), plus one above the largest; clipped to the allowed [-1, 1]."""
    g = np.array([x for x in gains if math.isfinite(x)])
    if not g.size:
        return [0.0]
    qs = np.quantile(g, np.linspace(0.0, 1.0, n)) - 1e-9
    return sorted({float(np.clip(x, -1.0, 1.0)) for x in np.append(qs, g.max() + 1e-6)})


@dataclass(frozen=True)
class EvalReport:
    n_requests: int
    n_skipped: int  # requests lacking a baseline candidate's result
    router: Outcome
    edge_only: Outcome
    cloud_only: Outcome | None
    random: Outcome | None
    oracle: Outcome
    pgr: float
    oracle_gap_recovered: float
    reasons: dict
    delta_min: float
    curve: tuple  # ((delta_min, cloud_share, accuracy), ...) of the router swept over delta_min


def _recovered(x: float, lo: float, hi: float) -> float:
    return (x - lo) / (hi - lo) if abs(hi - lo) > 1e-12 else math.nan


def evaluate(cfg: RouterConfig, records: Sequence[LogRecord], sweep: Sequence[float] | None = None) -> EvalReport:
    edge_name, cloud_name = cfg.edge_only, cfg.cloud_only
    placement = {c.name: c.placement for c in cfg.candidates}
    unknown = sorted({r.candidate for r in records} - set(placement))
    if unknown:
        raise ValueError(f"log names candidates {unknown} that the router config does not have {sorted(placement)}")
    records = [r if r.placement else _with_placement(r, placement[r.candidate]) for r in records]
    all_requests = group(records)
    needed = [edge_name] + ([cloud_name] if cloud_name else [])
    requests = [q for q in all_requests if all(n in q.results for n in needed)]
    if not requests:
        raise ValueError(f"no request in the log has results for the baseline candidates {needed}")
    deadline = cfg.policy.default_deadline_s
    picks = replay(cfg, requests, default_deadline_s=deadline)
    router = summarize("router", [q.results[c] for q, (c, _, _) in zip(requests, picks)])
    edge = [q.results[edge_name] for q in requests]
    edge_only = summarize("edge_only", edge)
    oracle = summarize("oracle", [oracle_pick(q) for q in requests])
    cloud_only = rand = None
    if cloud_name:
        cloud = [q.results[cloud_name] for q in requests]
        cloud_only = summarize("cloud_only", cloud)
        rand = random_mixture(edge, cloud, router.cloud_share)
    reasons: dict[str, int] = {}
    for _, why, _ in picks:
        reasons[why] = reasons.get(why, 0) + 1
    curve = []
    for delta in (sweep_deltas([g for _, _, g in picks]) if sweep is None else sweep):
        ps = replay(cfg, requests, delta_min=float(delta), default_deadline_s=deadline)
        s = summarize("sweep", [q.results[c] for q, (c, _, _) in zip(requests, ps)])
        curve.append((float(delta), s.cloud_share, s.accuracy))
    return EvalReport(
        n_requests=len(requests), n_skipped=len(all_requests) - len(requests), router=router, edge_only=edge_only,
        cloud_only=cloud_only, random=rand, oracle=oracle,
        pgr=_recovered(router.accuracy, edge_only.accuracy, cloud_only.accuracy) if cloud_only else math.nan,
        oracle_gap_recovered=_recovered(router.accuracy, edge_only.accuracy, oracle.accuracy),
        reasons=dict(sorted(reasons.items())), delta_min=cfg.policy.delta_min, curve=tuple(curve))


def _with_placement(r: LogRecord, placement: str) -> LogRecord:
    return replace(r, placement=placement)


def format_report(rep: EvalReport) -> str:
    lines = [f"requests: {rep.n_requests} evaluated, {rep.n_skipped} skipped (no baseline result)",
             f"{'policy':<11} {'accuracy':>9} {'edge%':>7} {'lat_mean':>9} {'lat_p95':>9} {'energy':>8}"]
    for o in (rep.router, rep.edge_only, rep.cloud_only, rep.random, rep.oracle):
        if o is not None:
            lines.append(f"{o.name:<11} {o.accuracy:>9.4f} {100 * o.edge_share:>6.1f}% {o.latency_mean_s:>8.3f}s "
                         f"{o.latency_p95_s:>8.3f}s {o.energy_mean_j:>7.2f}J")
    lines.append(f"performance gap recovered (vs cloud-only): {rep.pgr:.3f}; vs oracle: {rep.oracle_gap_recovered:.3f}")
    lines.append(f"delta_min {rep.delta_min}; reasons: " + ", ".join(f"{k}={v}" for k, v in rep.reasons.items()))
    return "\n".join(lines)


def plot(rep: EvalReport, path: str) -> None:
    """PNG of accuracy versus cloud share: the router over its delta_min sweep and the baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    pts = sorted(rep.curve, key=lambda t: t[1])
    ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", ms=3, label="router (delta_min sweep)")
    if rep.cloud_only is not None:
        ax.plot([0, 1], [rep.edge_only.accuracy, rep.cloud_only.accuracy], "--", color="grey", label="random")
        ax.plot([1], [rep.cloud_only.accuracy], "s", label="cloud-only")
    ax.plot([0], [rep.edge_only.accuracy], "s", label="edge-only")
    ax.plot([rep.oracle.cloud_share], [rep.oracle.accuracy], "*", ms=10, label="oracle")
    ax.plot([rep.router.cloud_share], [rep.router.accuracy], "D", label=f"router (delta_min={rep.delta_min:g})")
    ax.set_xlabel("cloud share")
    ax.set_ylabel("accuracy (mean observed quality)")
    ax.set_xlim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)

"""Routing judged by task success: edge-only, cloud-only, the router, random offload and the oracle on the
same episodes (``edgefm-sim route-eval``), and the shadow runs that calibrate the router (``edgefm-sim shadow``).

    cfg = RouteEvalConfig(edge="checkpoints/smolvla-edge", cloud="checkpoints/smolvla-cloud",
                          router="config/router_sim.yaml", tasks=("reach",), seeds=(1000, 1001))
    report = run_route_eval(cfg)          # the JSON contract below
    print(format_route_table(report))

Placements (every one on the same tasks, seeds, camera conditions and instructions):

- ``edge`` / ``cloud``: every chunk from that tier (sim.tiers.EngineTier);
- ``router``: the Router decides each request (RouterTier), at its configured ``delta_min``; the sweep over
  ``delta_sweep`` gives its success-against-offload curve;
- ``random``: each request to the cloud with the router's measured offload probability (RandomTier);
- ``oracle``: per episode, the edge's run where edge-only succeeded, else the cloud's where cloud-only did (no
  run of its own: the best a per-episode choice could do).

JSON: ``placements.<name>`` holds ``success_rate``, ``offload_rate`` (share of chunks the cloud served),
``upload_mb`` (all episodes), ``upload_mb_per_episode``, ``chunk_latency_ms`` {p50, p95} (observation to chunk
at the robot, simulated), ``episodes`` and ``by_condition`` / ``by_task`` breakdowns; top level ``pgr`` =
(router - edge) / (cloud - edge), ``sweep`` (the router's curve), ``random_line``, ``settings`` (the latencies
charged, measured on this machine unless given).

Clock (``exec: async``): the graph's queue and chunk requests on the simulated clock (sim.async_loop); each
chunk arrives after its tier's compute time (measured here at start: the median of a few chunks) plus, for
the cloud, the round trip and the JPEG upload at the link's rate.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from edgefm_ros.routing.config import RouterConfig, load_router_config
from edgefm_ros.routing.features import extract_features, feature_names
from edgefm_ros.routing.log import LogRecord
from edgefm_ros.routing.router import Router
from edgefm_ros.runtime.engine import Engine
from edgefm_ros.sim.async_loop import run_served_episode
from edgefm_ros.sim.conditions import CONDITION_SETS
from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.rollout import checkpoint_settings
from edgefm_ros.sim.tasks import CALIBRATION_SEEDS, get_task
from edgefm_ros.sim.tiers import EngineTier, EpisodeServing, Link, RandomTier, RouterTier, chunk_spread, \
    measure_compute_s

PLACEMENTS = ("edge", "cloud", "router", "random", "oracle")
AGGREGATES = ("rtc", "weighted_average", "latest_only", "average", "conservative")


@dataclass(frozen=True)
class RouteEvalConfig:
    edge: str
    cloud: str
    router: str
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    conditions: str = "mixed"
    phrasings: str = "varied"
    link: Link = Link()
    aggregate: str = "rtc"
    threshold: float = 0.8  # replan after about a fifth of a chunk (the policies' n_action_steps 10 of 50)
    edge_compute_ms: float | None = None  # None: measured here
    cloud_compute_ms: float | None = None
    cloud_delay_ms: float = 0.0  # added to every cloud answer (a slow server or proxy)
    placements: tuple[str, ...] = PLACEMENTS
    delta_sweep: tuple[float, ...] = (-0.2, -0.1, 0.0, 0.05, 0.1, 0.2, 0.4)
    image_hw: tuple[int, int] | None = None  # None: the larger of the two checkpoints' input sizes

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("RouteEvalConfig.tasks must name at least one task")
        for t in self.tasks:
            get_task(t)  # ValueError naming an unknown task
        if not self.seeds:
            raise ValueError("RouteEvalConfig.seeds must hold at least one seed")
        if self.conditions not in CONDITION_SETS:
            raise ValueError(f"conditions must be one of {sorted(CONDITION_SETS)}, got {self.conditions!r}")
        bad = [p for p in self.placements if p not in PLACEMENTS]
        if bad or not self.placements:
            raise ValueError(f"placements must be among {PLACEMENTS}, got {list(self.placements)}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        for name in ("edge_compute_ms", "cloud_compute_ms"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if not (math.isfinite(self.cloud_delay_ms) and self.cloud_delay_ms >= 0):
            raise ValueError(f"cloud_delay_ms must be a finite number >= 0, got {self.cloud_delay_ms!r}")
        if not all(math.isfinite(d) and -1 <= d <= 1 for d in self.delta_sweep):
            raise ValueError(f"delta_sweep values must lie in [-1, 1], got {list(self.delta_sweep)}")


@dataclass
class RoutedEpisode:
    task: str
    seed: int
    condition: str
    instruction: str
    success: bool
    serving: EpisodeServing = field(default_factory=EpisodeServing)

    def summary(self) -> dict:
        s = self.serving
        return {"task": self.task, "seed": self.seed, "condition": self.condition, "instruction": self.instruction,
                "success": self.success, "chunks": len(s.placements),
                "cloud_chunks": sum(p == "cloud" for p in s.placements), "switches": switches(s.placements),
                "upload_bytes": int(sum(s.upload_bytes)),
                "reasons": sorted(set(r for r in s.reasons if r))}


# ---------------------------------------------------------------------------------------------
# the tiers of one evaluation


@dataclass
class Setup:
    """Both engines, their tiers and the router, with the latencies charged (ms)."""

    edge: EngineTier
    cloud: EngineTier
    router_cfg: RouterConfig
    sim: SimConfig
    edge_ms: float
    cloud_ms: float
    decision_ms: float


def _probe_images(sim: SimConfig, task: str, seed: int) -> tuple[dict, np.ndarray]:
    with SimEnv(sim) as env:
        env.reset(task, seed)
        images = {f"observation.images.{c}": img for c, img in env.render().items()}
        return images, env.state().astype(np.float32)


def build_setup(cfg: RouteEvalConfig, log: Callable[[str], None] = print) -> Setup:
    es, cs = checkpoint_settings(cfg.edge), checkpoint_settings(cfg.cloud)
    if es["cameras"] != cs["cameras"]:
        raise ValueError(f"edge cameras {list(es['cameras'])} and cloud cameras {list(cs['cameras'])} differ")
    hw = cfg.image_hw or max(es["image_hw"], cs["image_hw"])
    sim = SimConfig(image_hw=tuple(hw), cameras=es["cameras"])
    router_cfg = load_router_config(cfg.router)
    edge_eng, cloud_eng = Engine.from_checkpoint(cfg.edge), Engine.from_checkpoint(cfg.cloud)
    images, state = _probe_images(sim, cfg.tasks[0], cfg.seeds[0])
    text = get_task(cfg.tasks[0]).instruction
    edge_ms = cfg.edge_compute_ms if cfg.edge_compute_ms is not None else \
        1e3 * measure_compute_s(edge_eng, images, state, text)
    cloud_ms = cfg.cloud_compute_ms if cfg.cloud_compute_ms is not None else \
        1e3 * measure_compute_s(cloud_eng, images, state, text)
    router = Router(router_cfg)
    t = []
    for _ in range(20):
        t0 = time.perf_counter()
        extract_features(images, text, router_cfg.features,
                         {n: 0.0 for n in router_cfg.features.signals})
        t.append(time.perf_counter() - t0)
    decision_ms = 1e3 * float(np.median(t))
    cloud_c = router_cfg.candidate(router_cfg.cloud_only) if router_cfg.cloud_only else None
    jpeg = cloud_c.jpeg_quality if cloud_c is not None else 90
    edge = EngineTier("edge", edge_eng, edge_ms / 1e3)
    cloud = EngineTier("cloud", cloud_eng, cloud_ms / 1e3, link=cfg.link, jpeg_quality=jpeg,
                       extra_delay_s=cfg.cloud_delay_ms / 1e3)
    log(f"[route-eval] cameras {hw[0]}x{hw[1]}; compute per chunk: edge {edge_ms:.1f} ms, cloud {cloud_ms:.1f} ms"
        f" (+{cfg.cloud_delay_ms:.0f} ms), router features {decision_ms:.2f} ms; link {cfg.link.mbps:g} Mbit/s, "
        f"RTT {cfg.link.rtt_ms:g} ms")
    return Setup(edge, cloud, router_cfg, sim, edge_ms, cloud_ms, decision_ms)


def run_placement(setup: Setup, tier, cfg: RouteEvalConfig, name: str, log: Callable[[str], None] = print,
                  on_request=None) -> list[RoutedEpisode]:
    out = []
    t0 = time.perf_counter()
    total = len(cfg.tasks) * len(cfg.seeds)
    with SimEnv(setup.sim) as env:
        for i, (seed, task) in enumerate((s, t) for s in cfg.seeds for t in cfg.tasks):
            serving = EpisodeServing()
            r = run_served_episode(env, tier, task, seed, aggregate=cfg.aggregate, threshold=cfg.threshold,
                                   cameras=setup.sim.cameras, conditions=cfg.conditions, phrasings=cfg.phrasings,
                                   serving=serving, on_request=on_request)
            ep = RoutedEpisode(task, int(seed), r.condition, r.instruction, r.success, serving)
            out.append(ep)
            if (i + 1) % 10 == 0 or i + 1 == total:
                done = sum(e.success for e in out)
                cloud = sum(p == "cloud" for e in out for p in e.serving.placements)
                chunks = sum(len(e.serving.placements) for e in out)
                log(f"[route-eval {name}] {i + 1}/{total} episodes: {done} succeeded, "
                    f"{cloud}/{chunks} chunks in the cloud ({time.perf_counter() - t0:.0f} s)")
    return out


# ---------------------------------------------------------------------------------------------
# summaries


def switches(placements: Sequence[str]) -> int:
    """How often an episode's consecutive chunks changed placement (edge <-> cloud)."""
    return sum(a != b for a, b in zip(placements, placements[1:]))


def _rate(num: float, den: float) -> float | None:
    return None if den == 0 else float(num) / float(den)


def summarize(episodes: Sequence[RoutedEpisode]) -> dict:
    """The JSON of one placement (module docstring)."""
    place = [p for e in episodes for p in e.serving.placements]
    lat = np.array([x for e in episodes for x in e.serving.latency_s], dtype=np.float64) * 1e3
    up = sum(sum(e.serving.upload_bytes) for e in episodes) / 1e6

    def part(eps: Sequence[RoutedEpisode]) -> dict:
        pl = [p for e in eps for p in e.serving.placements]
        return {"episodes": len(eps), "successes": int(sum(e.success for e in eps)),
                "success_rate": _rate(sum(e.success for e in eps), len(eps)),
                "offload_rate": _rate(sum(p == "cloud" for p in pl), len(pl))}

    def by(key: str) -> dict:
        groups: dict[str, list] = {}
        for e in episodes:
            groups.setdefault(getattr(e, key), []).append(e)
        return {k: part(v) for k, v in sorted(groups.items())}

    return {**part(episodes), "upload_mb": round(up, 4),
            "upload_mb_per_episode": round(up / len(episodes), 5) if episodes else None,
            "chunk_latency_ms": {"p50": float(np.percentile(lat, 50)) if lat.size else None,
                                 "p95": float(np.percentile(lat, 95)) if lat.size else None},
            "chunks": len(place),
            "switches_per_episode": _rate(sum(switches(e.serving.placements) for e in episodes), len(episodes)),
            "by_condition": by("condition"), "by_task": by("task")}


def oracle(edge: Sequence[RoutedEpisode], cloud: Sequence[RoutedEpisode]) -> list[RoutedEpisode]:
    """Per episode the edge's run where it succeeded, else the cloud's (its success or not)."""
    by_cloud = {(e.task, e.seed): e for e in cloud}
    out = []
    for e in edge:
        c = by_cloud.get((e.task, e.seed))
        if c is None:
            raise ValueError(f"oracle: the cloud has no episode {e.task}:{e.seed}")
        out.append(e if e.success or not c.success else c)
    return out


def pgr(router: float | None, edge: float | None, cloud: float | None) -> float | None:
    """Performance gap recovered: (router - edge) / (cloud - edge); None when the gap is 0 or unknown."""
    if router is None or edge is None or cloud is None or cloud == edge:
        return None
    return (router - edge) / (cloud - edge)


def run_route_eval(cfg: RouteEvalConfig, log: Callable[[str], None] = print) -> dict:
    setup = build_setup(cfg, log)
    want = set(cfg.placements)
    runs: dict[str, list[RoutedEpisode]] = {}
    if want & {"edge", "oracle"}:
        runs["edge"] = run_placement(setup, setup.edge, cfg, "edge", log)
    if want & {"cloud", "oracle"}:
        runs["cloud"] = run_placement(setup, setup.cloud, cfg, "cloud", log)
    router_tier = RouterTier(Router(setup.router_cfg), setup.edge, setup.cloud, decision_s=setup.decision_ms / 1e3)
    sweep = []
    if want & {"router", "random"}:
        runs["router"] = run_placement(setup, router_tier, cfg, "router", log)
        for d in cfg.delta_sweep:
            router_tier.router.set_thresholds(delta_min=d)
            eps = runs["router"] if d == setup.router_cfg.policy.delta_min else \
                run_placement(setup, router_tier, cfg, f"router delta_min={d:g}", log)
            s = summarize(eps)
            sweep.append({"delta_min": d, "success_rate": s["success_rate"], "offload_rate": s["offload_rate"],
                          "upload_mb": s["upload_mb"], "switches_per_episode": s["switches_per_episode"]})
        router_tier.router.set_thresholds(delta_min=setup.router_cfg.policy.delta_min)
    random_line = []
    offload = summarize(runs["router"])["offload_rate"] if "router" in runs else None
    if "random" in want:
        p = offload or 0.0
        runs["random"] = run_placement(setup, RandomTier(p, setup.edge, setup.cloud), cfg, f"random p={p:.2f}", log)
        for q in (0.25, 0.5, 0.75):
            s = summarize(run_placement(setup, RandomTier(q, setup.edge, setup.cloud), cfg, f"random p={q}", log))
            random_line.append({"p": q, "success_rate": s["success_rate"], "offload_rate": s["offload_rate"]})
    if "oracle" in want:
        runs["oracle"] = oracle(runs["edge"], runs["cloud"])
    placements = {name: summarize(runs[name]) for name in PLACEMENTS if name in want}
    sr = {n: placements.get(n, {}).get("success_rate") for n in ("router", "edge", "cloud")}
    if "random" in want:
        placements["random"]["p"] = offload
    return {
        "exec": "async", "pgr": pgr(sr["router"], sr["edge"], sr["cloud"]),
        "placements": placements, "sweep": sweep, "random_line": random_line,
        "episodes": {name: [e.summary() for e in runs[name]] for name in runs if name in want},
        "settings": {"edge": cfg.edge, "cloud": cfg.cloud, "router": cfg.router, "tasks": list(cfg.tasks),
                     "seeds": list(cfg.seeds), "conditions": cfg.conditions, "phrasings": cfg.phrasings,
                     "link": {"mbps": cfg.link.mbps, "rtt_ms": cfg.link.rtt_ms}, "aggregate": cfg.aggregate,
                     "chunk_size_threshold": cfg.threshold, "image_hw": list(setup.sim.image_hw),
                     "edge_compute_ms": round(setup.edge_ms, 2), "cloud_compute_ms": round(setup.cloud_ms, 2),
                     "cloud_delay_ms": cfg.cloud_delay_ms, "router_features_ms": round(setup.decision_ms, 3),
                     "delta_min": setup.router_cfg.policy.delta_min,
                     "cloud_hysteresis": setup.router_cfg.policy.cloud_hysteresis, "delta_sweep": list(cfg.delta_sweep),
                     "clock": "simulated: chunks arrive their tier's latency after the observation"},
    }


def format_route_table(report: dict) -> str:
    rows = [f"{'placement':<9} {'success':>8} {'offload':>8} {'upload MB':>10} {'p50 ms':>8} {'p95 ms':>8} "
            f"{'episodes':>8} {'switches':>8}"]
    for name, p in report["placements"].items():
        lat = p["chunk_latency_ms"]
        up = "-" if p["upload_mb"] is None else f"{p['upload_mb']:.2f}"
        rows.append(f"{name:<9} {_pct(p['success_rate']):>8} {_pct(p['offload_rate']):>8} {up:>10} "
                    f"{_num(lat['p50']):>8} {_num(lat['p95']):>8} {p['episodes']:>8} "
                    f"{_num2(p.get('switches_per_episode')):>8}")
    g = report.get("pgr")
    rows.append(f"PGR (router - edge) / (cloud - edge): {'n/a' if g is None else f'{g:.2f}'}")
    conds = sorted({c for p in report["placements"].values() for c in p["by_condition"]})
    if conds:
        rows.append("success by condition: " + "; ".join(
            f"{c}: " + " ".join(f"{n} {_pct(p['by_condition'].get(c, {}).get('success_rate'))}"
                                for n, p in report["placements"].items()) for c in conds))
    return "\n".join(rows)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _num2(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# ---------------------------------------------------------------------------------------------
# shadow runs on the calibration seeds: features and outcome of every request, per candidate


def shadow_features(setup: Setup, spread_rng_seed: int = 0):
    """An ``on_request`` for run_served_episode: the router's features of each request, with ``edge_spread``
    measured by two extra edge draws from a generator of its own (the served chunks do not change)."""
    feats_cfg = setup.router_cfg.features
    rng = np.random.default_rng(spread_rng_seed)

    def on_request(images, state, instruction, now, rtc):
        signals = {}
        if "edge_spread" in feats_cfg.signals:
            a = setup.edge.predict(images, state, instruction, rng, now, rtc, 1.0 / setup.sim.control_hz)
            b = setup.edge.predict(images, state, instruction, rng, now, rtc, 1.0 / setup.sim.control_hz)
            signals["edge_spread"] = chunk_spread(a, b)
        return tuple(float(x) for x in extract_features(images, instruction, feats_cfg, signals))

    return on_request


def run_shadow(cfg: RouteEvalConfig, out: str | Path, log: Callable[[str], None] = print,
               edge_spread: bool = False) -> dict:
    """Edge-only and cloud-only on ``cfg.seeds`` (calibration seeds only), logging each request's features and
    the candidate's outcome (quality = the episode's success under it) to a JSON Lines request log;
    ``edge_spread``: also the edge's spread (for a router that uses it, or an ablation)."""
    leaked = [s for s in cfg.seeds if s not in CALIBRATION_SEEDS]
    if leaked:
        raise ValueError(f"shadow runs calibrate the router on CALIBRATION_SEEDS ({CALIBRATION_SEEDS.start}-"
                         f"{CALIBRATION_SEEDS.stop - 1}); seeds {leaked[:5]} are outside it")
    setup = build_setup(cfg, log)
    if edge_spread and "edge_spread" not in setup.router_cfg.features.signals:
        feats = replace(setup.router_cfg.features, signals=setup.router_cfg.features.signals + ("edge_spread",))
        setup.router_cfg = replace(setup.router_cfg, features=feats)
    names = feature_names(setup.router_cfg.features)
    cands = {"edge": setup.router_cfg.edge_only, "cloud": setup.router_cfg.cloud_only}
    if cands["cloud"] is None:
        raise ValueError(f"router config {cfg.router} has no cloud candidate to calibrate")
    counts = {}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for placement, tier in (("edge", setup.edge), ("cloud", setup.cloud)):
            eps = run_placement(setup, tier, cfg, f"shadow {placement}", log, on_request=shadow_features(setup))
            for e in eps:
                s = e.serving
                for k, (feats, lat, nbytes) in enumerate(zip(s.features, s.latency_s, s.upload_bytes)):
                    rec = LogRecord(request_id=f"{e.task}:{e.seed}", candidate=cands[placement], features=feats,
                                    feature_names=names, quality=float(e.success), latency_s=float(lat),
                                    placement=placement, stamp=float(k), upload_bytes=int(nbytes),
                                    bandwidth_mbps=cfg.link.mbps, rtt_s=cfg.link.rtt_ms / 1e3,
                                    source=f"sim-shadow {e.condition} {e.task}")
                    f.write(rec.to_json() + "\n")
            counts[placement] = {"episodes": len(eps), "successes": int(sum(e.success for e in eps)),
                                 "requests": int(sum(len(e.serving.placements) for e in eps))}
    log(f"[shadow] wrote {out}: " + ", ".join(f"{p} {c['successes']}/{c['episodes']} episodes, {c['requests']} "
                                               f"requests" for p, c in counts.items()))
    return counts


def write_json(report: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=1, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


__all__ = ["PLACEMENTS", "RouteEvalConfig", "RoutedEpisode", "build_setup", "format_route_table", "oracle", "pgr",
           "run_placement", "run_route_eval", "run_shadow", "summarize", "write_json"]

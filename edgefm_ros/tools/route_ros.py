"""``edgefm-sim route-eval --exec ros``: routing through the real nodes and a real cloud server on loopback.

Placements through the graph (sim_node with the run's camera conditions and instructions, vla_node, action_node):

- ``edge``: vla_node runs the edge checkpoint, no router, no cloud;
- ``router``: router_node decides each request with the given router configuration (it cannot measure caller
  signals such as ``edge_spread``: give it a configuration without them), and vla_node follows its decision
  (``use_route``) to ``edgefm-cloud serve`` on loopback, serving the cloud checkpoint behind nginx with a
  bearer token, falling back to the edge on a missed deadline or a failure (``edge-fallback``).

The link is shaped: vla_node reaches the server through a delaying TCP proxy (cloud/delay_proxy.py) that
holds each direction's bytes for half the link's round trip and paces each direction at its rate, on top of
loopback's ~0.1 ms; router_node is told the same link (``static_bandwidth_mbps`` / ``static_rtt_s``). On
request (``impair``) the proxy adds jitter, TCP-like loss recovery and a handshake round trip per new
connection; the router is not told of those. The router placement's ``upload_mb`` is the proxy's count of bytes
sent to the server during the run (requests with their headers, health checks, and requests whose chunk
arrived outside an episode): exact for the placement, not per episode. Per chunk that asked the cloud (arrived
from it, or fell back to the edge) the episodes carry that total's average, an estimate. Per episode, the chunks
that arrived in it say where each was computed (the ActionChunk's ``source``), so the report has the same
contract as ``--exec async``'s (sim.route_eval).
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edgefm_ros.cloud.client.base import TOKEN_ENV
from edgefm_ros.cloud.delay_proxy import DelayProxy, LinkShape
from edgefm_ros.sim.rollout import checkpoint_settings
from edgefm_ros.sim.route_eval import RouteEvalConfig, RoutedEpisode, pgr, summarize
from edgefm_ros.sim.tiers import EpisodeServing
from edgefm_ros.tools.cloud_outage import CloudOutage, OutageRun, outage_report, slack_s
from edgefm_ros.tools.graph import LoopbackCloud
from edgefm_ros.tools.sim_ros import episode_windows, run_ros

ROS_PLACEMENTS = ("edge", "router")


def routed_params(cfg: RouteEvalConfig, router_yaml: str, url: str | None) -> dict:
    """The nodes' parameters on top of config/sim.yaml for one placement (url None: the edge alone)."""
    hw = cfg.image_hw or max(checkpoint_settings(cfg.edge)["image_hw"], checkpoint_settings(cfg.cloud)["image_hw"])
    extra = {"sim_node": {"conditions": cfg.conditions, "phrasings": cfg.phrasings, "image_height": int(hw[0]),
                          "image_width": int(hw[1])},
             "action_node": {"chunk_size_threshold": float(cfg.threshold)},
             "vla_node": {"use_route": url is not None, "cloud_url": url or ""}}
    if url is not None:
        extra["vla_node"]["cloud_deadline_s"] = 1.0
        extra["router_node"] = {"config_path": str(Path(router_yaml).resolve()), "rate_hz": 10.0,
                                "static_bandwidth_mbps": float(cfg.link.mbps),
                                "static_rtt_s": float(cfg.link.rtt_ms) / 1e3, "probe_period_s": 0.0}
    return extra


def episodes_of(run, events, upload_per_request: float = 0.0) -> list[RoutedEpisode]:
    """Per finished episode: its outcome and the chunks that arrived in it (source, observation -> chunk);
    ``upload_per_request``: the bytes charged to each chunk that asked the cloud (module docstring)."""
    recv = np.asarray(run.chunk_recv, dtype=np.float64)
    stamp = np.asarray(run.chunk_stamp, dtype=np.float64)
    source = list(run.chunk_source)
    latency = np.asarray(run.chunk_inference, dtype=np.float64)
    starts = {(e["task"], int(e["seed"])): e for e in events if e.get("event") == "start"}
    out = []
    for w in episode_windows(events):
        s = EpisodeServing()
        for i in np.flatnonzero((recv >= w.start) & (recv <= w.end) & (stamp >= w.start)):
            s.placements.append("cloud" if source[i] == "cloud" else "edge")
            s.latency_s.append(float(latency[i]))
            s.upload_bytes.append(round(upload_per_request) if source[i] in ("cloud", "edge-fallback") else 0)
            s.reasons.append(source[i])
            s.features.append(())
        start = starts.get((w.task, w.seed), {})
        out.append(RoutedEpisode(w.task, w.seed, str(start.get("condition", "")), str(start.get("instruction", "")),
                                 w.outcome == "success", s))
    return out


def run_route_ros(cfg: RouteEvalConfig, *, out_dir: str | Path | None = None, domain_id: int | None = None,
                  progress: Callable[[str], None] = print, fault: CloudOutage | None = None,
                  impair: dict | None = None) -> dict:
    """The ``edge`` and ``router`` placements of ``cfg`` through the graph; the route-eval report. ``fault``: the
    cloud server killed and restarted, or frozen and let go on, during the router placement's run
    (tools/cloud_outage.py; the report's ``fault``). ``impair``: the proxy's jitter_ms, loss and handshake
    (cloud/delay_proxy.LinkShape) on top of the link's rate and round trip; the router is told only those."""
    shape = LinkShape(cfg.link.rtt_ms, cfg.link.mbps, **(impair or {}))  # ValueError naming a bad value first
    bad = [p for p in cfg.placements if p not in ROS_PLACEMENTS]
    if bad:
        raise ValueError(f"--exec ros runs the placements {list(ROS_PLACEMENTS)}; {bad} run with --exec async")
    episodes = [f"{t}:{s}" for s in cfg.seeds for t in cfg.tasks]
    runs: dict[str, list[RoutedEpisode]] = {}
    uploads: dict[str, int] = {}  # bytes the proxy forwarded to the server, per placement
    lost: dict[str, int] = {}  # chunks the proxy held back a retransmission timeout, per placement
    fault_report = None
    with contextlib.ExitStack() as stack:
        out = Path(out_dir) if out_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="edgefm-route-ros-")))
        for name in cfg.placements:
            t0 = time.perf_counter()
            url, env, proxy = None, None, None
            if name == "router":
                cloud = stack.enter_context(LoopbackCloud(cfg.cloud, out / "cloud.log", progress=progress))
                url, token = cloud.url, cloud.token
                env = {"vla_node": {TOKEN_ENV: token}}
                proxy = stack.enter_context(DelayProxy(url, shape))
                url = proxy.url  # vla_node's requests cross the link's round trip and rate
            with (OutageRun(cloud, fault, out / name / "episodes.jsonl", progress) if fault and name == "router"
                  else contextlib.nullcontext()) as outage:
                r = run_ros(cfg.edge, episodes, out_dir=out / name, aggregate=cfg.aggregate, progress=progress,
                            domain_id=domain_id, extra=routed_params(cfg, cfg.router, url), node_env=env)
            if outage is not None:
                fault_report = outage_report(outage.times(), r.run, episode_windows(r.events),
                                             slack_s(cfg.threshold, r.run, r.report["control_hz"]))
            counts = proxy.counts() if proxy is not None else None
            uploads[name] = counts.up if counts is not None else 0
            if counts is not None and counts.lost:
                lost[name] = counts.lost
            asked = sum(src in ("cloud", "edge-fallback") for src in r.run.chunk_source)
            runs[name] = episodes_of(r.run, r.events, uploads[name] / asked if asked else 0.0)
            progress(f"[route-eval ros {name}] {sum(e.success for e in runs[name])}/{len(runs[name])} succeeded, "
                     f"{sum(p == 'cloud' for e in runs[name] for p in e.serving.placements)} chunks in the cloud "
                     f"({time.perf_counter() - t0:.0f} s)")
    placements = {n: summarize(runs[n]) for n in cfg.placements}
    for n in placements:
        placements[n]["upload_mb"] = round(uploads[n] / 1e6, 4)  # the proxy's count (module docstring)
        if n in lost:
            placements[n]["link_chunks_lost"] = lost[n]
        placements[n]["upload_mb_per_episode"] = round(uploads[n] / 1e6 / len(runs[n]), 5) if runs[n] else None
        placements[n]["sources"] = {src: sum(r == src for e in runs[n] for r in e.serving.reasons)
                                    for src in ("edge", "cloud", "edge-fallback")}
    return {"exec": "ros", "placements": placements, **({"fault": fault_report} if fault else {}),
            "pgr": pgr(placements.get("router", {}).get("success_rate"),
                       placements.get("edge", {}).get("success_rate"), None),
            "episodes": {n: [e.summary() for e in runs[n]] for n in runs},
            "settings": {"edge": cfg.edge, "cloud": cfg.cloud, "router": cfg.router, "tasks": list(cfg.tasks),
                         "seeds": list(cfg.seeds), "conditions": cfg.conditions, "phrasings": cfg.phrasings,
                         "link": {"mbps": cfg.link.mbps, "rtt_ms": cfg.link.rtt_ms, "jitter_ms": shape.jitter_ms,
                                  "loss": shape.loss, "handshake": shape.handshake,
                                  "note": "rate and RTT told to the router; all shaped by a delaying proxy"},
                         "aggregate": cfg.aggregate, "chunk_size_threshold": cfg.threshold,
                         "clock": "wall: the real nodes over DDS, the real cloud server on loopback"}}

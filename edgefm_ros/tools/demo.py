"""edgefm-demo: the whole system end to end on this machine, as one of two subcommands.

    edgefm-demo sim [--checkpoint DIR] [--tasks T1,T2] [--seeds A-B] [--out DIR] [--delay-ms N] [--no-video]
        the simulated arm doing tasks in a closed loop through the node graph (tools/sim_demo.py)
    edgefm-demo bag [BAG] [--checkpoint DIR] [--cloud [--shadow F]] [--out DIR] ...
        the node graph on a replayed bag (below)

``edgefm-demo bag [BAG]``:

1. the model: ``--checkpoint`` if given, else the demo checkpoint (``edgefm-vla make-checkpoint``: SmolVLA's
   architecture with deterministic RANDOM weights) made once into a cache dir, else the tiny reference
   checkpoint of ../shared; the summary says which, and whether its weights are random;
2. the bag: ``--bag`` if given, else a synthetic one (``edgefm-bag make``);
3. with ``--cloud``: the cloud tier (``edgefm-cloud serve``: MLServer + nginx) on this machine's loopback
   with the same checkpoint in exact mode and a random bearer token (given to vla_node only, through
   $EDGEFM_CLOUD_TOKEN in its environment); router_node then routes with config/router_demo.yaml over
   a static link, so the long instruction of the bag goes to the cloud and the short one stays on the
   edge; ``--shadow F`` also turns on vla_node's shadow mode (log in the output dir);
4. vla_node, action_node (and router_node when installed) started with a params file, by ``ros2 launch
   edgefm_ros edgefm.launch.py`` where it is installed, else as processes (--cloud: as processes);
5. the bag replayed into them, their outputs recorded;
6. a summary (chunks by source, routes, control rate and jitter, inference latency, the cloud's
   round trip) and a plot (PNG) of the commanded joint trajectories and the latency over time.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.routing.log import read_log
from edgefm_ros.tools import sim_demo
from edgefm_ros.tools.bag.analyze import command_timing, percentiles, read_run
from edgefm_ros.tools.bag.make import MakeConfig, make_bag
from edgefm_ros.tools.graph import (COMMAND_TOPIC, OUTPUT_TOPICS, Cloud, Model, ReplaySession, choose_model,
                                    loopback_cloud, model_spec, node_params, router_available)

SOURCES = ("cloud", "edge", "edge-fallback")


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def cloud_summary(run, cloud: Cloud, v: dict) -> dict:
    """Where the cloud ran, its round trip as vla_node measured it, the client's counters, shadow log."""
    src, inf = np.asarray(run.chunk_source), np.asarray(run.chunk_inference) * 1e3
    out = {"url": cloud.url, "where": "this machine, loopback only (MLServer 1.7.1 + nginx; edgefm-cloud serve)",
           "mode": "exact", "log": cloud.log,
           "round_trip_ms": {k: _float(v.get(f"cloud_call_ms_{k}")) for k in ("p50", "p99", "max")},
           "observation_to_chunk_ms": {s: percentiles(inf[src == s]) for s in SOURCES if np.any(src == s)},
           "client": {k[len("cloud_"):]: val for k, val in v.items()
                      if k.startswith("cloud_") and not k.startswith("cloud_call_")}}
    if cloud.shadow_log:
        out["shadow"] = shadow_summary(cloud.shadow_log)
    return out


def shadow_summary(path: str) -> dict:
    if not Path(path).is_file():
        return {"log": path, "requests": 0}
    recs = read_log(path)
    edge_q = [r.quality for r in recs if r.placement == "edge"]
    return {"log": path, "requests": len({r.request_id for r in recs}), "lines": len(recs),
            "edge_quality_mean": float(np.mean(edge_q)) if edge_q else float("nan")}


def summarize(run, model: Model, params: dict, diag: dict, t_play: tuple[float, float],
              cloud: Cloud | None = None) -> dict:
    period = 1.0 / params["action_node"]["control_rate_hz"]
    t0 = (run.chunk_recv[0] + 0.5) if run.chunk_recv else t_play[0]
    timing = command_timing(run, period, t0, t_play[1])
    t, holding = np.asarray(run.status_time), np.asarray(run.status_holding)
    window = (t > t0) & (t < t_play[1])
    a = diag.get("action_node", {})
    v = diag.get("vla_node", {})
    sources = {s: run.chunk_source.count(s) for s in SOURCES if cloud is not None or s in run.chunk_source}
    out = {
        "model": {"checkpoint": model.checkpoint, "origin": model.origin, "random_weights": model.random_weights},
        "chunks": len(run.chunk_seq), "chunk_sources": sources,
        "routes": dict(run.routes),
        "commands": int(timing["commands"]), "control_rate_hz": timing["rate_hz"],
        "period_error_ms": {"p50": timing["err_p50_ms"], "p99": timing["err_p99_ms"], "max": timing["err_max_ms"]},
        # from the record: periods without a command, commands under half a period after the last; from the
        # loop itself: deadlines it skipped (a record gap the loop did not count was lost on the way)
        "missed_ticks": timing["missed"], "early_commands": timing["early"], "stalls": timing["stalls"],
        "loop_missed_ticks": _float(a.get("missed_ticks")), "realtime": a.get("realtime") == "true",
        "queue_empty_ticks_after_warmup": int(holding[window].sum()), "status_ticks_after_warmup": int(window.sum()),
        "observation_to_chunk_ms": percentiles(np.asarray(run.chunk_inference) * 1e3),
        "prefill_ms": percentiles(np.asarray(run.chunk_prefill) * 1e3),
        "decode_ms": percentiles(np.asarray(run.chunk_decode) * 1e3),
        "frame_to_action_ms": {k: a.get(f"frame_to_action_ms_{k}") for k in ("p50", "p99")},
        "refused_observations": v.get("refused"), "vla_node": v.get("message"), "action_node": a.get("message"),
        "router_node": diag.get("router_node", {}).get("message"),
    }
    if cloud is not None:
        out["cloud"] = cloud_summary(run, cloud, v)
    return out


def print_summary(s: dict) -> None:
    m = s["model"]
    print("\n=== edgefm demo ===")
    print(f"model      : {m['checkpoint']}\n             {m['origin']}"
          + ("\n             RANDOM WEIGHTS: the actions are meaningless; the computation is SmolVLA's" if
             m["random_weights"] else ""))
    print(f"chunks     : {s['chunks']}  sources {s['chunk_sources']}  routes {s['routes'] or '(no router: edge)'}")
    print(f"control    : {s['commands']} commands at {s['control_rate_hz']:.2f} Hz, |period error| "
          f"p50 {s['period_error_ms']['p50']:.3f} ms  p99 {s['period_error_ms']['p99']:.3f} ms  "
          f"max {s['period_error_ms']['max']:.3f} ms, missed {s['missed_ticks']:.0f} (the loop counted "
          f"{s['loop_missed_ticks']:.0f}), early {s['early_commands']:.0f}, "
          f"{'real-time' if s['realtime'] else 'normal'} scheduling")
    print(f"queue      : empty on {s['queue_empty_ticks_after_warmup']} of {s['status_ticks_after_warmup']} "
          "ticks after warm-up")
    o, p, d = s["observation_to_chunk_ms"], s["prefill_ms"], s["decode_ms"]
    print(f"inference  : observation->chunk p50 {o['p50']:.1f} ms  p99 {o['p99']:.1f} ms  "
          f"(prefill p50 {p['p50']:.1f} ms, decode p50 {d['p50']:.1f} ms)")
    print(f"frame->action: p50 {s['frame_to_action_ms']['p50']} ms  p99 {s['frame_to_action_ms']['p99']} ms")
    print(f"vla_node   : {s['vla_node']}  (refused observations: {s['refused_observations']})")
    print(f"action_node: {s['action_node']}")
    if s["router_node"]:
        print(f"router_node: {s['router_node']}")
    if "cloud" in s:
        print_cloud(s["cloud"])


def print_cloud(c: dict) -> None:
    r, cl = c["round_trip_ms"], c["client"]
    print(f"cloud      : {c['url']} ({c['mode']} mode, same checkpoint)\n             ran on {c['where']}")
    print(f"cloud trip : round trip (request -> chunk, vla_node) p50 {r['p50']:.1f} ms  p99 {r['p99']:.1f} ms  "
          f"max {r['max']:.1f} ms")
    by = "  ".join(f"{k} p50 {v['p50']:.1f} ms" for k, v in c["observation_to_chunk_ms"].items())
    print(f"             observation->chunk by source: {by}")
    print(f"             client: {', '.join(f'{k} {v}' for k, v in sorted(cl.items())) or '(no calls)'}")
    if "shadow" in c:
        sh = c["shadow"]
        print(f"shadow     : {sh['requests']} requests logged to {sh['log']}"
              + (f" (edge quality vs cloud: mean {sh['edge_quality_mean']:.4f}); "
                 f"`edgefm-router calibrate --log {sh['log']}` reads it" if sh["requests"] else ""))


def plot(run, path: Path, joint_names: list[str], title: str) -> None:
    matplotlib.use("Agg")  # to a file, no display
    t0 = min(run.cmd_stamp[0] if run.cmd_stamp else np.inf, run.chunk_recv[0] if run.chunk_recv else np.inf)
    fig, ax = plt.subplots(3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1]})
    if run.cmd_pos:
        tc = np.asarray(run.cmd_stamp) - t0
        pos = run.positions
        for j in range(pos.shape[1]):
            ax[0].plot(tc, pos[:, j], lw=1.2, label=joint_names[j] if j < len(joint_names) else f"joint {j}")
        ax[0].legend(loc="upper right", fontsize=8, ncol=3)
    ax[0].set_ylabel("commanded position [rad]")
    ax[0].set_title(title)
    tr = np.asarray(run.chunk_recv) - t0
    ax[1].plot(tr, np.asarray(run.chunk_inference) * 1e3, ".-", label="observation -> chunk")
    ax[1].plot(tr, (np.asarray(run.chunk_prefill) + np.asarray(run.chunk_decode)) * 1e3, ".-",
               label="model compute (prefill + decode)")
    ax[1].set_ylabel("latency [ms]")
    ax[1].legend(loc="upper right", fontsize=8)
    ax[2].step(np.asarray(run.status_time) - t0, run.status_depth, where="post", lw=0.8)
    ax[2].set_ylabel("queue [ticks]")
    ax[2].set_xlabel("time [s]")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_bag_args(p: argparse.ArgumentParser) -> None:
    """``edgefm-demo bag``'s arguments."""
    p.add_argument("bag", nargs="?", default="", help="the bag to replay (default: a synthetic one is generated)")
    p.add_argument("--checkpoint", help="LeRobot SmolVLA checkpoint dir (default: the demo checkpoint)")
    p.add_argument("--vlm", help="VLM config/tokenizer dir of --checkpoint (default: resolved from it)")
    p.add_argument("--vision-position-ids", default="auto", choices=VISION_POSITION_ID_CHOICES,
                   help="SmolVLM vision position ids of --checkpoint: legacy (LeRobot 0.4.x), fixed (0.3.x, >= 0.5), "
                        "auto (its edgefm_numerics.json or LeRobot record, else fixed)")
    p.add_argument("--out", default="edgefm_demo_output", help="output dir (bag, logs, record, plot, summary)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of synthetic bag")
    p.add_argument("--width", type=int, default=160)
    p.add_argument("--height", type=int, default=120)
    p.add_argument("--control-rate", type=float, default=50.0, help="action_node rate (Hz)")
    p.add_argument("--action-rate", type=float, default=30.0, help="rate the policy's actions are meant for (Hz)")
    p.add_argument("--aggregate", default="weighted_average",
                   choices=("weighted_average", "latest_only", "average", "conservative"))
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: derived from the pid)")
    p.add_argument("--no-router", action="store_true", help="do not start router_node even when installed")
    p.add_argument("--cloud", action="store_true", help="also run the cloud tier on loopback (MLServer + nginx, "
                   "same checkpoint, exact mode) and route with config/router_demo.yaml")
    p.add_argument("--shadow", type=float, default=0.0, metavar="F",
                   help="with --cloud: shadow mode for this fraction of requests (log in --out)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefm-demo", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sim", help="the simulated arm doing tasks through the node graph (closed loop)",
                       description=sim_demo.__doc__.split("\n")[0])
    sim_demo.add_args(s)
    s.set_defaults(run=sim_demo.run_demo)
    b = sub.add_parser("bag", help="the node graph on a replayed bag (a synthetic one by default)",
                       description="the whole node graph on a replayed bag, end to end, on this machine")
    add_bag_args(b)
    b.set_defaults(run=run_demo)
    return p


def check_args(args) -> None:
    if not 0.0 <= args.shadow <= 1.0:
        raise ValueError(f"--shadow must be in [0, 1], got {args.shadow}")
    if args.shadow > 0 and not args.cloud:
        raise ValueError("--shadow needs --cloud (shadow mode runs both the edge and the cloud)")
    if args.cloud and importlib.util.find_spec("mlserver") is None:
        raise ValueError("--cloud needs MLServer (pip install mlserver==1.7.1) and nginx (apt-get install -y "
                         "nginx-light)")
    if args.cloud and (args.no_router or not router_available()):
        raise ValueError("--cloud needs router_node (it decides which requests go to the cloud): "
                         + ("drop --no-router" if args.no_router else "router_node is not installed (colcon build)"))


@contextlib.contextmanager
def cloud_tier(model: Model, out: Path, shadow: float):
    """The cloud server on loopback for the ``with`` block: yields (Cloud, token)."""
    shadow_log = out / "shadow.jsonl"
    if shadow_log.exists():
        shadow_log.unlink()
    log_path = out / "run" / "cloud.log"
    with loopback_cloud(model.checkpoint, log_path, model.vlm_dir, model.vision_position_ids,
                        progress=lambda m: print(m, flush=True)) as (url, token):
        yield Cloud(url, str(log_path), str(shadow_log) if shadow > 0 else ""), token


def run_demo(args) -> dict:
    """``edgefm-demo bag``: the summary (also written to <out>/summary.json)."""
    check_args(args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cameras = 2
    model = choose_model(args.checkpoint, args.vlm, cameras, (args.height, args.width), args.vision_position_ids)
    cfg = model_spec(model)
    print(f"model: {model.checkpoint} ({model.origin}{'; RANDOM WEIGHTS' if model.random_weights else ''})")
    bag = args.bag
    if not bag:
        bag = str(out / "bag")
        if Path(bag).exists():
            shutil.rmtree(bag)
        make_bag(MakeConfig(bag, duration_s=args.duration, cameras=len(cfg.camera_keys), width=args.width,
                            height=args.height))
        print(f"bag: {bag} (synthetic, {args.duration:g}s, {len(cfg.camera_keys)} cameras {args.width}x{args.height})")
    domain = args.domain_id if args.domain_id is not None else 10 + os.getpid() % 90
    with contextlib.ExitStack() as stack:
        cloud, env = None, {}
        if args.cloud:
            cloud, token = stack.enter_context(cloud_tier(model, out, args.shadow))
            print(f"cloud: {cloud.url} ready (exact mode, bearer token for vla_node only)", flush=True)
            env = {"vla_node": {"EDGEFM_CLOUD_TOKEN": token}}
        params = node_params(model, cfg, args, cloud)
        nodes = list(params)
        s = stack.enter_context(ReplaySession(out / "run", params, nodes, domain, OUTPUT_TOPICS + (COMMAND_TOPIC,),
                                              node_env=env))
        print(f"starting {', '.join(nodes)} (ROS_DOMAIN_ID {domain}) ...", flush=True)
        s.wait_active(["vla_node", "action_node"], timeout=120)
        print("replaying ...", flush=True)
        t_start = time.time()
        s.play(bag)
        t_end = time.time()
        time.sleep(0.5)
        diag = {n: s.diagnostics(n) for n in nodes}
    run = read_run(str(s.record_path), COMMAND_TOPIC)
    summary = summarize(run, model, params, diag, (t_start, t_end), cloud)
    summary["plot"] = str(out / "demo.png")
    plot(run, out / "demo.png", params["action_node"]["joint_names"],
         f"edgefm demo: {Path(model.checkpoint).name}" + (" (random weights)" if model.random_weights else ""))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print_summary(summary)
    print(f"plot       : {out / 'demo.png'}\nrecord     : {s.record_path}\nlogs       : {out / 'run'}")
    return summary


@cli_main("edgefm-demo", subcommands=True, errors=(RuntimeError, OSError, subprocess.SubprocessError))
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

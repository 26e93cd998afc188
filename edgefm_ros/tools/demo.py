"""edgefm-demo: the whole node graph on a replayed bag, end to end, on this machine.

1. the model: ``--checkpoint`` if given, else the demo checkpoint (``edgefm-vla make-checkpoint``: SmolVLA's
   architecture with deterministic RANDOM weights) made once into a cache dir, else the tiny reference
   checkpoint of ../shared; the summary says which, and whether its weights are random;
2. the bag: ``--bag`` if given, else a synthetic one (``edgefm-bag make``);
3. vla_node, action_node (and router_node when installed) started as processes with a params file;
4. the bag replayed into them, their outputs recorded;
5. a summary (chunks, control rate and jitter, inference latency, routes) and a plot (PNG) of the commanded
   joint trajectories and the latency over time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefm_ros.tools.bag.synth import JOINTS

COMMAND_TOPIC = "/edgefm/command"
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"


@dataclass(frozen=True)
class Model:
    checkpoint: str
    vlm_dir: str  # "" when the checkpoint resolves its own
    origin: str  # how it was chosen, for the summary
    random_weights: bool


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgefm_ros"


def choose_model(checkpoint: str | None, vlm: str | None, cameras: int, hw: tuple[int, int]) -> Model:
    if checkpoint:
        if not (Path(checkpoint) / "config.json").is_file():
            raise ValueError(f"--checkpoint {checkpoint} holds no config.json")
        readme = Path(checkpoint) / "README.md"
        random = readme.is_file() and "RANDOM WEIGHTS" in readme.read_text()
        return Model(checkpoint, vlm or "", "local checkpoint (--checkpoint)", random)
    out = cache_dir() / f"demo-smolvla-tiny-seed0-{cameras}cam-{hw[0]}x{hw[1]}"
    try:
        from edgefm_ros.tools.make_checkpoint import make_checkpoint

        if not (out / "model.safetensors").is_file():
            make_checkpoint(out, arch="tiny", seed=0, cameras=cameras, raw_hw=hw)
        return Model(str(out), "", f"demo checkpoint (edgefm-vla make-checkpoint, cached in {out})", True)
    except ImportError:
        pass
    ref = REFERENCE / "smolvla-tiny"
    if (ref / "config.json").is_file():
        return Model(str(ref), str(REFERENCE / "vlm" / "smolvlm-tiny"), "tiny reference checkpoint (../shared)", True)
    raise ValueError("no model: pass --checkpoint DIR (a LeRobot SmolVLA checkpoint)")


def model_spec(m: Model):
    from edgefm_ros.runtime.checkpoint import load_checkpoint

    return load_checkpoint(m.checkpoint, m.vlm_dir or None).config


def node_params(m: Model, cfg, args) -> dict:
    cams = cfg.camera_keys
    vla = dict(checkpoint=m.checkpoint, vlm_dir=m.vlm_dir, threads=1,
               camera_topics=[f"/camera{i + 1}/image_raw/compressed" if i % 2 else f"/camera{i + 1}/image_raw"
                              for i in range(len(cams))],
               camera_keys=list(cams), joint_states_topic="/joint_states",
               state_joint_names=list(JOINTS[:cfg.state_dim]),
               instruction_topic="/instruction", action_rate_hz=args.action_rate, max_observation_age_s=0.5,
               diagnostics_period_s=0.5, autostart=True)
    action = dict(control_rate_hz=args.control_rate, joint_names=list(JOINTS[:cfg.action_dim]),
                  command_type="joint_trajectory", command_topic=COMMAND_TOPIC, aggregate=args.aggregate,
                  chunk_size_threshold=0.5, diagnostics_period_s=0.5, autostart=True,
                  realtime_priority=50 if os.geteuid() == 0 else 0)
    out = {"vla_node": vla, "action_node": action}
    if router_available() and not args.no_router:
        out["router_node"] = dict(camera_topics=vla["camera_topics"], camera_keys=list(cams),
                                  instruction_topic="/instruction", rate_hz=2.0, diagnostics_period_s=0.5)
    return out


def router_available() -> bool:
    from edgefm_ros.tools.bag.session import installed_executable

    return importlib.util.find_spec("edgefm_ros.nodes.router_node") is not None and \
        installed_executable("router_node") is not None


def summarize(run, model: Model, params: dict, diag: dict, t_play: tuple[float, float]) -> dict:
    from edgefm_ros.tools.bag.analyze import command_timing, percentiles

    period = 1.0 / params["action_node"]["control_rate_hz"]
    t0 = (run.chunk_recv[0] + 0.5) if run.chunk_recv else t_play[0]
    timing = command_timing(run, period, t0, t_play[1])
    t, holding = np.asarray(run.status_time), np.asarray(run.status_holding)
    window = (t > t0) & (t < t_play[1])
    a = diag.get("action_node", {})
    v = diag.get("vla_node", {})
    return {
        "model": {"checkpoint": model.checkpoint, "origin": model.origin, "random_weights": model.random_weights},
        "chunks": len(run.chunk_seq), "chunk_sources": {s: run.chunk_source.count(s) for s in set(run.chunk_source)},
        "routes": dict(run.routes),
        "commands": int(timing["commands"]), "control_rate_hz": timing["rate_hz"],
        "period_error_ms": {"p50": timing["err_p50_ms"], "p99": timing["err_p99_ms"], "max": timing["err_max_ms"]},
        "missed_ticks": timing["missed"],
        "queue_empty_ticks_after_warmup": int(holding[window].sum()), "status_ticks_after_warmup": int(window.sum()),
        "observation_to_chunk_ms": percentiles(np.asarray(run.chunk_inference) * 1e3),
        "prefill_ms": percentiles(np.asarray(run.chunk_prefill) * 1e3),
        "decode_ms": percentiles(np.asarray(run.chunk_decode) * 1e3),
        "frame_to_action_ms": {k: a.get(f"frame_to_action_ms_{k}") for k in ("p50", "p99")},
        "refused_observations": v.get("refused"), "vla_node": v.get("message"), "action_node": a.get("message"),
        "router_node": diag.get("router_node", {}).get("message"),
    }


def print_summary(s: dict) -> None:
    m = s["model"]
    print("\n=== edgefm demo ===")
    print(f"model      : {m['checkpoint']}\n             {m['origin']}"
          + ("\n             RANDOM WEIGHTS: the actions are meaningless; the computation is SmolVLA's" if
             m["random_weights"] else ""))
    print(f"chunks     : {s['chunks']}  sources {s['chunk_sources']}  routes {s['routes'] or '(no router: edge)'}")
    print(f"control    : {s['commands']} commands at {s['control_rate_hz']:.2f} Hz, |period error| "
          f"p50 {s['period_error_ms']['p50']:.3f} ms  p99 {s['period_error_ms']['p99']:.3f} ms  "
          f"max {s['period_error_ms']['max']:.3f} ms, missed {s['missed_ticks']:.0f}")
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


def plot(run, path: Path, joint_names: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefm-demo", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="LeRobot SmolVLA checkpoint dir (default: the demo checkpoint)")
    p.add_argument("--vlm", help="VLM config/tokenizer dir of --checkpoint (default: resolved from it)")
    p.add_argument("--bag", help="bag to replay (default: a synthetic one is generated)")
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
    return p


def run_demo(args) -> dict:
    from edgefm_ros.tools.bag.analyze import read_run
    from edgefm_ros.tools.bag.make import MakeConfig, make_bag
    from edgefm_ros.tools.bag.session import OUTPUT_TOPICS, ReplaySession

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cameras = 2
    model = choose_model(args.checkpoint, args.vlm, cameras, (args.height, args.width))
    cfg = model_spec(model)
    print(f"model: {model.checkpoint} ({model.origin}{'; RANDOM WEIGHTS' if model.random_weights else ''})")
    bag = args.bag
    if not bag:
        bag = str(out / "bag")
        if Path(bag).exists():
            import shutil

            shutil.rmtree(bag)
        make_bag(MakeConfig(bag, duration_s=args.duration, cameras=len(cfg.camera_keys), width=args.width,
                            height=args.height))
        print(f"bag: {bag} (synthetic, {args.duration:g}s, {len(cfg.camera_keys)} cameras {args.width}x{args.height})")
    params = node_params(model, cfg, args)
    nodes = list(params)
    domain = args.domain_id if args.domain_id is not None else 10 + os.getpid() % 90
    with ReplaySession(out / "run", params, nodes, domain, OUTPUT_TOPICS + (COMMAND_TOPIC,)) as s:
        print(f"starting {', '.join(nodes)} (ROS_DOMAIN_ID {domain}) ...", flush=True)
        s.wait_active(["vla_node", "action_node"], timeout=120)
        print("replaying ...", flush=True)
        t_start = time.time()
        s.play(bag)
        t_end = time.time()
        time.sleep(0.5)
        diag = {n: s.diagnostics(n) for n in nodes}
    run = read_run(str(s.record_path), COMMAND_TOPIC)
    summary = summarize(run, model, params, diag, (t_start, t_end))
    summary["plot"] = str(out / "demo.png")
    plot(run, out / "demo.png", params["action_node"]["joint_names"],
         f"edgefm demo: {Path(model.checkpoint).name}" + (" (random weights)" if model.random_weights else ""))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print_summary(summary)
    print(f"plot       : {out / 'demo.png'}\nrecord     : {s.record_path}\nlogs       : {out / 'run'}")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        run_demo(args)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"edgefm-demo: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``edgefm-sim``: the simulated arm's tools.

    edgefm-sim collect --out /work/data/metaworld-demos --episodes-per-task 100      # expert demos (train seeds)
    edgefm-sim eval --seeds 1000-1019 --exec sync                                    # closed loop, one process
    edgefm-sim eval --checkpoint CKPT --tasks reach,push --seeds 1000-1019 --exec ros --json eval.json
    edgefm-sim teach --tasks reach --seeds 0-49 --bag demos/reach    # demonstrations through the ROS graph, to a bag
    edgefm-sim shadow --seeds 2000-2049 --log runs/shadow.jsonl       # the router's calibration log (outcomes)
    edgefm-sim route-eval --seeds 1000-1009 --conditions mixed --json route.json --plot route.svg
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgefm_ros.cloud.delay_proxy import add_impairment_args
from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.sim.conditions import CONDITION_SETS
from edgefm_ros.sim.paths import default_checkpoint
from edgefm_ros.sim.report import format_table, write_report
from edgefm_ros.sim.tasks import CALIBRATION_SEEDS, EVAL_SEEDS, PHRASINGS, TASKS, TRAIN_SEEDS, parse_seeds, \
    parse_tasks

ROUTE_TASKS = ("button-press-topdown", "drawer-open", "window-open", "push", "reach", "door-close")
from edgefm_ros.tools.teach import add_teach_args, cmd_teach


def _image_hw(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size {text!r}: expected HxW, e.g. 64x64") from None
    return h, w


# The simulator (MuJoCo, torch) and ROS are imported by the command that runs them: the parser, `teach` and
# `eval --exec ros` work without the simulator's stack loaded in this process, `collect` and sync/async eval
# without ROS.

def cmd_collect(args: argparse.Namespace) -> int:
    from edgefm_ros.sim.collect import CollectConfig, collect
    from edgefm_ros.sim.env import SimConfig

    cfg = CollectConfig(tasks=tuple(parse_tasks(args.tasks)), episodes_per_task=args.episodes_per_task,
                        first_seed=args.first_seed, tail_s=args.tail_s, noise_m=args.noise_m,
                        start_jitter_m=args.start_jitter_m,
                        only_success=not args.keep_failed, phrasings=args.phrasings)
    sim = SimConfig(image_hw=args.image_size, control_hz=args.control_hz)
    print(f"[collect] {len(cfg.tasks)} tasks x {cfg.episodes_per_task} episodes (train seeds "
          f"{cfg.first_seed}-{cfg.first_seed + cfg.episodes_per_task - 1}), {sim.image_hw[0]}x{sim.image_hw[1]} "
          f"cameras {list(sim.cameras)}, {sim.control_hz:g} Hz -> {args.out}", flush=True)
    s = collect(args.out, cfg, sim, log=lambda m: print(m, flush=True))
    size = sum(p.stat().st_size for p in Path(args.out).rglob("*") if p.is_file()) / 2 ** 20
    print(f"[collect] done: {s['episodes']} episodes, {s['frames']} frames, {size:.1f} MB in {s['seconds']:.0f} s; "
          f"expert success {s['successes']}", flush=True)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    leaked = [s for s in seeds if s in TRAIN_SEEDS]
    if leaked and not args.allow_train_seeds:
        print(f"edgefm-sim eval: seeds {leaked[:5]}... are training seeds (TRAIN_SEEDS {TRAIN_SEEDS.start}-"
              f"{TRAIN_SEEDS.stop - 1}); evaluation seeds are {EVAL_SEEDS.start}-{EVAL_SEEDS.stop - 1} "
              f"(--allow-train-seeds to go on)", file=sys.stderr)
        return 2
    episode_kw = {"conditions": args.conditions, "phrasings": args.phrasings, "image_hw": args.image_size}
    if args.exec == "async":
        from edgefm_ros.sim.async_loop import run_async_eval

        report = run_async_eval(args.checkpoint or str(default_checkpoint()), args.tasks, seeds, aggregate=args.aggregate or "weighted_average",
                                delay_ms=args.delay_ms, compute_ms=args.compute_ms, max_seconds=args.max_seconds,
                                threshold=args.chunk_size_threshold,
                                log=lambda m: print(m, flush=True), engine_mode=args.mode, **episode_kw)
    elif args.exec == "sync":
        from edgefm_ros.sim.rollout import run_sync_eval

        report = run_sync_eval(args.checkpoint, args.tasks, seeds, delay_ms=args.delay_ms,
                               n_action_steps=args.n_action_steps, max_seconds=args.max_seconds,
                               log=lambda m: print(m, flush=True), engine_mode=args.mode, **episode_kw)
    else:
        if args.conditions != "clean" or args.phrasings != "canonical" or args.image_size:
            raise ValueError("--conditions, --phrasings and --image-size are not passed through the node graph "
                             "yet (--exec ros); use --exec sync or async")
        from edgefm_ros.tools.sim_ros import run_ros_eval

        ckpt = args.checkpoint or str(default_checkpoint())
        tasks = parse_tasks(args.tasks) if args.tasks else None
        report = run_ros_eval(ckpt, tasks, seeds, delay_ms=args.delay_ms, aggregate=args.aggregate,
                              engine_mode=args.mode, domain_id=args.domain_id)
    print(format_table(report))
    if args.json:
        write_report(report, args.json)
        print(f"report: {args.json}")
    return 0


def _route_config(args: argparse.Namespace, seeds: list[int]):
    from edgefm_ros.sim.route_eval import RouteEvalConfig
    from edgefm_ros.sim.tiers import Link

    tasks = tuple(parse_tasks(args.tasks)) if args.tasks else tuple(ROUTE_TASKS)
    kw = {}
    if getattr(args, "placements", None):
        kw["placements"] = tuple(p for p in args.placements.split(",") if p)
    if getattr(args, "delta_sweep", None) is not None:
        kw["delta_sweep"] = tuple(float(v) for v in args.delta_sweep.split(",") if v)
    return RouteEvalConfig(edge=args.edge, cloud=args.cloud, router=args.router, tasks=tasks, seeds=tuple(seeds),
                           conditions=args.conditions, phrasings=args.phrasings, link=Link.parse(args.link),
                           aggregate=args.aggregate, threshold=args.chunk_size_threshold,
                           edge_compute_ms=args.edge_compute_ms, cloud_compute_ms=args.cloud_compute_ms,
                           cloud_delay_ms=args.cloud_delay_ms, **kw)


def cmd_route_eval(args: argparse.Namespace) -> int:
    # the engines (torch), the simulator (MuJoCo) and, for --exec ros, ROS: imported by the subcommand that runs
    # them, so that `edgefm-sim --help` and the other subcommands start without them
    from edgefm_ros.sim.route_eval import format_route_table, run_route_eval, write_json
    from edgefm_ros.sim.route_plot import write_route_plot
    from edgefm_ros.tools.cloud_outage import CloudOutage, format_outage
    from edgefm_ros.tools.route_ros import run_route_ros

    seeds = parse_seeds(args.seeds)
    leaked = [s for s in seeds if s in TRAIN_SEEDS or s in CALIBRATION_SEEDS]
    if leaked:
        raise ValueError(f"seeds {leaked[:5]} are training or calibration seeds; evaluate on EVAL_SEEDS "
                         f"{EVAL_SEEDS.start}-{EVAL_SEEDS.stop - 1}")
    if args.exec == "ros":
        if not args.placements:
            args.placements = "edge,router"
        report = run_route_ros(_route_config(args, seeds), out_dir=args.out_dir, domain_id=args.domain_id,
                               progress=lambda m: print(m, flush=True),
                               fault=CloudOutage.parse(args.cloud_outage) if args.cloud_outage else None,
                               impair={"jitter_ms": args.jitter_ms, "loss": args.loss, "handshake": args.handshake})
    else:
        if args.cloud_outage:
            raise ValueError("--cloud-outage kills a real cloud server: it needs --exec ros")
        shaped = [f"--{k} {v}" for k, v in (("jitter-ms", args.jitter_ms), ("loss", args.loss)) if v] + \
            (["--handshake"] if args.handshake else [])
        if shaped:
            raise ValueError(f"{', '.join(shaped)}: the link's proxy shapes real connections; it needs --exec ros")
        report = run_route_eval(_route_config(args, seeds), log=lambda m: print(m, flush=True))
    print(format_route_table(report))
    if "fault" in report:
        print(format_outage(report["fault"]))
    if args.json:
        write_json(report, args.json)
        print(f"report: {args.json}")
    if args.plot:
        write_route_plot(report, args.plot)
        print(f"plot: {args.plot}")
    return 0


def cmd_shadow(args: argparse.Namespace) -> int:
    from edgefm_ros.sim.route_eval import run_shadow

    run_shadow(_route_config(args, parse_seeds(args.seeds)), args.log, log=lambda m: print(m, flush=True),
               edge_spread=args.edge_spread)
    return 0


def _add_route_args(r: argparse.ArgumentParser, seeds: str) -> None:
    r.add_argument("--edge", default="checkpoints/smolvla-edge", help="the robot's checkpoint")
    r.add_argument("--cloud", default="checkpoints/smolvla-cloud", help="the server's checkpoint")
    r.add_argument("--router", default="config/router_sim.yaml", help="router configuration (calibrated)")
    r.add_argument("--tasks", default=None, help=f"comma-separated (default: {','.join(ROUTE_TASKS)})")
    r.add_argument("--seeds", default=seeds, help="A-B (inclusive)")
    r.add_argument("--conditions", choices=sorted(CONDITION_SETS), default="mixed", help="camera condition set")
    r.add_argument("--phrasings", choices=PHRASINGS, default="varied", help="instruction wording per episode")
    r.add_argument("--link", default="20,40", help="MBPS,RTT_MS of the robot's uplink (default 20,40)")
    r.add_argument("--aggregate", default="rtc", help="chunk aggregation of the action queue (default rtc)")
    r.add_argument("--chunk-size-threshold", type=float, default=0.8, help="a chunk is requested when the queue "
                   "holds less than this share of a chunk (default 0.8: the policies replan after about a fifth of "
                   "their chunk, as in their training's n_action_steps)")
    r.add_argument("--edge-compute-ms", type=float, default=None, help="edge compute per chunk charged on the "
                   "simulated clock (default: measured here)")
    r.add_argument("--cloud-compute-ms", type=float, default=None, help="server compute per chunk (default: "
                   "measured here)")
    r.add_argument("--cloud-delay-ms", type=float, default=0.0, help="added to every cloud answer")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgefm-sim", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="scripted expert demonstrations -> LeRobot-layout dataset")
    c.add_argument("--out", required=True, help="new dataset directory")
    c.add_argument("--tasks", default="all", help=f"comma-separated, or 'all' ({','.join(TASKS)})")
    c.add_argument("--episodes-per-task", type=int, default=100)
    c.add_argument("--first-seed", type=int, default=TRAIN_SEEDS.start, help="first training seed")
    c.add_argument("--image-size", type=_image_hw, default=(64, 64), help="HxW of both cameras")
    c.add_argument("--control-hz", type=float, default=20.0, help="command rate = dataset fps")
    c.add_argument("--tail-s", type=float, default=0.5, help="seconds recorded after success")
    c.add_argument("--noise-m", type=float, default=0.005, help="xyz noise (m) on executed, not recorded, commands")
    c.add_argument("--start-jitter-m", type=float, default=0.0,
                   help="start each episode with the hand moved up to this far (m) from its reset position per axis")
    c.add_argument("--keep-failed", action="store_true", help="also write failed episodes (flagged success=false)")
    c.add_argument("--phrasings", choices=PHRASINGS, default="varied", help="instruction per episode: drawn "
                   "from the task's training phrasings by seed (varied), or the canonical one")
    c.set_defaults(func=cmd_collect)
    e = sub.add_parser("eval", help="closed-loop task success of a checkpoint")
    e.add_argument("--checkpoint", default=None, help="checkpoint dir (default: the committed one)")
    e.add_argument("--tasks", default=None, help="comma-separated (default: the checkpoint's tasks / all)")
    e.add_argument("--seeds", default=f"{EVAL_SEEDS.start}-{EVAL_SEEDS.start + 19}", help="A-B (inclusive)")
    e.add_argument("--exec", choices=("ros", "sync", "async"), default="ros",
                   help="ros: the node graph; sync: the policy blocks simulated time; async: the graph's queue and "
                        "chunk requests on the simulated clock (latency = --compute-ms + --delay-ms)")
    e.add_argument("--mode", choices=("exact", "fast"), default="exact",
                   help="the policy's engine mode: exact (LeRobot parity) or fast (the tuned kernels)")
    e.add_argument("--delay-ms", type=float, default=0.0, help="extra inference delay per chunk")
    e.add_argument("--aggregate", default=None, help="action_node chunk aggregation (ros, async): "
                   "weighted_average, latest_only, average, conservative or rtc (real-time chunking)")
    e.add_argument("--compute-ms", type=float, default=50.0, help="async: simulated inference time per chunk")
    e.add_argument("--chunk-size-threshold", type=float, default=0.5, help="async: a chunk is requested when the "
                   "queue holds less than this share of a chunk (action_node's chunk_size_threshold); to cover a "
                   "latency of L ticks it must exceed L / chunk_size")
    e.add_argument("--n-action-steps", type=int, default=None, help="sync: actions executed per chunk "
                   "(default: the checkpoint's n_action_steps)")
    e.add_argument("--max-seconds", type=float, default=None, help="sync: episode time limit (default: the "
                   "task's max_seconds)")
    e.add_argument("--conditions", choices=sorted(CONDITION_SETS), default="clean",
                   help="camera condition set, drawn per episode from its seed: " + "; ".join(
                       f"{n}: " + ", ".join(f"{c} {p * 100:.0f}%%" for c, p in cs.shares)
                       for n, cs in CONDITION_SETS.items()))
    e.add_argument("--phrasings", choices=PHRASINGS, default="canonical", help="instruction per episode: the "
                   "task's canonical one, or varied (drawn from the seed; evaluation seeds include held-out wordings)")
    e.add_argument("--image-size", type=_image_hw, default=None, help="HxW of the cameras (default: the "
                   "checkpoint's input size; the policy resizes to its own)")
    e.add_argument("--domain-id", type=int, default=None, help="ros: the graph's ROS_DOMAIN_ID (default: from the "
                   "process id, away from a graph already running)")
    e.add_argument("--allow-train-seeds", action="store_true")
    e.add_argument("--json", default=None, help="write the report here")
    e.set_defaults(func=cmd_eval)
    t = sub.add_parser("teach", help="demonstrations through the ROS graph: sim_node driven by a teleoperation "
                       "device (the scripted expert), recorded with edgefm-bag record")
    add_teach_args(t)
    t.set_defaults(func=cmd_teach)
    r = sub.add_parser("route-eval", help="edge, cloud, router, random and oracle placements on the same episodes: "
                       "task success against offload")
    _add_route_args(r, f"{EVAL_SEEDS.start}-{EVAL_SEEDS.start + 9}")
    r.add_argument("--exec", choices=("async", "ros"), default="async", help="async: the graph's queue and "
                   "requests on the simulated clock")
    r.add_argument("--placements", default=None, help="comma-separated subset of edge,cloud,router,random,oracle "
                   "(ros: edge,router)")
    r.add_argument("--out-dir", default=None, help="ros: keep the nodes' logs and records here")
    r.add_argument("--domain-id", type=int, default=None, help="ros: the graph's ROS_DOMAIN_ID")
    r.add_argument("--cloud-outage", default=None, metavar="EPISODE,SECONDS[,KIND]", help="ros: 1 s after "
                   "episode EPISODE-1 ended, i.e. during episode EPISODE (0-based, >= 1), kill the cloud server "
                   "(crash, the default: SIGKILL to its process group, restarted on the same port SECONDS later) "
                   "or freeze it (hang: SIGSTOP, SIGCONT SECONDS later); the report's fault section")
    add_impairment_args(r, prefix="ros, the link's proxy: ")
    r.add_argument("--delta-sweep", default=None, help="delta_min values of the router's curve (comma-separated)")
    r.add_argument("--json", default=None, help="write the report here")
    r.add_argument("--plot", default=None, help="write success against offload here (SVG)")
    r.set_defaults(func=cmd_route_eval)
    sh = sub.add_parser("shadow", help="edge-only and cloud-only on calibration seeds: each request's features "
                        "and outcome, as the router's calibration log")
    _add_route_args(sh, f"{CALIBRATION_SEEDS.start}-{CALIBRATION_SEEDS.start + 49}")
    sh.set_defaults(router="config/router_sim_base.yaml")
    sh.add_argument("--log", required=True, help="JSON Lines request log to write")
    sh.add_argument("--edge-spread", action="store_true", help="also log the edge model's spread between two noise "
                    "draws (edge_spread), a signal the router may use")
    sh.set_defaults(func=cmd_shadow)
    return ap


@cli_main("edgefm-sim", subcommands=True)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

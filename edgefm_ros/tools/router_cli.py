"""edgefm-router: calibrate the router from a request log, evaluate it, make synthetic logs.

    edgefm-router synth-log --out log.jsonl --requests 2000 [--config config/router.yaml] [--soft]
    edgefm-router calibrate --log log.jsonl [--config config/router.yaml] --out router.calibrated.yaml
    edgefm-router evaluate --log log.jsonl [--config router.calibrated.yaml] [--split test] --plot eval.png

Logs are JSON Lines in the format of edgefm_ros/routing/log.py (shadow mode writes them).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.routing.calibrate import calibrate, split
from edgefm_ros.routing.calibrate import format_report as format_calibration
from edgefm_ros.routing.config import load_router_config, write_router_config
from edgefm_ros.routing.evaluate import evaluate, plot
from edgefm_ros.routing.evaluate import format_report as format_evaluation
from edgefm_ros.routing.log import read_log, write_records
from edgefm_ros.routing.synth import synth_records


def _default_config() -> str:
    here = Path(__file__).resolve()
    for root in (here.parents[2], Path.cwd()):
        cand = root / "config" / "router.yaml"
        if cand.is_file():
            return str(cand)
    try:  # ament_index_python: only in a ROS install
        from ament_index_python.packages import get_package_share_directory

        return str(Path(get_package_share_directory("edgefm_ros")) / "config" / "router.yaml")
    except Exception:  # noqa: BLE001 - no ament index: the user must say where the config is
        return "config/router.yaml"


def cmd_synth(args: argparse.Namespace) -> int:
    cfg = load_router_config(args.config)
    rng = np.random.default_rng(args.seed)
    records = synth_records(cfg, args.requests, rng, soft=args.soft, noise=args.noise)
    with open(args.out, "w") as f:
        n = write_records(records, f)
    print(f"wrote {n} lines ({args.requests} requests x {len(cfg.candidates)} candidates) to {args.out}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    cfg = load_router_config(args.config)
    if args.signals:  # signals the log holds that the configuration does not name yet
        cfg = replace(cfg, features=replace(cfg.features, signals=tuple(cfg.features.signals) + tuple(
            n for n in args.signals.split(",") if n and n not in cfg.features.signals)))
    records = read_log(args.log)
    groups = tuple(g for g in args.groups.split(",") if g)
    res = calibrate(cfg, records, test_fraction=args.test_fraction, seed=args.seed, l2=args.l2,
                    min_per_coef=args.min_per_coef, groups=groups)
    print(format_calibration(res))
    header = (f"Written by edgefm-router calibrate from {args.log} ({len(records)} lines; test fraction "
              f"{args.test_fraction}, split seed {args.seed}).\n")
    header += "".join(f"{r.name}: {r.method}, test Brier {r.brier:.4f} (prior {r.brier_prior:.4f}), "
                      f"ECE {r.ece:.4f} (prior {r.ece_prior:.4f})\n" for r in res.reports)
    write_router_config(res.config, args.out, header)
    print(f"wrote {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in res.reports], indent=1))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = load_router_config(args.config)
    records = read_log(args.log)
    if args.split != "all":
        calib, test = split(records, args.test_fraction, args.seed)
        records = test if args.split == "test" else calib
    rep = evaluate(cfg, records)
    print(format_evaluation(rep))
    if args.plot:
        plot(rep, args.plot)
        print(f"wrote {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(rep), indent=1, default=float))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefm-router", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth-log", help="write a synthetic log from the config's (known) coefficients")
    s.add_argument("--out", required=True)
    s.add_argument("--requests", type=int, default=2000)
    s.add_argument("--seed", type=int, default=None, help="default: fresh randomness")
    s.add_argument("--soft", action="store_true", help="log the true probability instead of a 0/1 outcome")
    s.add_argument("--noise", type=float, default=0.1, help="log-normal sigma of latency/energy")
    s.set_defaults(func=cmd_synth)

    c = sub.add_parser("calibrate", help="fit quality coefficients; report Brier/ECE; write a router YAML")
    c.add_argument("--log", required=True)
    c.add_argument("--out", required=True, help="router YAML to write (the config plus fitted coefficients)")
    c.add_argument("--l2", type=float, default=1e-3)
    c.add_argument("--min-per-coef", type=int, default=20, help="log lines per coefficient needed for a full "
                   "logistic fit (fewer: Platt scaling of the prior)")
    c.add_argument("--signals", default="", help="caller-measured signals of the log to add to the configuration's "
                   "features (e.g. edge_spread: edgefm-sim shadow --edge-spread)")
    c.add_argument("--groups", default="image,text,signals", help="feature groups the fit may use (an "
                   "ablation): image, text, signals")
    c.add_argument("--json", default="", help="also write the per-candidate reports here")
    c.set_defaults(func=cmd_calibrate)

    e = sub.add_parser("evaluate", help="replay a log: router vs edge-only, cloud-only, random, oracle")
    e.add_argument("--log", required=True)
    e.add_argument("--split", choices=("all", "test", "calibration"), default="all",
                   help="evaluate on the calibrate command's test (or calibration) requests only")
    e.add_argument("--plot", default="", help="PNG of accuracy versus cloud share")
    e.add_argument("--json", default="", help="also write the report here")
    e.set_defaults(func=cmd_evaluate)

    for q in (c, e):
        q.add_argument("--test-fraction", type=float, default=0.3)
        q.add_argument("--seed", type=int, default=0, help="seed of the calibration/test split")
    for q in (s, c, e):
        q.add_argument("--config", default=_default_config())
    return p


@cli_main("edgefm-router", subcommands=True)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

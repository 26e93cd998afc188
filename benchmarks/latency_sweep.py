"""Task success against added inference delay, per chunk aggregation, on the simulated clock.

    python benchmarks/latency_sweep.py --checkpoint checkpoints/smolvla-edge --seeds 1000-1009 \
        --delays 0,300,800,1500 --aggregates rtc,weighted_average,latest_only --json latency.json

Each episode runs the graph's queue and chunk requests on the simulated clock (sim.async_loop): a chunk arrives
``compute_ms + delay`` after its observation while the arm keeps executing. ``--compare-restamp`` adds the rtc
rows with chunks asked for while the arm holds starting at their observation (the rows of the wait skipped), the
queue's behaviour before held chunks were restamped to their arrival. Prints the table, with each delay's success
as a share of the same aggregation's 0 ms success on the tasks that one solves.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.rtc_guidance import GUIDANCE_FORMS, RtcConfig
from edgefm_ros.sim.async_loop import run_async_episode
from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.rollout import checkpoint_settings, checkpoint_tasks
from edgefm_ros.sim.tasks import parse_seeds, parse_tasks


def sweep(checkpoint: str, tasks, seeds, delays, aggregates, *, compute_ms: float, threshold: float,
          image_hw, compare_restamp: bool, guidance: str = "auto", log=print) -> dict:
    st = checkpoint_settings(checkpoint)
    engine = Engine.from_checkpoint(checkpoint, rtc=RtcConfig(guidance=guidance))
    sim = SimConfig(image_hw=tuple(image_hw or st["image_hw"]), cameras=st["cameras"])
    rows = [(a, True) for a in aggregates] + ([("rtc", False)] if compare_restamp else [])
    out = {}
    t0 = time.perf_counter()
    with SimEnv(sim) as env:
        for agg, restamp in rows:
            name = agg if restamp else f"{agg} (held chunks at their observation)"
            out[name] = {}
            for d in delays:
                ok = {}
                for seed in seeds:
                    for task in tasks:
                        r = run_async_episode(env, engine, task, seed, aggregate=agg, latency_s=(compute_ms + d) / 1e3,
                                              threshold=threshold, cameras=sim.cameras, restamp_held=restamp)
                        ok.setdefault(task, []).append(bool(r.success))
                out[name][str(d)] = {t: int(sum(v)) for t, v in ok.items()}
                log(f"[latency] {name} {d:g} ms: {sum(out[name][str(d)].values())}/{len(tasks) * len(seeds)} "
                    f"({time.perf_counter() - t0:.0f} s)")
    return {"checkpoint": checkpoint, "tasks": list(tasks), "seeds": list(seeds), "delays_ms": list(delays),
            "compute_ms": compute_ms, "chunk_size_threshold": threshold, "image_hw": list(sim.image_hw),
            "rtc_guidance": engine.rtc.guidance,
            "successes": out}


def table(rep: dict) -> str:
    n_seeds = len(rep["seeds"])
    delays = [str(d) for d in rep["delays_ms"]]
    lines = [f"{'aggregation':<44} " + " ".join(f"{d + ' ms':>9}" for d in delays) + "   at max delay / at 0 ms"]
    for name, by_delay in rep["successes"].items():
        zero = by_delay[delays[0]]
        solved = [t for t, v in zero.items() if v > 0]
        cells = [f"{sum(by_delay[d].values()):>4}/{n_seeds * len(rep['tasks']):<4}" for d in delays]
        a0 = sum(zero[t] for t in solved)
        a1 = sum(by_delay[delays[-1]][t] for t in solved)
        lines.append(f"{name:<44} " + " ".join(f"{c:>9}" for c in cells) +
                     f"   {a1}/{a0} = {a1 / a0:.2f}" if a0 else "")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="checkpoints/smolvla-edge")
    ap.add_argument("--tasks", default=None)
    ap.add_argument("--seeds", default="1000-1009")
    ap.add_argument("--delays", default="0,300,800,1500")
    ap.add_argument("--aggregates", default="rtc,weighted_average,latest_only")
    ap.add_argument("--compute-ms", type=float, default=26.0, help="the model's own time per chunk")
    ap.add_argument("--chunk-size-threshold", type=float, default=0.8)
    ap.add_argument("--image-size", default="128x128")
    ap.add_argument("--compare-restamp", action="store_true")
    ap.add_argument("--rtc-guidance", choices=GUIDANCE_FORMS, default="auto",
                    help="how rtc follows the executing prefix (default auto: prefix for a checkpoint trained "
                         "with --rtc-prefix-max, else constant)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    tasks = parse_tasks(args.tasks) if args.tasks else checkpoint_tasks(args.checkpoint)
    hw = tuple(int(v) for v in args.image_size.split("x"))
    rep = sweep(args.checkpoint, tasks, parse_seeds(args.seeds), [float(d) for d in args.delays.split(",")],
                [a for a in args.aggregates.split(",") if a], compute_ms=args.compute_ms,
                threshold=args.chunk_size_threshold, image_hw=hw, compare_restamp=args.compare_restamp,
                guidance=args.rtc_guidance, log=lambda m: print(m, flush=True))
    rep["date"] = time.strftime("%Y-%m-%d")
    print(table(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
        print(f"report: {args.json}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())

"""Tuned table vs the built-in defaults, end to end, in one run (a script, not a test).

    python benchmarks/bench_tune.py --checkpoint CKPT [--vlm DIR] [--table config/dispatch/<hw>.yaml]
                                    [--mode fast] [--warmup 1] [--runs 5] [--threads N] [--json out.json]

Both engines are built from the same checkpoint; chunks alternate between them (ABAB...) on the same
inputs and noise, so load on a shared machine hits both alike. Prints the median chunk / prefill /
decode times, the ratio tuned / built-in, and how far the tuned actions are from the built-in ones.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.dispatch.hardware import detect
from edgefm_ros.dispatch.modes import TUNABLE
from edgefm_ros.dispatch.resolver import tuned_table_path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--vlm", default=None)
    ap.add_argument("--table", default=None, help="tuned table (default: config/dispatch/<hw_profile>.yaml)")
    ap.add_argument("--mode", default="fast", choices=TUNABLE)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        ap.error(f"--runs must be >= 1 and --warmup >= 0, got {args.runs} and {args.warmup}")
    return args


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv=None) -> int:
    args = parse_args(argv)
    table = Path(args.table) if args.table else tuned_table_path(detect("cpu").profile)
    if not table.is_file():
        print(f"no tuned table at {table}; run `edgefm-vla tune` first", file=sys.stderr)
        return 2
    engines = {
        "built-in": Engine.from_checkpoint(args.checkpoint, args.vlm, mode=args.mode, threads=args.threads,
                                           use_tuned=False),
        "tuned": Engine.from_checkpoint(args.checkpoint, args.vlm, mode=args.mode, threads=args.threads,
                                        tables=[table], use_tuned=False),
    }
    ref = engines["built-in"]
    inp = ref.inputs_from_observation(ref.synthetic_observation(0))
    noise = torch.randn((inp.batch, ref.model_config.chunk_size, ref.model_config.max_action_dim), generator=torch.Generator().manual_seed(0))
    times = {name: {"chunk": [], "prefill": [], "decode": []} for name in engines}
    actions = {}
    for i in range(args.warmup + args.runs):
        for name, eng in engines.items():
            t0 = time.perf_counter()
            actions[name] = eng.sample(inp, noise)
            if i >= args.warmup:
                tm = eng.last_timings
                times[name]["chunk"].append(time.perf_counter() - t0)
                times[name]["prefill"].append(tm.prefill_s)
                times[name]["decode"].append(tm.decode_s)
    d = (actions["tuned"] - actions["built-in"])[..., :ref.model_config.action_dim]
    result = {"mode": args.mode, "table": str(table), "hw_profile": ref.hardware.profile,
              "threads": torch.get_num_threads(), "runs": args.runs,
              **{name: {k: stats(v) for k, v in t.items()} for name, t in times.items()},
              "ratio_chunk": statistics.median(times["tuned"]["chunk"]) / statistics.median(times["built-in"]["chunk"]),
              "action_rms_vs_builtin": d.pow(2).mean().sqrt().item(), "action_max_vs_builtin": d.abs().max().item()}
    print(f"{'table':<10} {'chunk s':>9} {'prefill s':>10} {'decode s':>9}   (median of {args.runs}, mode {args.mode}, "
          f"{result['threads']} threads, {result['hw_profile']})")
    for name in engines:
        t = result[name]
        print(f"{name:<10} {t['chunk']['median']:>9.3f} {t['prefill']['median']:>10.3f} {t['decode']['median']:>9.3f}")
    print(f"ratio tuned / built-in (chunk): {result['ratio_chunk']:.3f}; actions differ by rms "
          f"{result['action_rms_vs_builtin']:.2e}, max {result['action_max_vs_builtin']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

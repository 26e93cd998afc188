"""Decode time with real-time chunking against without, in one process, runs interleaved.

    python scripts/bench_rtc.py --checkpoint checkpoints/smolvla-metaworld [--vlm DIR] [--runs 30]

For each mode (exact, reference): plain decode, LeRobot's guidance (constant, no backward pass) and, where the
expert has a backward pass (reference), the paper's (vjp); prints median decode ms and the ratio to plain.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.rtc_guidance import RtcConfig, rtc_inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--vlm", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", default="exact,reference")
    args = ap.parse_args()
    results = {}
    for mode in args.modes.split(","):
        base = Engine.from_checkpoint(args.checkpoint, vlm_dir=args.vlm, mode=mode, threads=args.threads)
        variants = {"plain": base, "constant": base}
        if mode == "reference":
            variants["vjp"] = Engine(base.ckpt, dataclasses.replace(base.config, rtc=RtcConfig(guidance="vjp")),
                                     base.hardware)
        mc = base.model_config
        inp = base.inputs_from_observation(base.synthetic_observation())
        prefix = base.prefill(inp)
        g = torch.Generator().manual_seed(0)
        noise = torch.randn(1, mc.chunk_size, mc.max_action_dim, generator=g)
        prev = base.decode(prefix, torch.randn(1, mc.chunk_size, mc.max_action_dim, generator=g))[0, :, :mc.action_dim]
        times = {k: [] for k in variants}
        for r in range(args.runs + 2):  # 2 warm-up rounds
            for name, e in variants.items():
                rtc = None if name == "plain" else rtc_inputs(prev, 3, e.rtc, mc.chunk_size, mc.max_action_dim)
                t0 = time.perf_counter()
                e.decode(prefix, noise, rtc=rtc)
                if r >= 2:
                    times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        results[mode] = {k: {"decode_ms": round(v, 3), "ratio": round(v / med["plain"], 3)} for k, v in med.items()}
        print(f"{mode}: " + ", ".join(f"{k} {v:.2f} ms (x{v / med['plain']:.2f})" for k, v in med.items()),
              flush=True)
    print(json.dumps({"checkpoint": args.checkpoint, "runs": args.runs, "threads": torch.get_num_threads(),
                      "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

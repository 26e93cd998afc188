"""A chunk on a busy machine: how much slower it gets when another process takes a share of one core
(a script, not a test).

    python benchmarks/bench_contention.py --checkpoint CKPT [--vlm DIR] [--mode fast] [--runs 5]
                                          [--load 0.25] [--bursts-ms 0.5,2] [--json out.json]

On a robot the camera drivers, the control loop and DDS run beside the model. On 2 cores the model's two
threads meet at the end of every parallel region, so a thread that another process preempts holds up the
other: the chunk slows down by more than the share of CPU taken. This measures it: chunk times idle, then
with a background process busy ``--load`` of one core in bursts of each ``--bursts-ms`` length (busy, then
asleep for the rest of the period), the idle runs repeated between the loaded ones. Prints each median and
its ratio to idle; a load that only took its share would give 1 / (1 - load / 2) = 1.14 for 0.25.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.dispatch.modes import MODES

# the background load: busy `busy` seconds, asleep for the rest of `period`, until killed
BURN = ("import sys, time\nbusy, period = float(sys.argv[1]), float(sys.argv[2])\nwhile True:\n"
        "    t = time.perf_counter()\n    while time.perf_counter() - t < busy: pass\n    time.sleep(period - busy)\n")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--vlm", default=None)
    ap.add_argument("--mode", default="fast", choices=MODES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--load", type=float, default=0.25, help="share of one core the background takes (0-1)")
    ap.add_argument("--bursts-ms", default="0.5,2", help="burst lengths, comma-separated (ms)")
    ap.add_argument("--vision-position-ids", default="auto", choices=("auto", "fixed", "legacy"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        a.bursts = [float(b) * 1e-3 for b in a.bursts_ms.split(",")]
    except ValueError:
        ap.error(f"--bursts-ms takes comma-separated numbers, got {a.bursts_ms!r}")
    if not 0.0 < a.load < 1.0 or any(b <= 0 for b in a.bursts):
        ap.error(f"--load must be in (0, 1) and the bursts positive, got {a.load} and {a.bursts_ms}")
    if a.runs < 1 or a.warmup < 0:
        ap.error(f"--runs must be >= 1 and --warmup >= 0, got {a.runs} and {a.warmup}")
    return a


def chunk_times(engine, inp, noise, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        engine.sample(inp, noise)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    a = parse_args(argv)
    engine = Engine.from_checkpoint(a.checkpoint, a.vlm, mode=a.mode, threads=a.threads,
                                    vision_position_ids=a.vision_position_ids)
    inp = engine.inputs_from_observation(engine.synthetic_observation(0))
    cfg = engine.model_config
    noise = torch.randn((inp.batch, cfg.chunk_size, cfg.max_action_dim), generator=torch.Generator().manual_seed(0))
    chunk_times(engine, inp, noise, a.warmup)
    idle: list[float] = []
    rows = []
    print(f"{a.checkpoint}, mode {a.mode}, {a.threads} threads; background load {a.load:g} of one core; "
          f"{a.runs} chunks each, medians in ms", flush=True)
    for burst in a.bursts:
        idle += chunk_times(engine, inp, noise, a.runs)
        period = burst / a.load
        proc = subprocess.Popen([sys.executable, "-c", BURN, str(burst), str(period)])
        try:
            time.sleep(0.2)
            loaded = chunk_times(engine, inp, noise, a.runs)
        finally:
            proc.kill()
            proc.wait()
        rows.append({"burst_ms": burst * 1e3, "period_ms": period * 1e3, "median_ms": statistics.median(loaded) * 1e3,
                     "min_ms": min(loaded) * 1e3})
    base = statistics.median(idle) * 1e3
    print(f"idle                          {base:7.1f}  (min {min(idle) * 1e3:.1f})")
    for r in rows:
        r["ratio"] = r["median_ms"] / base
        print(f"busy {r['burst_ms']:4.1f} ms every {r['period_ms']:5.1f} ms  {r['median_ms']:7.1f}  (min "
              f"{r['min_ms']:.1f})  x{r['ratio']:.2f}")
    print(f"(a load that only took its share: x{1.0 / (1.0 - a.load / a.threads):.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"checkpoint": a.checkpoint, "mode": a.mode, "threads": a.threads, "load": a.load,
                       "idle_median_ms": base, "loaded": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SmolVLA chunk latency and memory, edgefm runtime vs LeRobot 0.4.4, side by side in one run.

Runs, interleaved round by round so that host noise hits both alike, each in its own process (for a
clean peak RSS): LeRobot float32, LeRobot's native bf16/fp32 mix, edgefm exact, edgefm fast. Prints a
table of medians and the ratios the project tracks, and checks fast-mode actions against exact mode.
The floor: the fast chunk's GFLOP (``edgefm-vla profile``, counted op by op) over the bf16 matmul rate
measured in the same run; ``fast_chunk_vs_bf16_floor`` is the fast chunk's median over it.

  python benchmarks/bench_vs_lerobot.py --harness /path/to/reference/lerobot_harness [--variant full]
      [--rounds 2] [--warmup 1] [--runs 3] [--json out.json]

The harness folder is a copy of ../shared/reference/lerobot_harness set up with its setup_venv.sh
(its README, section 6); its first run generates the FULL checkpoint and goldens used here.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], env=None) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def clean_env() -> dict:
    """Environment for the harness's own venv: no ROS wheel bootstrap variables from ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("_ROS_WHEELS_BOOTSTRAP_COMPLETE", "LD_LIBRARY_PATH",
                                                             "PYTHONPATH", "VIRTUAL_ENV")}
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", required=True, type=Path, help="lerobot_harness folder with its .venv")
    ap.add_argument("--variant", default="full", choices=("full", "tiny"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--configs", default="lerobot_fp32,lerobot_native,edgefm_exact,edgefm_fast",
                    help="comma-separated subset of the four configurations")
    args = ap.parse_args()
    h = args.harness.resolve()
    lerobot_py = h / ".venv" / "bin" / "python"
    art = h / "artifacts" / args.variant
    vlm = h / "vlm" / ("SmolVLM2-500M-Video-Instruct" if args.variant == "full" else "smolvlm-tiny")
    tmp = Path(tempfile.mkdtemp(prefix="edgefm-bench-"))
    common = ["--warmup", str(args.warmup), "--runs", str(args.runs)]
    threads = ["--threads", str(args.threads)] if args.threads else []
    known = ("lerobot_fp32", "lerobot_native", "edgefm_exact", "edgefm_fast")
    chosen = [c for c in args.configs.split(",") if c]
    bad = sorted(set(chosen) - set(known))
    if bad:
        raise SystemExit(f"--configs: unknown {bad}; known: {list(known)}")
    results: dict[str, list[dict]] = {k: [] for k in known if k in chosen}
    for r in range(args.rounds):
        for name in results:
            out = tmp / f"{name}.{r}.json"
            if name.startswith("lerobot"):
                extra = ["--native-dtype"] if name == "lerobot_native" else []
                run([str(lerobot_py), str(h / "bench_reference.py"), "--variant", args.variant, "--json", str(out)]
                    + common + threads + extra, env=clean_env())
            else:
                mode = name.split("_")[1]
                run([sys.executable, "-m", "edgefm_ros.tools.vla_cli", "bench", "--checkpoint", str(art / "checkpoint"),
                     "--vlm", str(vlm), "--inputs", str(art / "golden" / "inputs.safetensors"), "--mode", mode,
                     "--json", str(out), "--vision-position-ids", "legacy"] + common + threads)
            results[name].append(json.loads(out.read_text()))
    # the floor of this run: the chunk's GFLOP (counted op by op) over the bf16 matmul rate measured now
    floor = None
    if "edgefm_fast" in results:
        prof = tmp / "profile_fast.json"
        run([sys.executable, "-m", "edgefm_ros.tools.vla_cli", "profile", "--checkpoint", str(art / "checkpoint"),
             "--vlm", str(vlm), "--inputs", str(art / "golden" / "inputs.safetensors"), "--mode", "fast",
             "--json", str(prof), "--vision-position-ids", "legacy", "--warmup", "1", "--runs", "2"] + threads)
        p = json.loads(prof.read_text())
        if "bf16" in p["peaks"]:
            floor = {"gflop": p["gflop"], "bf16_gflops": p["peaks"]["bf16"], "floor_s": p["gflop"] / p["peaks"]["bf16"]}
    # accuracy of fast mode vs exact and vs the golden, on the same inputs and noise
    for mode in ("exact", "fast"):
        run([sys.executable, "-m", "edgefm_ros.tools.vla_cli", "predict", "--checkpoint", str(art / "checkpoint"),
             "--vlm", str(vlm), "--inputs", str(art / "golden" / "inputs.safetensors"), "--mode", mode,
             "--out", str(tmp / f"actions_{mode}.safetensors"), "--vision-position-ids", "legacy"])
    from safetensors.torch import load_file

    ex = load_file(str(tmp / "actions_exact.safetensors"))["actions"]
    fa = load_file(str(tmp / "actions_fast.safetensors"))["actions"]
    gold = load_file(str(art / "golden" / "outputs.safetensors"))["actions"]

    def med(name, key):
        vals = [x[key]["median"] for x in results[name] if key in x]
        return statistics.median(vals) if vals else float("nan")

    def rss(name):
        return statistics.median(x["peak_rss_mb"] for x in results[name])

    keys = {"chunk": ("chunk_s", "chunk_s"), "prefill": ("prefix_s", "prefill_s"), "decode": ("denoise_s", "decode_s")}
    table = {}
    for name in results:
        idx = 0 if name.startswith("lerobot") else 1
        table[name] = {part: med(name, k[idx]) for part, k in keys.items()}
        table[name]["peak_rss_mb"] = rss(name)
    pairs = {"exact_chunk_vs_lerobot_fp32": ("edgefm_exact", "lerobot_fp32", "chunk"),
             "exact_decode_vs_lerobot_fp32": ("edgefm_exact", "lerobot_fp32", "decode"),
             "fast_chunk_vs_lerobot_native": ("edgefm_fast", "lerobot_native", "chunk"),
             "exact_rss_vs_lerobot_fp32": ("edgefm_exact", "lerobot_fp32", "peak_rss_mb"),
             "fast_rss_vs_lerobot_native": ("edgefm_fast", "lerobot_native", "peak_rss_mb")}
    ratios = {k: table[a][part] / table[b][part] for k, (a, b, part) in pairs.items() if a in table and b in table}
    if floor is not None:
        ratios["fast_chunk_vs_bf16_floor"] = table["edgefm_fast"]["chunk"] / floor["floor_s"]
    accuracy = {"exact_vs_golden_max_abs": float((ex - gold).abs().max()),
                "fast_vs_exact_rms": float((fa - ex).pow(2).mean().sqrt()),
                "fast_vs_exact_max_abs": float((fa - ex).abs().max())}
    print(f"\nSmolVLA {args.variant}, {args.rounds} rounds x (warm-up {args.warmup}, {args.runs} runs), medians in s")
    print(f"{'':16}{'chunk':>9}{'prefill':>9}{'decode':>9}{'RSS MB':>9}")
    for name, row in table.items():
        print(f"{name:16}{row['chunk']:9.3f}{row['prefill']:9.3f}{row['decode']:9.3f}{row['peak_rss_mb']:9.0f}")
    if floor is not None:
        print(f"bf16 floor: {floor['gflop']:.0f} GFLOP / {floor['bf16_gflops']:.0f} GFLOP/s (2048^3 bf16 matmul, "
              f"this run) = {floor['floor_s']:.3f} s")
    for k, v in {**ratios, **accuracy}.items():
        print(f"{k:34} {v:.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, "ratios": ratios, "accuracy": accuracy,
                                               "floor": floor, "raw": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

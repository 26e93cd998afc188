"""Exact-mode attention kernels side by side on one shape: torch's SDPA (fp32 flash) vs our AVX-512 kernel.

    python benchmarks/bench_attention.py                       # the vision tower's call: 12 heads, 1024 x 1024, d 64
    python benchmarks/bench_attention.py --heads 15 --kv-heads 5 --lq 211 --lk 211 --mask

q/k/v are strided slices of one fused projection, as the model passes them. Calls alternate between the
two kernels (the host is shared and noisy); medians in ms, their ratio, and the max difference of the
outputs, all printed as JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from edgefm_kernels import cpu_attention
from edgefm_kernels.attention import SdpaAttention


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=12)
    p.add_argument("--lq", type=int, default=1024)
    p.add_argument("--lk", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mask", action="store_true", help="a random bool mask (60%% of keys visible)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args(argv)
    reason = cpu_attention.unavailable()
    if reason:
        raise SystemExit(f"AVX-512 attention not available here: {reason}")
    torch.set_num_threads(a.threads)
    h, hkv, d = a.heads, a.kv_heads, a.head_dim
    qx = torch.randn(1, a.lq, h * d)
    kv = torch.randn(1, a.lk, 2 * hkv * d)
    q = qx.view(1, a.lq, h, d).transpose(1, 2)
    k, v = (t.view(1, a.lk, hkv, d).transpose(1, 2) for t in kv.split(hkv * d, -1))
    mask = (torch.rand(1, a.lq, a.lk) < 0.6) if a.mask else None
    kernels = {"sdpa": SdpaAttention(gqa="native"), "avx512": cpu_attention.attention}
    times = {name: [] for name in kernels}
    outs = {name: fn(q, k, v, mask) for name, fn in kernels.items()}  # warm-up
    for _ in range(a.runs):
        for name, fn in kernels.items():
            t0 = time.perf_counter()
            fn(q, k, v, mask)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    print(json.dumps({"shape": {"heads": h, "kv_heads": hkv, "lq": a.lq, "lk": a.lk, "head_dim": d, "mask": a.mask},
                      "threads": a.threads, "median_ms": med, "avx512_vs_sdpa": med["avx512"] / med["sdpa"],
                      "max_abs_diff": float((outs["avx512"] - outs["sdpa"]).abs().max())}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a chunk's time goes: per op family and stage, time, GFLOP, achieved rate and its fraction of the
peak matmul rate of the op's dtype, measured in the same run.

    probe = OpProbe()
    engine = Engine.from_checkpoint(..., probe=probe)   # every resolved op is timed around its call
    peaks = measure_peaks()                             # {"fp32": GFLOP/s, "bf16": ..., "int8": ...}
    engine.sample(inp, noise); probe.reset(); engine.sample(inp, noise)
    rows = probe.rows(engine.last_timings, peaks)

Ops are timed with ``perf_counter`` around the call (CPU ops are synchronous; on CUDA the probe
synchronises, which serialises the stream: read its shares, not its totals). GFLOP are counted from
the call's shapes: linear 2*M*K*N, MLP 2*M*H*I per GEMM, attention 4*B*Hq*Lq*Lk*D, patch embedding
2*T*(3*p*p)*hidden; norms, rotary, casts and the KV codec move memory only (no GFLOP, no rate). What no
resolved op accounts for (residual adds, concatenations, the Euler update, Python) is the stage's
``glue`` row.
"""
from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from edgefm_kernels.registry import Impl, OpSpec

PEAK_DTYPES = ("fp32", "bf16", "int8")


@dataclass
class Tally:
    calls: int = 0
    seconds: float = 0.0
    gflop: float = 0.0


def _m(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def flops(spec: OpSpec, args: tuple, out) -> float:
    """FLOPs of one call of ``spec`` (0 for memory-bound ops)."""
    kind, d = spec.op_kind, spec.dims
    if kind == "linear":
        x = args[0]
        outs = out if isinstance(out, tuple) else (out,)
        return 2.0 * _m(x) * x.shape[-1] * sum(o.shape[-1] for o in outs)
    if kind == "mlp":
        gemms = 3 if spec.shape_sig.startswith("silu_gated") else 2
        return 2.0 * _m(args[0]) * d["hidden"] * d["inner"] * gemms
    if kind == "attention":
        q, k = args[0], args[1]
        b, hq, lq, dh = q.shape
        return 4.0 * b * hq * lq * k.shape[2] * dh
    if kind == "patch_embed":
        p = int(re.match(r"p(\d+)x", spec.shape_sig).group(1))
        return 2.0 * _m(out) * 3 * p * p * out.shape[-1]
    return 0.0


class OpProbe:
    """Wraps every op the resolver builds (``OpResolver.wrap``) with a timer keyed by (stage, op_kind,
    layer_role); an ``nn.Module`` op keeps its type (hooks), a plain callable gets a delegating wrapper."""

    def __init__(self, sync_cuda: bool = False):
        self.sync = sync_cuda and torch.cuda.is_available()
        self.tallies: dict[tuple[str, str, str], Tally] = defaultdict(Tally)
        self.precision: dict[tuple[str, str, str], str] = {}

    def reset(self) -> None:
        self.tallies.clear()

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _record(self, key, spec: OpSpec, t0: float, args: tuple, out) -> None:
        if self.precision[key] == "fp32" and args and getattr(args[0], "dtype", None) == torch.bfloat16:
            self.precision[key] = "bf16"  # an fp32-class impl fed bf16 activations (e.g. torch SDPA) runs in bf16
        tally = self.tallies[key]
        tally.calls += 1
        tally.seconds += self._now() - t0
        tally.gflop += flops(spec, args, out) / 1e9

    def wrap(self, spec: OpSpec, impl: Impl, op, operands: dict):
        key = (spec.stage, spec.op_kind, spec.layer_role)
        self.precision[key] = impl.precision
        return observe(op, lambda args, out, t0: self._record(key, spec, t0, args, out), self._now)

    def rows(self, timings, peaks: dict[str, float]) -> list[dict]:
        """One row per (stage, op family), then ``glue`` and ``total`` per stage, in time order."""
        stage_s = {"prefill": timings.prefill_s, "decode": timings.decode_s}
        rows = []
        for stage in ("prefill", "decode"):
            keys = sorted((k for k in self.tallies if k[0] == stage), key=lambda k: -self.tallies[k].seconds)
            covered = 0.0
            for k in keys:
                t = self.tallies[k]
                covered += t.seconds
                dtype = self.precision[k]
                rate = t.gflop / t.seconds if t.gflop and t.seconds else None
                peak = peaks.get(dtype)
                rows.append({"stage": stage, "family": f"{k[1]}:{k[2]}", "dtype": dtype, "calls": t.calls,
                             "ms": t.seconds * 1e3, "gflop": t.gflop, "gflops": rate,
                             "of_peak": rate / peak if rate and peak else None,
                             "share": t.seconds / stage_s[stage] if stage_s[stage] else None})
            glue = max(stage_s[stage] - covered, 0.0)
            rows.append({"stage": stage, "family": "glue (not in any op)", "dtype": "", "calls": None,
                         "ms": glue * 1e3, "gflop": 0.0, "gflops": None, "of_peak": None,
                         "share": glue / stage_s[stage] if stage_s[stage] else None})
            gf = sum(self.tallies[k].gflop for k in keys)
            rows.append({"stage": stage, "family": "total", "dtype": "", "calls": None, "ms": stage_s[stage] * 1e3,
                         "gflop": gf, "gflops": gf / stage_s[stage] if stage_s[stage] else None,
                         "of_peak": None, "share": 1.0})
        return rows

    def chunk_gflop(self) -> float:
        return sum(t.gflop for t in self.tallies.values())


def observe(op, record: Callable[[tuple, object, float], None], clock: Callable[[], float] = time.perf_counter):
    """``op`` calling ``record(args, out, t0)`` after each of its calls (``t0``: ``clock()`` at the call's
    start; ``args``: the positional arguments, then the keyword ones (a residual) in call order, so that a
    replay ``op(*args)`` is the same call). An ``nn.Module`` op keeps its type (forward hooks); a plain
    callable gets a wrapper that passes other attributes (rope's ``tables``) to it."""
    if isinstance(op, nn.Module):
        started: list[float] = []

        def before(mod, args, kwargs) -> None:
            started.append(clock())

        def after(mod, args, kwargs, out) -> None:  # returns None: the op's output stays
            record(args + tuple(kwargs.values()), out, started.pop())

        op.register_forward_pre_hook(before, with_kwargs=True)
        op.register_forward_hook(after, with_kwargs=True)
        return op
    return _Observed(op, record, clock)


class _Observed:
    def __init__(self, op, record, clock):
        self._op, self._record, self._clock = op, record, clock

    def __call__(self, *args, **kwargs):
        t0 = self._clock()
        out = self._op(*args, **kwargs)
        self._record(args + tuple(kwargs.values()), out, t0)
        return out

    def __getattr__(self, name):
        return getattr(self._op, name)


def measure_peaks(n: int = 2048, repeats: int = 10) -> dict[str, float]:
    """GFLOP/s (GOPS for int8) of an n x n x n matmul per dtype on the current threads: fp32 and bf16 through
    ``torch.mm`` (MKL, oneDNN with AMX where present), int8 through ``torch._int_mm``; best of ``repeats``."""
    out = {}
    for dtype in PEAK_DTYPES:
        if dtype == "int8":
            a = torch.randint(-128, 127, (n, n), dtype=torch.int8)
            b = torch.randint(-128, 127, (n, n), dtype=torch.int8)
            fn = lambda: torch._int_mm(a, b)  # noqa: E731
        else:
            dt = torch.float32 if dtype == "fp32" else torch.bfloat16
            a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
            fn = lambda: torch.mm(a, b)  # noqa: E731
        try:
            for _ in range(2):
                fn()
        except RuntimeError:
            continue  # the dtype has no matmul on this build/CPU: no peak, no fraction
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        out[dtype] = 2.0 * n ** 3 / best / 1e9
    return out


def format_rows(rows: list[dict], peaks: dict[str, float]) -> str:
    head = ("stage", "op family", "dtype", "calls", "ms", "share", "GFLOP", "GFLOP/s", "of peak")
    lines = ["peak matmul rate in this run (GFLOP/s, 2048^3): "
             + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()), "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]
    for r in rows:
        cells = (r["stage"], r["family"], r["dtype"], "" if r["calls"] is None else str(r["calls"]), f"{r['ms']:.1f}",
                 "" if r["share"] is None else f"{100 * r['share']:.0f}%", f"{r['gflop']:.1f}" if r["gflop"] else "",
                 f"{r['gflops']:.0f}" if r["gflops"] else "", f"{100 * r['of_peak']:.0f}%" if r["of_peak"] else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["OpProbe", "Tally", "flops", "format_rows", "measure_peaks", "observe", "PEAK_DTYPES"]

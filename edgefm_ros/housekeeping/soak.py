"""What a long run is judged by: per-process resources from /proc, growth per hour fitted over the samples
after a warm-up, the pass rules of the soak (benchmarks/soak.py), and its plot as SVG (no plotting library).

    row = {"t_min": 3.0, "nodes": {"vla_node": proc_sample(pid), ...}, "shm_files": 40, ...}
    verdict = judge(rows, SoakRules())
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

NODE_METRICS = ("rss_mb", "fds", "threads")


def proc_sample(pid: int) -> dict[str, float]:
    """RSS (MB), open file descriptors and threads of process ``pid``; NaN for a process gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        rss_kb = float(status["VmRSS"].split()[0])
        threads = float(status["Threads"])
        fds = float(len(os.listdir(f"/proc/{pid}/fd")))
    except (FileNotFoundError, ProcessLookupError, KeyError, PermissionError):
        return dict.fromkeys(NODE_METRICS, math.nan)
    return {"rss_mb": rss_kb / 1024.0, "fds": fds, "threads": threads}


def slope_per_hour(t_min: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of ``y`` against time, per hour; NaN with fewer than two finite points."""
    t = np.asarray(t_min, dtype=np.float64)
    v = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(v)
    if ok.sum() < 2 or np.ptp(t[ok]) == 0:
        return math.nan
    return float(np.polyfit(t[ok] / 60.0, v[ok], 1)[0])


@dataclass(frozen=True)
class SoakRules:
    """Pass rules. ``warmup_min``: samples before it are not judged (model load, allocator, caches).
    RSS: a run of ``long_run_min`` or more is judged by its fitted growth per hour (< ``rss_pct_per_h``
    of the value at the warm-up's end); a shorter run cannot resolve that rate against a process's normal
    swing, and is judged by its total growth after the warm-up (< ``rss_pct_short`` of that value).
    fds, threads, the graph's /dev/shm files: at most ``flat_tolerance`` above the value at the warm-up's end,
    ever; no stale Fast DDS file may appear (``shm_stale_new``, from the start).
    Control: p99 |period error| over the judged ticks within ``period_error_frac`` of the period.
    Success: the first and last ``compare_min`` minutes (a third of the run each when shorter) differ by
    less than two standard errors of the difference (two-proportion z), and by at most ``success_drop``."""
    warmup_min: float = 5.0
    rss_pct_per_h: float = 2.0
    long_run_min: float = 30.0
    rss_pct_short: float = 2.0
    flat_tolerance: float = 0.0
    period_error_frac: float = 0.10
    compare_min: float = 10.0
    success_drop: float = 0.15

    def __post_init__(self):
        for name in ("warmup_min", "rss_pct_per_h", "long_run_min", "rss_pct_short", "flat_tolerance",
                     "period_error_frac", "compare_min", "success_drop"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"SoakRules.{name} must be a finite number >= 0, got {v!r}")


def judged(rows: Sequence[Mapping], rules: SoakRules) -> list[Mapping]:
    return [r for r in rows if r["t_min"] >= rules.warmup_min]


def growth(rows: Sequence[Mapping], rules: SoakRules) -> dict:
    """Growth per hour after the warm-up: every node metric, /dev/shm files and MB, and the run's own
    figures (control p99 error, latency p50)."""
    rows_j = judged(rows, rules)
    t = [r["t_min"] for r in rows_j]
    out: dict = {"nodes": {}}
    for node in sorted({n for r in rows for n in r["nodes"]}):
        m = {}
        for k in NODE_METRICS:
            y = [r["nodes"].get(node, {}).get(k, math.nan) for r in rows_j]
            m[f"{k}_per_h"] = slope_per_hour(t, y)
        base = next((r["nodes"][node]["rss_mb"] for r in rows_j if node in r["nodes"]), math.nan)
        m["rss_pct_per_h"] = 100.0 * m["rss_mb_per_h"] / base if base else math.nan
        out["nodes"][node] = m
    for k in ("shm_files", "shm_mb", "period_error_p99_ms", "latency_p50_ms"):
        out[f"{k}_per_h"] = slope_per_hour(t, [r.get(k, math.nan) for r in rows_j])
    return out


def _success(rows: Sequence[Mapping]) -> tuple[int, int]:
    return sum(r["episodes_success"] for r in rows), sum(r["episodes_done"] for r in rows)


def judge(rows: Sequence[Mapping], rules: SoakRules, control_period_s: float,
          period_errors_ms: Sequence[float] = ()) -> dict:
    """Each rule's verdict: {"rule": (ok, "what was measured")}; ``period_errors_ms``: every judged tick's
    |period error|, for the run's p99 (per-window p99s are in the rows)."""
    rows_j = judged(rows, rules)
    if len(rows_j) < 2:
        return {"samples": (False, f"{len(rows_j)} samples after the {rules.warmup_min:g} min warm-up; need 2")}
    span = rows_j[-1]["t_min"] - rows_j[0]["t_min"]
    g = growth(rows, rules)
    v: dict = {}
    for node, m in g["nodes"].items():
        first = rows_j[0]["nodes"].get(node, {})
        last = rows_j[-1]["nodes"].get(node, {})
        if not all(math.isfinite(x.get("rss_mb", math.nan)) for x in (first, last)):
            v[f"{node} alive"] = (False, "process gone during the run")
            continue
        if rows[-1]["t_min"] >= rules.long_run_min:
            ok = m["rss_pct_per_h"] < rules.rss_pct_per_h
            v[f"{node} RSS"] = (ok, f"{m['rss_pct_per_h']:+.2f} %/h fitted ({m['rss_mb_per_h']:+.1f} MB/h, "
                                    f"limit {rules.rss_pct_per_h:g} %/h)")
        else:
            pct = 100.0 * (last["rss_mb"] - first["rss_mb"]) / first["rss_mb"]
            ok = pct < rules.rss_pct_short
            v[f"{node} RSS"] = (ok, f"{pct:+.2f} % over {span:.1f} min after warm-up (limit {rules.rss_pct_short:g} %"
                                    f"; fitted {m['rss_pct_per_h']:+.1f} %/h)")
        for k in ("fds", "threads"):
            worst = max(r["nodes"].get(node, {}).get(k, math.nan) for r in rows_j) - first[k]
            v[f"{node} {k}"] = (worst <= rules.flat_tolerance, f"{first[k]:.0f} -> max +{worst:.0f}")
    worst = max(r["shm_files"] for r in rows_j) - rows_j[0]["shm_files"]
    stale = max(r.get("shm_stale_new", 0) for r in rows)
    v["/dev/shm files"] = (worst <= rules.flat_tolerance and stale == 0,
                           f"the graph maps {rows_j[0]['shm_files']} -> max +{worst}; stale new files: max {stale}")
    bound_ms = rules.period_error_frac * control_period_s * 1e3
    e = np.asarray(period_errors_ms, dtype=np.float64)
    p99 = float(np.percentile(e, 99)) if e.size else math.nan
    v["control p99 period error"] = (bool(p99 <= bound_ms), f"{p99:.2f} ms over {e.size} ticks (bound {bound_ms:.1f} ms)")
    total = rows[-1]["t_min"]
    cmp_min = min(rules.compare_min, total / 3.0)
    first_w = [r for r in rows if r["t_min"] <= cmp_min]
    last_w = [r for r in rows if r["t_min"] > total - cmp_min]
    (s1, n1), (s2, n2) = _success(first_w), _success(last_w)
    if n1 == 0 or n2 == 0:
        v["success first vs last"] = (False, f"no episode finished in a window ({n1}, {n2})")
    else:
        p1, p2 = s1 / n1, s2 / n2
        pooled = (s1 + s2) / (n1 + n2)
        se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / n1 + 1 / n2))
        z = (p1 - p2) / se
        ok = (z < 2.0) and (p1 - p2) <= rules.success_drop
        v["success first vs last"] = (ok, f"first {cmp_min:.1f} min {s1}/{n1} ({p1:.0%}), last {s2}/{n2} "
                                          f"({p2:.0%}), z {z:+.2f}")
    return v


def svg(rows: Sequence[Mapping], title: str, width: int = 900, panel_h: int = 150) -> str:
    """The run as stacked line charts: RSS per node, fds and threads per node, /dev/shm files, control p99
    period error, observation-to-chunk latency p50, success per window."""
    t = [r["t_min"] for r in rows]
    nodes = sorted({n for r in rows for n in r["nodes"]})
    panels = [("RSS (MB)", {n: [r["nodes"].get(n, {}).get("rss_mb", math.nan) for r in rows] for n in nodes}),
              ("open fds", {n: [r["nodes"].get(n, {}).get("fds", math.nan) for r in rows] for n in nodes}),
              ("threads", {n: [r["nodes"].get(n, {}).get("threads", math.nan) for r in rows] for n in nodes}),
              ("/dev/shm Fast DDS files the graph maps", {"files": [r["shm_files"] for r in rows]}),
              ("control p99 |period error| (ms)", {"p99": [r["period_error_p99_ms"] for r in rows]}),
              ("observation->chunk p50 (ms)", {"p50": [r["latency_p50_ms"] for r in rows]}),
              ("task success per window", {"success": [r["episodes_success"] / r["episodes_done"]
                                                       if r["episodes_done"] else math.nan for r in rows]})]
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    left, right, top = 70, 160, 30
    h = top + len(panels) * (panel_h + 30)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif" '
           f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="18" font-size="14">{_esc(title)}</text>']
    t0, t1 = (min(t), max(t)) if t else (0.0, 1.0)
    t1 = t1 if t1 > t0 else t0 + 1.0
    for i, (name, series) in enumerate(panels):
        y0 = top + i * (panel_h + 30) + 15
        vals = [v for s in series.values() for v in s if math.isfinite(v)]
        lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
        pad = (hi - lo) * 0.1 or max(abs(hi) * 0.05, 1e-3)
        lo, hi = lo - pad, hi + pad
        pw = width - left - right
        out.append(f'<rect x="{left}" y="{y0}" width="{pw}" height="{panel_h}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{left}" y="{y0 - 4}">{_esc(name)}</text>')
        out.append(f'<text x="{left - 4}" y="{y0 + 10}" text-anchor="end">{hi:.4g}</text>')
        out.append(f'<text x="{left - 4}" y="{y0 + panel_h}" text-anchor="end">{lo:.4g}</text>')
        for j, (label, ys) in enumerate(series.items()):
            pts = [f"{left + (tx - t0) / (t1 - t0) * pw:.1f},{y0 + panel_h - (v - lo) / (hi - lo) * panel_h:.1f}"
                   for tx, v in zip(t, ys) if math.isfinite(v)]
            c = colours[j % len(colours)]
            if pts:
                out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{" ".join(pts)}"/>')
            out.append(f'<text x="{left + pw + 8}" y="{y0 + 12 + 13 * j}" fill="{c}">{_esc(label)}</text>')
    out.append(f'<text x="{left}" y="{h - 6}">minutes: {t0:.1f} .. {t1:.1f}</text></svg>')
    return "\n".join(out)


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

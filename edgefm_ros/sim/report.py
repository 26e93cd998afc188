"""The evaluation report shared by ``edgefm-sim eval --exec sync`` and ``--exec ros`` (no ROS): task success,
time to success, smoothness of the commanded trajectory, and whatever timing the executor measured
(control rate, inference latency, queue underruns), as JSON and as a terminal table.

    outcomes = [EpisodeOutcome("reach", 1000, True, 1.35, commands, boundaries), ...]
    report = make_report(outcomes, exec_mode="ros", checkpoint=ckpt, control_hz=20.0, timing={...})
    print(format_table(report)); write_report(report, "eval.json")

Smoothness is computed on the end-effector xyz of the commands (the gripper is an effort, not a position):
RMS jerk = RMS over time of |third difference| / period^3 (m/s^3); the boundary jump is the largest
|c[b] - c[b-1]| (m) over the commands b where a new chunk took over.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class EpisodeOutcome:
    task: str
    seed: int
    success: bool
    time_to_success_s: float  # NaN when the episode failed
    commands: np.ndarray  # float [N, 4]: the commanded targets (xyz + gripper), one per control period
    boundaries: tuple[int, ...] = ()  # indices into commands where a new chunk's first action was commanded
    extra: Mapping[str, float] | None = None  # per-episode numbers an executor adds (e.g. real-time factor)
    condition: str = "clean"  # the camera condition (sim.conditions) the episode ran under
    instruction: str = ""  # the instruction it was given ("" when not recorded)

    def __post_init__(self) -> None:
        c = np.asarray(self.commands, dtype=np.float64)
        if c.ndim != 2 or (c.size and c.shape[1] < 3):
            raise ValueError(f"EpisodeOutcome {self.task}:{self.seed}: commands must be [N, >=3], got {c.shape}")
        object.__setattr__(self, "commands", c.reshape(-1, c.shape[1] if c.ndim == 2 else 4))
        bad = [b for b in self.boundaries if not 0 <= b < max(len(c), 1)]
        if bad:
            raise ValueError(f"EpisodeOutcome {self.task}:{self.seed}: boundaries {bad} outside [0, {len(c)})")


def smoothness(commands: np.ndarray, period_s: float, boundaries: Sequence[int] = ()) -> dict[str, float]:
    """{rms_jerk (m/s^3), max_boundary_jump (m), max_step (m)} of one episode's commanded xyz [N, >=3]."""
    if not (period_s > 0 and math.isfinite(period_s)):
        raise ValueError(f"period_s must be a positive number, got {period_s!r}")
    p = np.asarray(commands, dtype=np.float64)[:, :3]
    out = {"rms_jerk": math.nan, "max_boundary_jump": math.nan, "max_step": math.nan}
    if len(p) >= 2:
        step = np.linalg.norm(np.diff(p, axis=0), axis=1)  # (N-1,) |c[k+1] - c[k]|
        out["max_step"] = float(step.max())
        jumps = [step[b - 1] for b in boundaries if b >= 1]
        out["max_boundary_jump"] = float(max(jumps)) if jumps else math.nan
    if len(p) >= 4:
        jerk = np.diff(p, n=3, axis=0) / period_s ** 3  # (N-3, 3)
        out["rms_jerk"] = float(np.sqrt(np.mean(np.sum(jerk ** 2, axis=1))))
    return out


def _nanmean(x) -> float:
    a = np.asarray([v for v in x if v is not None and math.isfinite(v)], dtype=np.float64)
    return float(a.mean()) if a.size else math.nan


def _nanmax(x) -> float:
    a = np.asarray([v for v in x if v is not None and math.isfinite(v)], dtype=np.float64)
    return float(a.max()) if a.size else math.nan


def make_report(outcomes: Sequence[EpisodeOutcome], *, exec_mode: str, checkpoint: str, control_hz: float,
                timing: Mapping[str, object] | None = None, settings: Mapping[str, object] | None = None) -> dict:
    """The JSON report. ``timing``: the executor's control-rate / latency / underrun numbers (kept as given
    under their keys: "control", "inference_latency_ms", "queue_underruns", ...); ``settings``: how it ran."""
    if not outcomes:
        raise ValueError("make_report: no episodes")
    period = 1.0 / control_hz
    per_ep = []
    for o in outcomes:
        s = smoothness(o.commands, period, o.boundaries)
        per_ep.append({"task": o.task, "seed": o.seed, "condition": o.condition, "instruction": o.instruction,
                       "success": bool(o.success),
                       "time_to_success_s": o.time_to_success_s if o.success else None,
                       "commands": int(len(o.commands)), "chunks": int(len(o.boundaries)), **s,
                       **dict(o.extra or {})})
    tasks: dict[str, dict] = {}
    for name in dict.fromkeys(o.task for o in outcomes):
        eps = [e for e in per_ep if e["task"] == name]
        ok = [e for e in eps if e["success"]]
        tasks[name] = {"success_rate": len(ok) / len(eps), "episodes": len(eps), "successes": len(ok),
                       "mean_time_to_success_s": _nanmean(e["time_to_success_s"] for e in ok),
                       "rms_jerk": _nanmean(e["rms_jerk"] for e in eps),
                       "max_boundary_jump": _nanmax(e["max_boundary_jump"] for e in eps)}
    conditions: dict[str, dict] = {}
    for name in dict.fromkeys(o.condition for o in outcomes):
        eps = [e for e in per_ep if e["condition"] == name]
        ok = sum(e["success"] for e in eps)
        conditions[name] = {"success_rate": ok / len(eps), "episodes": len(eps), "successes": ok}
    n_ok = sum(e["success"] for e in per_ep)
    report = {
        "exec": exec_mode, "checkpoint": checkpoint, "control_hz": control_hz,
        "success_rate": n_ok / len(per_ep), "episodes": len(per_ep), "successes": n_ok,
        "mean_task_success_rate": _nanmean(t["success_rate"] for t in tasks.values()),
        "mean_time_to_success_s": _nanmean(e["time_to_success_s"] for e in per_ep if e["success"]),
        "tasks": tasks,
        "conditions": conditions,
        "smoothness": {"rms_jerk": _nanmean(e["rms_jerk"] for e in per_ep),
                       "max_boundary_jump": _nanmax(e["max_boundary_jump"] for e in per_ep),
                       "max_step": _nanmax(e["max_step"] for e in per_ep),
                       "units": {"rms_jerk": "m/s^3 (end-effector xyz command)", "max_boundary_jump": "m",
                                 "max_step": "m"}},
        "settings": dict(settings or {}),
        "episodes_detail": per_ep,
    }
    report.update(dict(timing or {}))
    return report


def _f(x, fmt: str = ".2f", none: str = "-") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return none
    return none if math.isnan(v) else format(v, fmt)


def format_table(report: Mapping) -> str:
    """The report as a terminal table: one row per task, a total row, then the timing lines."""
    head = f"{'task':<22} {'success':>9} {'rate':>6} {'t_success_s':>12} {'rms_jerk':>9} {'max_jump_mm':>12}"
    lines = [f"edgefm-sim eval --exec {report['exec']}: {report['checkpoint']}", head, "-" * len(head)]
    for name, t in report["tasks"].items():
        lines.append(f"{name:<22} {t['successes']:>4}/{t['episodes']:<4} {_f(t['success_rate']):>6} "
                     f"{_f(t['mean_time_to_success_s']):>12} {_f(t['rms_jerk'], '.1f'):>9} "
                     f"{_f(t['max_boundary_jump'] * 1e3 if t['max_boundary_jump'] is not None else None, '.1f'):>12}")
    sm = report["smoothness"]
    lines.append("-" * len(head))
    lines.append(f"{'all':<22} {report['successes']:>4}/{report['episodes']:<4} {_f(report['success_rate']):>6} "
                 f"{_f(report['mean_time_to_success_s']):>12} {_f(sm['rms_jerk'], '.1f'):>9} "
                 f"{_f(sm['max_boundary_jump'] * 1e3, '.1f'):>12}")
    conds = report.get("conditions") or {}
    if len(conds) > 1 or any(n != "clean" for n in conds):
        lines.append("camera   : " + ", ".join(f"{n} {c['successes']}/{c['episodes']}" for n, c in conds.items()))
    c = report.get("control")
    if isinstance(c, Mapping):
        lines.append(f"control  : {_f(c.get('rate_hz'))} Hz (target {_f(report['control_hz'])}), |period error| "
                     f"p50 {_f(c.get('period_error_ms_p50'))} ms p99 {_f(c.get('period_error_ms_p99'))} ms, "
                     f"missed {_f(c.get('missed'), '.0f')}")
    lat = report.get("inference_latency_ms")
    if isinstance(lat, Mapping):
        lines.append(f"latency  : observation->chunk p50 {_f(lat.get('p50'), '.1f')} ms p99 "
                     f"{_f(lat.get('p99'), '.1f')} ms max {_f(lat.get('max'), '.1f')} ms"
                     + (f" (incl. {_f(report['settings'].get('delay_ms'), '.0f')} ms added delay)"
                        if report["settings"].get("delay_ms") else ""))
    u = report.get("queue_underruns")
    if isinstance(u, Mapping):
        lines.append(f"queue    : {u.get('after_warmup')} underruns after warm-up "
                     f"({u.get('total')} in all) of {u.get('ticks')} control ticks")
    sim = report.get("simulation")
    if isinstance(sim, Mapping):
        lines.append(f"sim      : real-time factor min {_f(sim.get('real_time_factor_min'), '.3f')} mean "
                     f"{_f(sim.get('real_time_factor_mean'), '.3f')}, slipped {_f(sim.get('slipped_s'), '.3f')} s, "
                     f"max physics gap {_f(sim.get('max_physics_gap_ms'), '.1f')} ms")
    return "\n".join(lines)


def write_report(report: Mapping, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_clean(report), indent=2, default=_json_default, allow_nan=False) + "\n")


def _clean(x):
    """NaN -> null (strict JSON), recursively."""
    if isinstance(x, float):
        return None if math.isnan(x) else x
    if isinstance(x, Mapping):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x)}")

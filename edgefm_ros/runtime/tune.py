"""``edgefm-vla tune``: the kernel search (dispatch/search.py) over every op the SmolVLA engine runs.

The engine is built once with a ``SiteProbe`` around every kernel and runs one chunk; each site found is
searched and its winner written to config/dispatch/<hw_profile>.yaml. Finally the engine is built with
the written table and checked end to end against exact mode.
"""
from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from edgefm_ros.dispatch.hardware import detect
from edgefm_ros.dispatch.modes import TUNABLE, check_mode
from edgefm_ros.dispatch.resolver import tuned_table_path
from edgefm_ros.dispatch.search import (FORMAT, MIN_SITE_S, SEARCHED, Site, SiteProbe, candidates, default_choice,
                                        library_versions, pick_winner, read_table, search_site, search_space,
                                        site_record, with_defaults, write_table)

from .engine import Engine

E2E_BOUNDS = {"rms": 0.02, "max": 0.1}  # fast vs exact actions, normalised units


def capture_sites(checkpoint, vlm_dir=None, mode: str = "fast", threads: int | None = None,
                  vision_position_ids: str = "auto") -> tuple[list[Site], Engine]:
    """Every distinct op site of the model as built for ``mode``, with its real call shapes."""
    sites: dict = {}
    engine = Engine.from_checkpoint(checkpoint, vlm_dir, mode=mode, threads=threads, use_tuned=False,
                                    vision_position_ids=vision_position_ids, probe=SiteProbe(sites))
    engine.warmup()
    return [s for s in sites.values() if s.args is not None], engine


# ---- end to end -----------------------------------------------------------------------------------
def end_to_end(checkpoint, vlm_dir, table: Path, mode: str, engine_exact: Engine | None = None,
               seed: int = 0, vision_position_ids: str = "auto") -> dict:
    """Actions of the engine with ``table`` vs exact mode on one synthetic observation (same noise)."""
    tuned = Engine.from_checkpoint(checkpoint, vlm_dir, mode=mode, tables=[table], use_tuned=False,
                                   vision_position_ids=vision_position_ids)
    exact = engine_exact or Engine.from_checkpoint(checkpoint, vlm_dir, mode="exact",
                                                   vision_position_ids=vision_position_ids)
    obs = exact.synthetic_observation(seed)
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((exact.spec.chunk_size, exact.spec.max_action_dim)).astype(np.float32)
    inp_t, inp_e = tuned.inputs_from_observation(obs), exact.inputs_from_observation(obs)
    nz = torch.as_tensor(noise)[None]
    d = (tuned.sample(inp_t, nz) - exact.sample(inp_e, nz))[..., :exact.spec.action_dim]
    rms, mx = d.pow(2).mean().sqrt().item(), d.abs().max().item()
    return {"rms": float(f"{rms:.3g}"), "max": float(f"{mx:.3g}"),
            "ok": bool(rms <= E2E_BOUNDS["rms"] and mx <= E2E_BOUNDS["max"])}


# ---- the search -----------------------------------------------------------------------------------
def tune(checkpoint, vlm_dir=None, out_path=None, budget_s: float = 600.0, dry_run: bool = False,
         resume: bool = True, mode: str = "fast", threads: int | None = None, log: Callable = print,
         check_end_to_end: bool = True, rounds: int = 7, min_site_s: float = MIN_SITE_S,
         verbose: bool = False, vision_position_ids: str = "auto") -> int:
    """Search every site of the model; write the winners. Returns 0, or 1 when the end-to-end check fails."""
    check_mode(mode, TUNABLE, "tune mode")
    if budget_s <= 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")
    t_start = time.perf_counter()
    hw = detect("cpu")
    out = Path(out_path) if out_path else tuned_table_path(hw.profile)
    sites, engine = capture_sites(checkpoint, vlm_dir, mode, threads, vision_position_ids)
    steps = engine.model_config.num_steps  # decode sites run once per Euler step
    untuned = engine.resolver.table  # what the engine runs without a tuned table: built-ins + skills
    del engine  # only its sites and tables are needed: free the weights before timing
    searched = [s for s in sites if s.spec.op_kind in SEARCHED]
    log(f"tune: {len(sites)} op sites ({sum(s.count for s in sites)} ops) on {hw.profile} ({hw.name}, "
        f"{hw.threads} threads), mode {mode}; searching {len(searched)} -> {out}")
    if dry_run:
        for row in search_space(sites, mode):
            log(f"  {row['site']}  x{row['ops']}  args {row['args']}")
            log(f"      candidates: {', '.join(row['candidates']) or '(not searched)'}")
            for label, why in row["rejected"]:
                log(f"      rejected {label}: {why}")
        return 0
    meta = {"format": FORMAT, "generator": "edgefm-vla tune", "hw_profile": hw.profile,
            "hw": {"name": hw.name, "fingerprint": hw.fingerprint, "threads": hw.threads},
            "versions": library_versions(), "mode": mode, "checkpoint": "/".join(Path(checkpoint).resolve().parts[-2:]),
            "complete": False}
    old = read_table(out) if resume else {}
    done = {}
    if old.get("hw", {}).get("fingerprint") == hw.fingerprint and old.get("mode") == mode:
        for rec in old.get("records", []):
            done[(rec["op_kind"], rec["layer_role"], rec["stage"], rec["shape_sig"])] = rec
    records = list(done.values())
    if done:
        log(f"tune: resuming, {len(done)} site(s) already in {out}")
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    provenance = {"date": date, "torch": str(torch.__version__), "hw": hw.fingerprint}
    skipped = []
    for site in sorted(searched, key=lambda s: s.name()):
        if site.key in done:
            continue
        if time.perf_counter() - t_start > budget_s:
            skipped.append(site.name())
            continue
        cands, rejected = candidates(site, mode)
        results = search_site(site, cands, rounds=rounds, min_site_s=min_site_s)
        ok = sorted((r for r in results if not r.failure and r.times_ms), key=lambda r: r.median_ms)
        for r in results:
            if r.failure:
                log(f"  dropped {site.name()} {r.label}: {r.failure}")
            elif verbose:
                log(f"    {site.name()} {r.label}: {r.median_ms:.3f} ms (min {min(r.times_ms):.3f}, err {r.error:.1e})")
        if not ok:
            log(f"  {site.name()}: no candidate survived; keeping the built-in record")
            continue
        d_id, d_params = default_choice(site, untuned)
        default = next((r for r in ok if r.impl_id == d_id and r.params == with_defaults(r.impl_id, site, d_params)),
                       None)
        best = pick_winner(ok, site.count * (steps if site.spec.stage == "decode" else 1))
        runner_up = next((r for r in ok if r is not best), None)
        records.append(site_record(site, hw.profile, best, runner_up, default, provenance))
        write_table(out, meta, records)
        vs = f", default {default.label} {default.median_ms:.3f} ms" if default is not None else ""
        log(f"  {site.name()} x{site.count}: {best.label} {best.median_ms:.3f} ms (err {best.error:.1e}){vs}")
    meta["complete"] = not skipped
    if skipped:
        meta["remaining"] = skipped
        log(f"tune: budget of {budget_s:.0f} s spent; {len(skipped)} site(s) left for --resume: {skipped}")
    write_table(out, meta, records)
    status = 0
    if check_end_to_end and records:
        e2e = end_to_end(checkpoint, vlm_dir, out, mode, vision_position_ids=vision_position_ids)
        meta["end_to_end"] = e2e
        write_table(out, meta, records)
        log(f"tune: end to end vs exact: action rms {e2e['rms']}, max {e2e['max']} "
            f"(bounds {E2E_BOUNDS['rms']}, {E2E_BOUNDS['max']}): {'ok' if e2e['ok'] else 'FAILED'}")
        status = 0 if e2e["ok"] else 1
    log(f"tune: wrote {len(records)} record(s) to {out} in {time.perf_counter() - t_start:.0f} s")
    return status

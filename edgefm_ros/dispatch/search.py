"""Kernel search, the model-independent part: for every op site a model runs, find the fastest verified
implementation and write it as a dispatch-table record (``edgefm-vla tune`` drives it: runtime/tune.py).

1. Sites: a ``SiteProbe`` handed to an engine build turns each distinct (op_kind, layer_role, stage,
   shape_sig) into a site with its build operands' shapes and the shapes/dtypes its kernels are actually
   called with (the mode's activation dtypes included).
2. Candidates: every registered impl of the op kind whose parameter combination the impl accepts for
   this hardware (fp32 impls only in exact mode).
3. Verify: each candidate and the op's PyTorch reference are built from the same fresh random operands
   and run on fresh random inputs (the reference in fp32); relative max error over the dtype's bound
   -> reported and dropped.
4. Time: survivors interleaved round by round (warm-up first) over several input sets; median.
5. Write: the winner per site as a table record with provenance (time, error, runner-up, the
   built-in default's time, versions, date, hardware fingerprint) to config/dispatch/<hw_profile>.yaml,
   after every site, so an interrupted or budget-limited run resumes where it stopped.
"""
from __future__ import annotations

import itertools
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import yaml

from edgefm_kernels.registry import Impl, OpSpec, impls_for

from .profile import observe
from .table import Table

SEARCHED = ("linear", "mlp", "attention", "rms_norm", "layer_norm", "rope", "patch_embed", "pixel_shuffle")
BOUNDS = {"fp32": 2e-5, "bf16": 3e-2, "fp16": 1e-2, "int8": 6e-2, "fp8": 1.5e-1}  # relative to max |ref|
FORMAT = 1
MIN_SITE_S, MAX_ROUNDS = 0.3, 60  # fast ops get more rounds: at least this long timing each site
PRECISION_RANK = {"fp32": 3, "bf16": 2, "fp16": 2, "int8": 1, "fp8": 0}
PREFER_PRECISE = 0.10
# ... nor a saving too small to matter: a quantised winner (below bf16) must save this much time per chunk
MIN_SAVED_MS = 3.0


# ---- sites --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSig:
    shape: tuple[int, ...]
    dtype: torch.dtype


def signature(value: Any) -> Any:
    """Tensors -> TensorSig, containers kept, other values as they are."""
    if isinstance(value, torch.Tensor):
        return TensorSig(tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(signature(v) for v in value)
    if isinstance(value, Mapping):
        return {k: signature(v) for k, v in value.items()}
    return value


@dataclass
class Site:
    spec: OpSpec
    operands: dict  # build operands as signatures
    args: tuple | None = None  # first call's arguments as signatures
    count: int = 1  # ops sharing this key

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.spec.op_kind, self.spec.layer_role, self.spec.stage, self.spec.shape_sig)

    def name(self) -> str:
        return "/".join(self.key)


class SiteProbe:
    """``Engine(probe=...)``: the first op of each (op_kind, layer_role, stage, shape_sig) becomes a site that
    records its first call's argument signatures; later ops of the same key only count."""

    def __init__(self, sites: dict):
        self.sites = sites

    def wrap(self, spec: OpSpec, impl: Impl, op, operands: dict):
        key = (spec.op_kind, spec.layer_role, spec.stage, spec.shape_sig)
        if key in self.sites:
            self.sites[key].count += 1
            return op
        site = self.sites[key] = Site(spec, signature(operands))

        def first_call(args, out, t0) -> None:
            if site.args is None:
                site.args = signature(args)

        return observe(op, first_call)


# ---- candidates and inputs ----------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    impl: Impl
    params: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.impl.impl_id}({p})" if p else self.impl.impl_id


def param_grid(impl: Impl) -> list[dict]:
    names = sorted(impl.param_space)
    values = [impl.param_space[n] or (None,) for n in names]
    return [{n: v for n, v in zip(names, combo) if v is not None} for combo in itertools.product(*values)]


def candidates(site: Site, mode: str) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """(accepted candidates, [(label, why rejected)])."""
    accepted, rejected = [], []
    for impl in impls_for(site.spec.op_kind):
        for params in param_grid(impl):
            cand = Candidate(impl, params)
            if mode == "exact" and impl.precision != "fp32":
                rejected.append((cand.label, f"{impl.precision} is not allowed in exact mode"))
                continue
            why = impl.rejects(site.spec, params)
            if why:
                rejected.append((cand.label, why))
            else:
                accepted.append(cand)
    return accepted, rejected


def reference_impl(op_kind: str) -> Impl:
    refs = [i for i in impls_for(op_kind) if i.reference]
    if not refs:
        raise ValueError(f"op kind {op_kind!r} has no reference implementation")
    return refs[0]


def _weight(sig: TensorSig, gen: torch.Generator, name: str) -> torch.Tensor:
    t = torch.randn(sig.shape, generator=gen)
    if name in ("weight", "bias") and len(sig.shape) == 1:  # norm parameters / biases
        return (1.0 + 0.1 * t) if name == "weight" else 0.1 * t
    fan_in = int(np.prod(sig.shape[1:])) if len(sig.shape) > 1 else 1
    return (t / fan_in ** 0.5).to(sig.dtype)


def make_operands(sig: Any, gen: torch.Generator, name: str = "") -> Any:
    """Fresh random tensors with the recorded shapes (weights scaled by fan-in)."""
    if isinstance(sig, TensorSig):
        if sig.dtype == torch.bool or not sig.dtype.is_floating_point:
            return torch.zeros(sig.shape, dtype=sig.dtype)
        return _weight(sig, gen, name)
    if isinstance(sig, (list, tuple)):
        return type(sig)(make_operands(v, gen, name) for v in sig)
    if isinstance(sig, Mapping):
        return {k: make_operands(v, gen, k) for k, v in sig.items()}
    return sig


def random_mask(shape, gen: torch.Generator) -> torch.Tensor:
    """bool [B, Lq, Lk]: random visibility, every row sees key 0, one row of batch 0 sees nothing."""
    m = torch.rand(shape, generator=gen) < 0.7
    m[..., 0] = True
    if shape[1] > 1:
        m[0, -1] = False
    return m


def make_inputs(site: Site, gen: torch.Generator) -> tuple:
    """Fresh call arguments shaped as recorded, in the recorded dtypes."""
    kind, args = site.spec.op_kind, site.args
    if kind == "attention":
        q, k, v, mask = args
        x = [torch.randn(s.shape, generator=gen).to(s.dtype) for s in (q, k, v)]
        return (*x, None if mask is None else random_mask(mask.shape, gen))
    if kind == "rope":
        x = args[0]
        b, length = x.shape[0], x.shape[1]
        return (torch.randn(x.shape, generator=gen).to(x.dtype), torch.randint(0, 4 * length, (b, length), generator=gen))
    return tuple(torch.randn(a.shape, generator=gen).to(a.dtype) for a in args)


def runner(site: Site, kernel) -> Callable:
    """kernel -> fn(inputs) running the op as the model does (rope makes its tables from positions)."""
    if site.spec.op_kind == "rope":
        head_dim = site.args[0].shape[-1]
        cache: dict = {}

        def run(inputs):
            x, pos = inputs
            tables = cache.get(id(pos))
            if tables is None:
                tables = cache[id(pos)] = (pos, kernel.tables(pos, head_dim))
            return kernel(x, tables[1])
        return run
    return lambda inputs: kernel(*inputs)


def build(site: Site, impl: Impl, params: dict, operands: dict):
    return impl.build(site.spec, dict(params), **operands)


def _as_fp32(inputs: tuple) -> tuple:
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs)


def rel_error(out, ref) -> float:
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    if len(outs) != len(refs):
        return float("inf")
    worst = 0.0
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            return float("inf")
        o, r = o.double(), r.double()
        if not torch.isfinite(o).all():
            return float("inf")
        worst = max(worst, ((o - r).abs().max() / r.abs().max().clamp_min(1e-12)).item())
    return worst


def dtype_mismatch(out, inputs: tuple) -> str | None:
    """Every op returns its (first floating) input's dtype: a bf16 stage must stay bf16."""
    want = next(t.dtype for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point())
    got = {o.dtype for o in (out if isinstance(out, tuple) else (out,))}
    if got != {want}:
        return f"returns {sorted(map(str, got))} for {want} inputs (the contract keeps the input's dtype)"
    return None


def pick_winner(ok: list[Result], calls_per_chunk: int = 1) -> Result:
    """The fastest (``ok`` sorted by time), unless a more precise survivor is within PREFER_PRECISE of it
    (noise is not a reason to lose precision). A quantised fastest (below bf16) must also save MIN_SAVED_MS
    per chunk over the fastest unquantised one (``calls_per_chunk``: how often a chunk runs the site), or the
    choice is made among the unquantised: quantisation goes only where it buys time."""
    def rank(r: Result) -> int:
        return PRECISION_RANK.get(r.precision, 0)

    def most_precise_within_noise(cands: list[Result]) -> Result:
        best = cands[0]
        for r in cands[1:]:
            if rank(r) > rank(best) and r.median_ms <= cands[0].median_ms * (1 + PREFER_PRECISE):
                best = r
        return best

    if rank(ok[0]) < PRECISION_RANK["bf16"]:
        plain = [r for r in ok if rank(r) >= PRECISION_RANK["bf16"]]
        if plain and (plain[0].median_ms - ok[0].median_ms) * calls_per_chunk < MIN_SAVED_MS:
            return most_precise_within_noise(plain)
    return most_precise_within_noise(ok)


def bound_for(cand: Candidate, site: Site) -> float:
    """The candidate's precision, or the activations' when coarser (bf16 inputs round the outputs)."""
    act = next((a.dtype for a in site.args if isinstance(a, TensorSig) and a.dtype.is_floating_point), torch.float32)
    act_class = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(act, "fp32")
    return max(BOUNDS.get(cand.impl.precision, BOUNDS["fp32"]), BOUNDS[act_class])


# ---- one site -----------------------------------------------------------------------------------
@dataclass
class Result:
    label: str
    impl_id: str
    params: dict
    error: float
    bound: float
    precision: str = "fp32"
    times_ms: list = field(default_factory=list)
    failure: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else float("inf")


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def search_site(site: Site, cands: list[Candidate], *, sets: int = 3, rounds: int = 7, warmup: int = 2,
                min_site_s: float = MIN_SITE_S, max_site_s: float = 60.0, seed: int | None = None) -> list[Result]:
    """Verify every candidate against the reference, then time the survivors interleaved."""
    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    operands = make_operands(site.operands, gen)
    ref = runner(site, build(site, reference_impl(site.spec.op_kind), {}, operands))
    check_inputs = make_inputs(site, gen)
    with torch.no_grad():
        expected = ref(_as_fp32(check_inputs))
    results, live = [], []
    for cand in cands:
        res = Result(cand.label, cand.impl.impl_id, dict(cand.params), float("nan"), bound_for(cand, site),
                     cand.impl.precision)
        results.append(res)
        try:
            fn = runner(site, build(site, cand.impl, cand.params, operands))
            with torch.no_grad():
                out = fn(check_inputs)
            res.error = rel_error(out, expected)
        except Exception as e:  # a candidate that cannot run is reported, never fatal
            res.failure = f"{type(e).__name__}: {e}"
            continue
        wrong = dtype_mismatch(out, check_inputs)
        if wrong:
            res.failure = wrong
            continue
        if not res.error <= res.bound:
            res.failure = f"error {res.error:.2e} > bound {res.bound:.0e}"
            continue
        live.append((res, fn))
    input_sets = [make_inputs(site, gen) for _ in range(sets)]
    start = time.perf_counter()
    with torch.no_grad():
        for res, fn in live:
            for _ in range(warmup):
                fn(input_sets[0])
        r = 0
        while live and (r < rounds or (r < MAX_ROUNDS and time.perf_counter() - start < min_site_s)):
            for res, fn in live:
                inputs = input_sets[r % sets]
                _sync()
                t0 = time.perf_counter()
                fn(inputs)
                _sync()
                res.times_ms.append((time.perf_counter() - t0) * 1e3)
            r += 1
            if r >= 3 and time.perf_counter() - start > max_site_s:
                break
    return results


# ---- the table file -----------------------------------------------------------------------------
def site_record(site: Site, hw_profile: str, best: Result, runner_up: Result | None, default: Result | None,
                provenance: dict) -> dict:
    rec = {"model": site.spec.model, "hw_profile": hw_profile, "op_kind": site.spec.op_kind,
           "layer_role": site.spec.layer_role, "stage": site.spec.stage, "shape_sig": site.spec.shape_sig,
           "impl_id": best.impl_id}
    if best.params:
        rec["impl_params"] = dict(best.params)
    prov = {"time_ms": round(best.median_ms, 4), "min_ms": round(min(best.times_ms), 4),
            "error": float(f"{best.error:.3g}"), "bound": best.bound, "ops": site.count}
    if runner_up is not None:
        prov["runner_up"] = {"impl": runner_up.label, "time_ms": round(runner_up.median_ms, 4)}
    if default is not None:
        prov["default"] = {"impl": default.label, "time_ms": round(default.median_ms, 4)}
    prov.update(provenance)
    rec["provenance"] = prov
    return rec


def read_table(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    return data if isinstance(data, dict) else {"records": data}


def write_table(path: Path, meta: dict, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = ("# Tuned dispatch table written by `edgefm-vla tune` (edgefm_ros/runtime/tune.py): the fastest\n"
            "# verified implementation per (op_kind, layer_role, stage, shape_sig) on this hardware profile.\n"
            "# Loaded after the built-in tables in fast mode. Re-run the tuner rather than editing by hand.\n")
    body = yaml.safe_dump({**meta, "records": records}, sort_keys=False, width=120)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(head + body)
    tmp.replace(path)


def with_defaults(impl_id: str, site: Site, params: dict) -> dict:
    """params completed with the impl's defaults (the first value of each parameter's space)."""
    impl = next(i for i in impls_for(site.spec.op_kind) if i.impl_id == impl_id)
    return {**{k: v[0] for k, v in impl.param_space.items() if v}, **params}


def default_choice(site: Site, untuned: Table) -> tuple[str, dict]:
    """impl_id and params the engine's tables without a tuned one (built-ins and skills) give this site."""
    rec = untuned.lookup(site.spec)
    return rec.impl_id, dict(rec.impl_params)


def library_versions() -> dict:
    return {"torch": str(torch.__version__), "python": platform.python_version(), "numpy": np.__version__}


def search_space(sites: list[Site], mode: str) -> list[dict]:
    rows = []
    for s in sites:
        cands, rejected = candidates(s, mode) if s.spec.op_kind in SEARCHED else ([], [])
        rows.append({"site": s.name(), "ops": s.count, "args": str([getattr(a, "shape", a) for a in s.args]),
                     "candidates": [c.label for c in cands], "rejected": rejected})
    return rows

"""GPU device check (run by scripts/device_check.sh): every GPU skill against its PyTorch reference, then
edgefm exact / fast / fast + CUDA-graph decode against LeRobot's eager SmolVLA on the same GPU (FULL
architecture, 3 cameras, B=1, 10 steps), timed with CUDA events after warm-up. Prints one table.

    python benchmarks/device_check.py --harness WORK/lerobot_harness [--warmup 3] [--runs 10] [--json F]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
from edgefm_kernels.registry import OpSpec, get_impl

from edgefm_ros.dispatch import skills
from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.graphs import CapturedPhase

BOUND = {"fp32": 1e-4, "bf16": 3e-2, "fp8": 1.5e-1}  # max |out - ref| / max |ref| on the GPU


def rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


# ---- skills --------------------------------------------------------------------------------------
def check_skills(gen: torch.Generator) -> list[tuple[str, str, str]]:
    """(skill check, result, detail) rows; a missing library is a SKIP with the reason."""
    dev = "cuda"
    hw = f"cuda_sm{''.join(map(str, torch.cuda.get_device_capability()))}"
    rows = []

    def spec(kind, **dims):
        return OpSpec(kind, "check", "check", "prefill", "", hw, dims=dims)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    def attempt(name, impl_kind, impl_id, fn, bound):
        impl = get_impl(impl_kind, impl_id)
        why = impl.rejects(spec(impl_kind, heads=15, kv_heads=5, head_dim=64, **{"in": 960}), {})
        if why:
            rows.append((name, "SKIP", why))
            return
        try:
            err = fn()
            rows.append((name, "PASS" if err <= bound else "FAIL", f"rel err {err:.2e} (bound {bound:.0e})"))
        except Exception as e:  # reported, the run goes on
            rows.append((name, "FAIL", f"{type(e).__name__}: {e}"[:120]))

    eager = get_impl("attention", "eager").build(spec("attention"), {})
    # (name, B, Hq, Hkv, Lq, Lk, mask kind) as SmolVLA runs them
    shapes = [("vision 12/12 1024x1024", 3, 12, 12, 1024, 1024, None), ("vlm prefix GQA 15/5", 1, 15, 5, 211, 211, "prefix"),
              ("expert self 15/5", 1, 15, 5, 50, 261, "self"), ("expert cross 15/5", 1, 15, 5, 50, 211, "cross"),
              ("decode single query", 1, 15, 5, 1, 211, None)]
    for name, b, hq, hkv, lq, lk, kind in shapes:
        q, k, v = randn(b, hq, lq, 64), randn(b, hkv, lk, 64), randn(b, hkv, lk, 64)
        mask = None
        if kind is not None:
            mask = torch.rand(b, lq, lk, generator=gen).to(dev) < 0.8
            mask[..., 0] = True
            if kind == "self":
                mask[..., 211:] = torch.ones(lq, lq, dtype=torch.bool, device=dev).tril()
            if kind == "prefix":
                mask[0, 5] = False  # a masked camera token: uniform weights
        ref = eager(q, k, v, mask)

        def run(q=q, k=k, v=v, mask=mask, ref=ref, hq=hq, hkv=hkv):
            kern = get_impl("attention", "flashinfer").build(spec("attention", heads=hq, kv_heads=hkv, head_dim=64), {})
            return rel(kern(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask), ref)
        attempt(f"flashinfer attention: {name}", "attention", "flashinfer", run, BOUND["bf16"])
    w = 1 + 0.1 * randn(960)
    x = randn(1, 211, 960)
    rms_ref = get_impl("rms_norm", "ref").build(spec("rms_norm"), {}, weight=w, eps=1e-5)(x)
    attempt("triton rms_norm bf16", "rms_norm", "triton",
            lambda: rel(get_impl("rms_norm", "triton").build(spec("rms_norm"), {}, weight=w, eps=1e-5)(x.bfloat16()), rms_ref),
            BOUND["bf16"])
    rope = get_impl("rope", "ref").build(spec("rope"), {})
    xr, pos = randn(1, 211, 15, 64), torch.arange(211, device=dev)[None]
    tables = rope.tables(pos, 64)
    attempt("triton rope fp32", "rope", "triton",
            lambda: rel(get_impl("rope", "triton").build(spec("rope", head_dim=64), {})(xr, tables), rope(xr, tables)),
            BOUND["fp32"])
    weights = [(randn(960, 960) / 31, None), (randn(320, 960) / 31, None), (randn(320, 960) / 31, None)]
    xl = randn(1, 211, 960)
    ref = get_impl("linear", "ref").build(spec("linear"), {}, weights=weights)(xl)
    for impl_id, bound in (("bf16", BOUND["bf16"]), ("fp8", BOUND["fp8"])):
        attempt(f"{impl_id} linear QKV 960->1600", "linear", impl_id,
                lambda impl_id=impl_id: max(rel(o, r) for o, r in zip(
                    get_impl("linear", impl_id).build(spec("linear", **{"in": 960}), {}, weights=weights)(xl), ref)),
                bound)
    return rows


# ---- timing --------------------------------------------------------------------------------------
def cuda_time(fn, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def golden_inputs(golden: Path):
    from edgefm_ros.runtime.preprocess import ModelInputs
    from edgefm_ros.runtime.safetensors_mmap import load_all

    g = load_all(golden / "inputs.safetensors")
    n = sum(1 for k in g if k.startswith("images."))
    inp = ModelInputs(tuple(g[f"images.{i}"] for i in range(n)), tuple(g[f"img_masks.{i}"].bool() for i in range(n)),
                      g["lang_tokens"], g["lang_masks"].bool(), g["state"])
    return g, inp


def lerobot_runner(harness: Path, ckpt: Path, g: dict, native: bool):
    sys.path.insert(0, str(harness))
    import common  # the harness's LeRobot helpers (policy build/load)

    policy = common.load_policy(ckpt, dtype=None if native else torch.float32).to("cuda").eval()
    n = sum(1 for k in g if k.startswith("images."))
    args = ([g[f"images.{i}"].cuda() for i in range(n)], [g[f"img_masks.{i}"].bool().cuda() for i in range(n)],
            g["lang_tokens"].cuda(), g["lang_masks"].bool().cuda(), g["state"].cuda())
    noise = g["noise"].cuda()

    @torch.no_grad()
    def run():
        return policy.model.sample_actions(*args, noise=noise)
    return run


def time_engine(ckpt, vlm, mode, inp, noise, golden, args) -> dict:
    """edgefm in one mode (and, for fast, with the decode loop graph-captured): errors and CUDA-event times."""
    hw = f"cuda_sm{''.join(map(str, torch.cuda.get_device_capability()))}"
    tables = skills.tables_for(hw) if mode == "fast" else []  # the GPU skills that can run here
    # the goldens are LeRobot 0.4.4's (transformers 4.57): its vision position ids
    eng = Engine.from_checkpoint(ckpt, vlm, mode=mode, device="cuda", tables=tables, vision_position_ids="legacy")
    runs = {f"edgefm {mode}": (rel(eng.sample(inp, noise).float().cpu(), golden),
                               cuda_time(lambda: eng.sample(inp, noise), args.warmup, args.runs))}
    out = {"runs": runs}
    if mode == "fast":
        decode = CapturedPhase(eng.decode, (eng.prefill(inp), noise))
        out["capture_s"] = decode.capture_s

        def graphed():
            return decode(eng.prefill(inp), noise)
        runs["edgefm fast + graph"] = (rel(graphed().float().cpu(), golden), cuda_time(graphed, args.warmup, args.runs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", required=True, type=Path)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    versions = {m: (importlib.util.find_spec(m) and __import__(m).__version__) for m in ("torch", "flashinfer", "triton")}
    print(f"GPU: {gpu}; versions {versions}")
    rows = check_skills(torch.Generator().manual_seed(0))
    art = args.harness / "artifacts" / "full"
    ckpt, vlm = art / "checkpoint", args.harness / "vlm" / "SmolVLM2-500M-Video-Instruct"
    g, inp = golden_inputs(art / "golden")
    golden = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(art / "golden" / "outputs.safetensors"))["actions"]
    timings, errors = {}, {}
    for name, native in (("LeRobot eager fp32", False), ("LeRobot eager native bf16", True)):
        run = lerobot_runner(args.harness, ckpt, g, native)
        errors[name] = rel(run().float().cpu(), golden)
        timings[name] = cuda_time(run, args.warmup, args.runs)
        del run
        torch.cuda.empty_cache()
    noise = g["noise"].cuda()
    capture_s = None
    for mode in ("exact", "fast"):
        got = time_engine(ckpt, vlm, mode, inp, noise, golden, args)
        for name, (err, ts) in got["runs"].items():
            errors[name], timings[name] = err, ts
        capture_s = got.get("capture_s", capture_s)
        torch.cuda.empty_cache()
    base = statistics.median(timings["LeRobot eager fp32"])
    print(f"\n{'check':<44} {'result':<6} detail")
    for name, res, detail in rows:
        print(f"{name:<44} {res:<6} {detail}")
    print(f"\nFULL, 3 cameras, B=1, 10 steps on {gpu} (CUDA events, warm-up {args.warmup}, median of {args.runs})")
    print(f"{'run':<28} {'chunk ms':>9} {'min':>8} {'vs LeRobot fp32':>16} {'rel err vs golden':>18}")
    for name, ts in timings.items():
        med = statistics.median(ts)
        print(f"{name:<28} {med:>9.2f} {min(ts):>8.2f} {base / med:>15.2f}x {errors[name]:>18.2e}")
    print(f"decode graph capture: {capture_s:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": gpu, "versions": versions, "checks": rows, "capture_s": capture_s,
                                               "timings_ms": timings, "rel_err_vs_golden": errors}, indent=2))
    return 1 if any(r == "FAIL" for _, r, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared helpers of the kernel tests: specs, the impl/param grid, error measure and bounds."""
import itertools
from contextlib import contextmanager

import torch

from edgefm_kernels.registry import OpSpec, impls_for

HW = "cpu_x86_avx512_bf16"


@contextmanager
def faked_cpu(monkeypatch, cache_dir, drop=(), add=(), caches=()):
    """This CPU's flags without ``drop`` and with ``add`` for native.py, builds going to ``cache_dir``, and
    the cached loads and availability answers (``caches``: lru_cache'd functions) forgotten before and after."""
    from edgefm_kernels import native

    flags = native.cpu_flags() - set(drop) | set(add)
    monkeypatch.setattr(native, "cpu_flags", lambda: flags)
    monkeypatch.setenv("EDGEFM_CACHE_DIR", str(cache_dir))
    forget = (native._load, *caches)
    for f in forget:
        f.cache_clear()
    try:
        yield
    finally:
        for f in forget:
            f.cache_clear()


# max |out - ref| / max |ref| allowed, by the coarser of the impl's precision and the input dtype
BOUNDS = {"fp32": 2e-5, "bf16": 3e-2, "int8": 6e-2}


def spec(op_kind: str, hw: str = HW, stage: str = "prefill", **dims) -> OpSpec:
    return OpSpec(op_kind=op_kind, op_name=f"test.{op_kind}", layer_role="test", stage=stage, shape_sig="",
                  hw_profile=hw, dims=dims)


def variants(op_kind: str, hw: str = HW, **dims):
    """(impl, params) for every registered impl and parameter combination this hardware accepts."""
    out = []
    for impl in impls_for(op_kind):
        names = sorted(impl.param_space)
        for combo in itertools.product(*(impl.param_space[n] for n in names)):
            params = dict(zip(names, combo))
            if impl.rejects(spec(op_kind, hw, **dims), params) is None:
                out.append((impl, params))
    return out


def vid(v) -> str:
    impl, params = v
    return impl.impl_id + "".join(f"-{k}={p}" for k, p in sorted(params.items()))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def bound(impl, x_dtype: torch.dtype) -> float:
    act = "bf16" if x_dtype == torch.bfloat16 else "fp32"
    return max(BOUNDS[impl.precision], BOUNDS[act])


def reference(op_kind: str):
    return next(i for i in impls_for(op_kind) if i.reference)

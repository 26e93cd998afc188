"""Every skip of the suite goes through these helpers, and each says which kind it is.

Strict mode (``EDGEFM_STRICT_TESTS=1``, set by ``.ci/run``) turns a skip into a failure unless its kind is
in ``ALLOWED``: CI cannot give a GPU or another CPU, but it does have what ``scripts/setup.sh`` installs
(../shared, MLServer, nginx, root, metaworld and EGL, the ROS 2 tools and messages, a C compiler, the
SmolLM2 package), so a skip for any of those would hide an untested model and fails the run.

    from skips import require_gpu, require_material, require_module
    require_gpu()                                   # allowed: no CUDA device here
    require_material(path.is_dir(), f"no {path}")   # fails in strict mode when it would skip
    rclpy = require_module("rclpy")                  # import or (material) skip

A skip made any other way (``pytest.skip``, ``importorskip``, ``skipif``) counts as a material skip.
"""
from __future__ import annotations

import importlib
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

STRICT_ENV = "EDGEFM_STRICT_TESTS"
# kind -> why CI may skip it; the reason of an allowed skip starts with "[<kind>] "
ALLOWED = {
    "no-gpu": "no CUDA device on this machine (CI runs on CPUs)",
    "has-gpu": "checks the behaviour of a machine without CUDA, and this one has it",
    "cpu-isa": "this CPU lacks the instruction set (AVX-512, AVX512-BF16, AMX) the kernel needs",
    "opt-in": "a heavy check run only when its environment variable points at its material",
}


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def allowed_kind(reason: str) -> str | None:
    """The allowed kind a skip reason declares, or None (a material skip)."""
    if reason.startswith("["):
        kind = reason[1:].split("]", 1)[0]
        if kind in ALLOWED:
            return kind
    return None


def _allowed(kind: str, reason: str) -> str:
    assert kind in ALLOWED, kind
    return f"[{kind}] {reason}"


# ---- allowed kinds ---------------------------------------------------------------------------------
def require_gpu(reason: str = "needs a CUDA device") -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip(_allowed("no-gpu", reason), allow_module_level=True)


def gpu_mark(reason: str = "needs a CUDA device"):
    """``@gpu_mark()``: the decorator form of ``require_gpu``."""
    import torch

    return pytest.mark.skipif(not torch.cuda.is_available(), reason=_allowed("no-gpu", reason))


def no_gpu_mark(reason: str):
    """For a test of the no-CUDA path: skips (allowed) where CUDA is present."""
    import torch

    return pytest.mark.skipif(torch.cuda.is_available(), reason=_allowed("has-gpu", reason))


def skip_hardware(kind: str, reason: str) -> None:
    """An allowed skip of a hardware ``kind`` ('no-gpu', 'cpu-isa'), e.g. an fp8 test on a pre-sm89 GPU."""
    pytest.skip(_allowed(kind, reason))


def cpu_has_avx512() -> bool:
    import torch

    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def cpu_has_bf16() -> bool:
    """AVX512-BF16 (the hardware profile cpu_x86_avx512_bf16)."""
    from edgefm_ros.dispatch.hardware import detect

    return detect("cpu").profile.startswith("cpu_x86_avx512_bf16")


def native_unavailable(name: str) -> tuple[str | None, bool]:
    """(why compiled kernel ``name`` cannot run here or None, whether that is only this CPU's fault)."""
    from edgefm_kernels import native

    why = native.unavailable(name)
    return why, why is not None and (not cpu_has_avx512() or native.missing_isa(name) is not None)


def require_native(name: str) -> None:
    """Skip unless compiled kernel ``name`` runs here: allowed on a CPU without AVX-512, material otherwise
    (a compiler or build failure on an AVX-512 machine is a defect CI must see)."""
    why, cpu_only = native_unavailable(name)
    if why is not None:
        pytest.skip(_allowed("cpu-isa", why) if cpu_only else f"kernel {name} unavailable: {why}")


def native_mark(name: str):
    why, cpu_only = native_unavailable(name)
    return pytest.mark.skipif(why is not None, reason=_allowed("cpu-isa", why or "") if cpu_only
                              else f"kernel {name} unavailable: {why}")


def require_impl_here(impl, spec, params=None) -> None:
    """Skip unless ``impl`` accepts ``spec`` here: allowed when the CPU lacks the impl's instruction set."""
    why = impl.rejects(spec, dict(params or {}))
    if why is None:
        return
    lacks = not cpu_has_avx512() or (impl.precision == "bf16" and not cpu_has_bf16())
    pytest.skip(_allowed("cpu-isa", why) if lacks else f"{impl.op_kind}/{impl.impl_id} rejects: {why}")


def require_opt_in(env: str, what: str) -> Path:
    """The path in ``$env``; an allowed skip when the variable is unset (a heavy check CI does not run)."""
    value = os.environ.get(env)
    if not value:
        pytest.skip(_allowed("opt-in", f"{env} is not set ({what})"))
    return Path(value)


# ---- material: what CI has; these skips fail in strict mode -----------------------------------------
def require_material(ok: bool, reason: str) -> None:
    if not ok:
        pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str | None = None):
    """The imported module, or a material skip naming it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.skip(reason or f"Python module {name!r} is not importable ({e}); scripts/setup.sh installs it",
                    allow_module_level=True)


def require_tool(name: str, hint: str = "") -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed{f' ({hint})' if hint else ''}", allow_module_level=True)
    return path


def require_root(reason: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {reason}")


# ---- the strict-mode hooks (imported by tests/conftest.py; ``-p skips`` for a run outside tests/) ---------
def _skip_reason(report) -> str:
    lr = report.longrepr
    reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def _fail_material_skip(report) -> None:
    reason = _skip_reason(report)
    if allowed_kind(reason) is None:
        report.outcome = "failed"
        report.longrepr = (f"strict mode ({STRICT_ENV}=1): skipped for material or a tool CI has, which must not "
                           f"skip: {reason}\n(allowed kinds: {', '.join(ALLOWED)}; tests/skips.py)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict() and not hasattr(report, "wasxfail"):
        _fail_material_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict():
        _fail_material_skip(report)


def pytest_terminal_summary(terminalreporter):
    """One line: the skips by kind (the reasons are listed by -rs)."""
    kinds = Counter(allowed_kind(_skip_reason(r)) or "material" for r in terminalreporter.stats.get("skipped", []))
    if kinds:
        mode = "strict" if strict() else f"not strict (set {STRICT_ENV}=1 to fail material skips)"
        terminalreporter.write_line(f"skips by kind ({mode}): " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


__all__ = ["ALLOWED", "STRICT_ENV", "allowed_kind", "cpu_has_avx512", "cpu_has_bf16", "gpu_mark", "native_mark",
           "no_gpu_mark", "require_gpu", "require_impl_here", "require_material", "require_module", "require_native",
           "require_opt_in", "require_root", "require_tool", "skip_hardware", "strict"]

"""Compiled CPU kernels (``edgefm_kernels/csrc/<name>.c``): built with the system C compiler on first use, cached,
loaded with ctypes (which releases the GIL for the call).

    lib = native.load("panel_gemm")      # ctypes.CDLL, or raises NativeError saying why
    native.unavailable("panel_gemm")     # why it cannot run here (no build, or no AVX-512 CPU), or None
    lib = native.bind("panel_gemm", {"fn": ([argtypes], restype)})   # load + C signatures, set once
    with native.recording(rec): ...      # calls through bind() also reported to rec.native(fn, args, result)
    native.avx512_check(name)            # an ``Impl.check`` for impls built on the kernel
    native.build_all()                   # {name: reason | None} for every csrc/*.c (set-up warms the cache)

The shared object lives in ``$EDGEFM_CACHE_DIR/native`` (default ``~/.cache/edgefm_ros/native``) under a
name that hashes the source, the shared headers (``csrc/*.h``), the flags and the compiler, so an edited
kernel or another compiler rebuilds it; the build writes a temporary file and renames it, so concurrent
processes never load half a library.
OpenMP comes from the libgomp torch already loaded (same soname), so the kernels share torch's threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SRC_DIR = Path(__file__).resolve().parent / "csrc"
# AVX-512 F/VL/DQ + FMA only: the library runs on any AVX-512 x86 CPU, not just the one that built it
# -ffp-contract=off: no FMA the source does not write (RoPE is bitwise the reference; gcc's -std=c11 implies
# it, clang's default does not)
FLAGS = ("-O3", "-std=c11", "-ffp-contract=off", "-mavx512f", "-mavx512vl", "-mavx512dq", "-mfma", "-fopenmp",
         "-shared", "-fPIC")
# kernels that need more than AVX-512 F: (extra compiler flags, /proc/cpuinfo flags the CPU must have).
# A CPU without them gets the kernel refused before it is built, and its skill is not loaded.
ISA = {
    "bf16_rows": (("-mavx512bf16",), ("avx512_bf16",)),
    "amx_attention": (("-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
                      ("avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")),
    "amx_gemm": (("-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
                 ("avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")),
    "vnni_gemm": (("-mavx512bw", "-mavx512vnni"), ("avx512bw", "avx512_vnni")),
    "vnni_attention": (("-mavx512bw", "-mavx512vnni"), ("avx512bw", "avx512_vnni")),
}


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    """The running CPU's feature flags (/proc/cpuinfo ``flags``, ``Features`` on ARM), empty where it cannot be
    read. The hardware profile (dispatch/hardware.py) is derived from the same set."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def missing_isa(name: str) -> str | None:
    """Why the CPU cannot run kernel ``name`` (the instruction-set flags it lacks), or None."""
    need = ISA.get(name, ((), ()))[1]
    lacking = [f for f in need if f not in cpu_flags()]
    return f"{name} needs CPU flags {list(need)}; this CPU lacks {lacking}" if lacking else None


class NativeError(RuntimeError):
    """A compiled kernel that cannot be built or loaded here; the message says why."""


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEFM_CACHE_DIR") or Path.home() / ".cache" / "edgefm_ros") / "native"


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeError("no C compiler found (set CC or install gcc)")
    return cc


def load(name: str) -> ctypes.CDLL:
    lib = _load(name)
    if isinstance(lib, NativeError):
        raise NativeError(str(lib))  # a fresh exception: the kept one would collect a traceback per raise
    return lib


@functools.lru_cache(maxsize=None)
def _load(name: str) -> "ctypes.CDLL | NativeError":
    """The library, or the error (kept too, so a failed build is not retried for every op)."""
    try:
        return _build_and_open(name)
    except NativeError as e:
        return e


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: str) -> str:
    """``cc --version`` (part of the build key), asked once per process."""
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeError(f"C compiler {cc!r} does not run: {e}") from None


def _build_and_open(name: str) -> ctypes.CDLL:
    src = SRC_DIR / f"{name}.c"
    if not src.is_file():
        raise NativeError(f"no kernel source {src}")
    isa = missing_isa(name)
    if isa:  # never built (or loaded from the cache) where it would fault on the first instruction
        raise NativeError(isa)
    cc = _compiler()
    version = _compiler_version(cc)
    headers = [h.read_text() for h in sorted(SRC_DIR.glob("*.h"))]  # what the source may include
    flags = FLAGS + ISA.get(name, ((), ()))[0]
    key = hashlib.sha256("\0".join([src.read_text(), *headers, *flags, version]).encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if not out.is_file():
        _build(cc, src, out, flags)
    try:
        return ctypes.CDLL(str(out))
    except OSError as e:
        raise NativeError(f"cannot load {out}: {e}") from None


def _build(cc: str, src: Path, out: Path, flags: tuple[str, ...]) -> None:
    """Compile ``src`` into ``out`` through a temporary file in the same folder, renamed when complete."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
    except OSError as e:
        raise NativeError(f"cannot write the kernel cache {out.parent} (set EDGEFM_CACHE_DIR): {e}") from None
    try:
        r = subprocess.run([cc, *flags, str(src), "-o", tmp], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise NativeError(f"building {src.name} with {cc} failed: {r.stderr.strip()[-800:]}")
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeError(f"building {src.name} with {cc} failed: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def unavailable(name: str) -> str | None:
    """Why kernel ``name`` cannot run here, or None: the CPU lacks an instruction set it needs beyond AVX-512
    (``ISA``: refused before any build), it does not build or load, or the running CPU lacks AVX-512 (every
    kernel is built with -mavx512f; checked after the build so its errors come first)."""
    isa = missing_isa(name)
    if isa:
        return isa
    lib = _load(name)
    if isinstance(lib, NativeError):
        return str(lib)
    cap = torch.backends.cpu.get_cpu_capability()
    return None if cap == "AVX512" else f"{name} needs AVX-512 (torch reports CPU capability {cap!r})"


_recording = threading.local()  # .rec: the recorder of this thread's calls, if any (runtime/cpu_graph.py)


@contextlib.contextmanager
def recording(rec):
    """While active, on this thread: every kernel called through ``bind()`` is also reported, after the call,
    as ``rec.native(fn, args, result)`` (a CPU graph capture replays them)."""
    prev = getattr(_recording, "rec", None)
    _recording.rec = rec
    try:
        yield rec
    finally:
        _recording.rec = prev


class _Reported:
    """A bound library whose function calls are reported to a recorder."""

    def __init__(self, lib: ctypes.CDLL, rec):
        self._lib, self._rec = lib, rec

    def __getattr__(self, name: str):
        fn, rec = getattr(self._lib, name), self._rec

        def call(*args):
            result = fn(*args)
            rec.native(fn, args, result)
            return result

        return call


def bind(name: str, signatures: dict) -> ctypes.CDLL:
    """``load(name)`` with the C signatures ``{function: ([argtypes], restype)}`` set (once per library)."""
    lib = load(name)
    if not getattr(lib, "_edgefm_bound", False):
        for fn, (args, res) in signatures.items():
            getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, res
        lib._edgefm_bound = True
    rec = getattr(_recording, "rec", None)
    return lib if rec is None else _Reported(lib, rec)


def amx_unavailable(name: str, signatures: dict) -> str | None:
    """``unavailable(name)`` for an AMX kernel, or the kernel refusing the tile state: it asks for it through
    the ``edgefm_amx_init`` every AMX library exports (csrc/amx.h; granted once per process)."""
    reason = unavailable(name)
    if reason is None and bind(name, signatures).edgefm_amx_init() != 0:  # no arguments, an int: ctypes' defaults
        reason = "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return reason


def avx512_check(name: str):
    """``Impl.check`` for impls built on kernel ``name``: an AVX-512 profile and the library loading here."""
    def check(spec, params) -> str | None:
        if not spec.hw_profile.startswith("cpu_x86_avx512"):
            return f"{name} needs an AVX-512 CPU profile, this is {spec.hw_profile!r}"
        return unavailable(name)
    return check


def build_all() -> dict[str, str | None]:
    """Build (or find in the cache) every ``csrc/*.c``: {name: why it is unavailable, or None}."""
    return {src.stem: unavailable(src.stem) for src in sorted(SRC_DIR.glob("*.c"))}

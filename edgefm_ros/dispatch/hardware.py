"""Hardware profile detection: the ``hw_profile`` key of the dispatch table.

Profiles are ``_``-separated from general to specific, so a table record may name a prefix:
``cuda`` matches ``cuda_sm90``; ``cpu_x86`` matches ``cpu_x86_avx512_bf16``.
  cuda_sm<major><minor>                      an NVIDIA GPU (compute capability)
  cpu_x86_avx512_bf16_amx | cpu_x86_avx512_bf16 | cpu_x86_avx512_vnni | cpu_x86_avx512 | cpu_x86_avx2 | cpu_x86
AMX machines are a profile of their own: bf16 GEMMs through oneDNN run ~7x faster there than fp32, and
~2x slower on an AVX512-BF16 CPU without the tiles (a VM that hides them, AMD Zen 4/5), where int8 VNNI
GEMMs are the fast path; a choice made for one is wrong for the other.
  cpu_arm64_sve | cpu_arm64_neon | cpu_<machine>
"""
from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass

import torch

from edgefm_kernels import native


@dataclass(frozen=True)
class Hardware:
    profile: str
    device: str  # "cpu" | "cuda"
    name: str  # human-readable CPU/GPU model
    flags: frozenset[str]
    threads: int

    @property
    def fingerprint(self) -> str:
        """Short stable hash of what determines kernel choice (model name, flags, threads)."""
        raw = "|".join([self.profile, self.name, ",".join(sorted(self.flags)), str(self.threads)])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _cpu_info() -> tuple[str, frozenset[str]]:
    """(model name, feature flags: the ones the compiled kernels are checked against, native.cpu_flags)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                    break
    except OSError:
        pass
    return name, native.cpu_flags()


AMX_FLAGS = frozenset({"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})


def cpu_profile(machine: str, flags: frozenset[str]) -> str:
    """The most specific CPU profile the flags support."""
    if machine in ("x86_64", "AMD64"):
        if AMX_FLAGS <= flags:
            return "cpu_x86_avx512_bf16_amx"
        for flag, profile in (("avx512_bf16", "cpu_x86_avx512_bf16"), ("avx512_vnni", "cpu_x86_avx512_vnni"),
                              ("avx512f", "cpu_x86_avx512"), ("avx2", "cpu_x86_avx2")):
            if flag in flags:
                return profile
        return "cpu_x86"
    if machine in ("aarch64", "arm64"):
        return "cpu_arm64_sve" if "sve" in flags else "cpu_arm64_neon"
    return f"cpu_{machine.lower()}"


def detect(device: str = "cpu") -> Hardware:
    """Profile of ``device`` ("cpu" or "cuda[:i]"); raises ValueError for a device that is not there."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        major, minor = torch.cuda.get_device_capability(device)
        return Hardware(f"cuda_sm{major}{minor}", "cuda", torch.cuda.get_device_name(device), frozenset(), 0)
    if device != "cpu":
        raise ValueError(f"unknown device {device!r}; use 'cpu' or 'cuda[:i]'")
    name, flags = _cpu_info()
    return Hardware(cpu_profile(platform.machine(), flags), "cpu", name, flags, torch.get_num_threads())

"""Where weight memory lives: page hints for the kernel (Linux; a no-op elsewhere).

release_pages(tensors)   drop the resident pages of sources just converted into a copy (MADV_PAGEOUT)
back_with_huge_pages(t)  move the resident part of a weight onto 2 MiB transparent huge pages
                         (MADV_HUGEPAGE + MADV_COLLAPSE); returns the bytes now huge-page backed

Why huge pages: decode streams every expert weight once per Euler step (~390 MB fp32 for SmolVLA),
far beyond what 4 KiB pages keep in the TLB, so the small-M GEMMs stall on page walks. Backed by
2 MiB pages the same GEMMs run ~10% faster (benchmarks/bench_vs_lerobot.py). Contents never change.
"""
from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

_MADV_HUGEPAGE = 14
_MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim the range; never changes its contents
_MADV_COLLAPSE = 25  # Linux >= 6.1: collapse the range into huge pages now, synchronously
_THP = Path("/sys/kernel/mm/transparent_hugepage")


@functools.cache
def _libc():
    """libc from the process's own symbols (no library search, no subprocess), or None."""
    if os.name != "posix":
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return lib
    except (OSError, AttributeError):
        return None


@functools.cache
def huge_page_size() -> int:
    """Bytes of a transparent huge page, or 0 when THP is off or unknown here."""
    try:
        if "[never]" in (_THP / "enabled").read_text():
            return 0
        return int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 0


def span(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of a CPU tensor's data, dense or oneDNN/MKL-packed (opaque) layout."""
    if t.layout == torch._mkldnn:  # packed weights: their memory is only reachable through these ops
        return int(torch.ops.mkldnn.data_ptr(t)), int(torch.ops.mkldnn._nbytes(t))
    return t.data_ptr(), t.numel() * t.element_size()


def release_pages(tensors: Sequence[torch.Tensor | None]) -> None:
    """Hint the kernel to reclaim the pages fully inside each CPU tensor's storage (MADV_PAGEOUT).

    Meant for sources that were just converted into a new copy (e.g. memory-mapped fp32 weights):
    the contents never change (file-backed pages are re-read on the next touch, anonymous ones are
    swapped or left alone), only the resident set shrinks.
    """
    libc = _libc()
    if libc is None:
        return
    page = os.sysconf("SC_PAGE_SIZE")
    for t in tensors:
        if t is None or t.device.type != "cpu" or t.numel() == 0:
            continue
        start, nbytes = span(t)
        lo, hi = -(-start // page) * page, ((start + nbytes) // page) * page
        if hi > lo:
            libc.madvise(lo, hi - lo, _MADV_PAGEOUT)


def _resident_blocks(libc, lo: int, hi: int, huge: int, page: int, min_resident: float) -> list[int]:
    """Starts of the huge-page-aligned blocks in [lo, hi) with >= ``min_resident`` of their pages resident."""
    vec = (ctypes.c_ubyte * ((hi - lo) // page))()
    if libc.mincore(lo, hi - lo, vec) != 0:
        return []
    full = (np.frombuffer(vec, dtype=np.uint8) & 1).reshape(-1, huge // page).mean(axis=1) >= min_resident
    return [lo + int(i) * huge for i in np.flatnonzero(full)]


def back_with_huge_pages(t: torch.Tensor, min_resident: float = 0.9) -> int:
    """Collapse the 2 MiB blocks of ``t``'s memory that are (almost) all resident into huge pages.

    Packed layouts are written with small holes and their allocations have a long untouched tail, so
    only blocks with >= ``min_resident`` of their pages in memory are collapsed: the resident set
    grows by at most (1 - min_resident) of what is collapsed. Values never change. Returns the bytes
    collapsed; 0 where unsupported (not Linux, THP off, kernel < 6.1, a GPU tensor).
    """
    libc, huge = _libc(), huge_page_size()
    if libc is None or huge == 0 or t.device.type != "cpu":
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    start, nbytes = span(t)
    lo, hi = -(-start // huge) * huge, ((start + nbytes) // huge) * huge
    done = 0
    for block in (_resident_blocks(libc, lo, hi, huge, page, min_resident) if hi > lo else ()):
        libc.madvise(block, huge, _MADV_HUGEPAGE)
        if libc.madvise(block, huge, _MADV_COLLAPSE) == 0:
            done += huge
    return done

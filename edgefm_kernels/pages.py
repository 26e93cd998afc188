"""Page hints for weight memory (Linux; a no-op elsewhere).

release_pages(tensors)  drop the resident pages of sources just converted into a copy (MADV_PAGEOUT)
trim_heap()             hand the heap's free memory back to the kernel (glibc malloc_trim)
keep_freed_heap()       let the heap keep and reuse what inference frees (glibc mallopt)
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Sequence

import torch

_MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim the range; never changes its contents
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's largest mmap threshold: bigger allocations are mapped afresh each time
KEEP_FREED = 1 << 30  # free memory at the heap's top that keep_freed_heap() lets it keep


@functools.cache
def _libc():
    """libc from the process's own symbols (no library search, no subprocess), or None."""
    if os.name != "posix":
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


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
        start, nbytes = t.data_ptr(), t.numel() * t.element_size()
        lo, hi = -(-start // page) * page, ((start + nbytes) // page) * page
        if hi > lo:
            libc.madvise(lo, hi - lo, _MADV_PAGEOUT)


def trim_heap() -> bool:
    """Return free heap memory to the kernel (glibc ``malloc_trim(0)``, which also releases free chunks
    inside the heap). Meant for the end of a build whose transient weight copies (concatenations, packing
    sources) were freed but stay resident in the allocator (~240 MB for FULL exact). False when the
    C library has no malloc_trim (not glibc) or nothing was released."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    return bool(trim(0)) if trim is not None else False


def keep_freed_heap() -> bool:
    """Fix glibc's two malloc thresholds for inference: allocations up to MMAP_THRESHOLD come from the heap
    (never a fresh mapping), and free memory at the heap's top is kept up to KEEP_FREED. By default both move
    with the allocation history (the mmap threshold grows to the largest mapped block freed so far, the trim
    threshold to twice that), and a FULL chunk's activations (5-19 MB each) were faulted in anew: 15-48
    thousand minor faults a chunk, about 3% of its time. Process-wide, once; malloc_trim (trim_heap) still
    returns free memory when asked. False when the C library has no mallopt (not glibc)."""
    libc = _libc()
    opt = getattr(libc, "mallopt", None) if libc is not None else None
    if opt is None:
        return False
    return bool(opt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(opt(_M_TRIM_THRESHOLD, KEEP_FREED))

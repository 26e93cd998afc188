"""Page hints for weight memory (Linux; a no-op elsewhere).

release_pages(tensors)  drop the resident pages of sources just converted into a copy (MADV_PAGEOUT)
trim_heap()             hand the heap's free memory back to the kernel (glibc malloc_trim)
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Sequence

import torch

_MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim the range; never changes its contents


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

"""Huge-page backing of weights: values never change, the resident set does not grow, and on a Linux
with transparent huge pages the packed GEMM weights really end up on 2 MiB pages."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from edgefm_kernels import gemm, pages


def _smaps_huge_kb(addr: int) -> int:
    """AnonHugePages (kB) of the mapping that contains ``addr``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


needs_thp = pytest.mark.skipif(not sys.platform.startswith("linux") or pages.huge_page_size() == 0,
                               reason="transparent huge pages are off or this is not Linux")


@needs_thp
def test_dense_tensor_collapses_without_changing_values():
    t = torch.randn(6 << 20 >> 2)  # 6 MiB: at least two aligned 2 MiB blocks, all resident
    before = t.clone()
    done = pages.back_with_huge_pages(t)
    assert torch.equal(t, before)
    if done == 0:
        pytest.skip("this kernel refused MADV_COLLAPSE (needs Linux >= 6.1)")
    assert done >= 2 * pages.huge_page_size()
    assert _smaps_huge_kb(t.data_ptr() + (3 << 20)) >= done // 1024


@needs_thp
def test_packed_weight_is_huge_backed_and_gemm_unchanged(gen):
    """The MKL-packed layout (opaque) is reached through its span; the GEMM result is bitwise the same
    as before the collapse, and a second call makes nothing new resident."""
    w = torch.randn(2048, 720, generator=gen)
    x = torch.randn(50, 720, generator=gen)
    g = gemm.Gemm(lambda: (w.clone(), None), "mkl")
    p = g.packed(50)  # packs and collapses
    addr, nbytes = pages.span(p)
    assert nbytes >= w.numel() * 4
    y1 = g(x)
    rss = _rss_kb()
    assert pages.back_with_huge_pages(p) >= 0  # again: already huge, nothing new becomes resident
    assert _rss_kb() - rss < pages.huge_page_size() // 1024
    assert torch.equal(g(x), y1)
    assert torch.allclose(y1, x @ w.T, rtol=1e-5, atol=1e-4)
    if int(os.uname().release.split(".")[0]) >= 6:  # MADV_COLLAPSE exists: the packed data is on 2 MiB pages
        huge = pages.huge_page_size()
        first_block = -(-addr // huge) * huge  # madvise splits the mapping at the collapsed blocks
        assert _smaps_huge_kb(first_block) >= huge // 1024


def test_unsupported_cases_are_noops():
    t = torch.randn(1000)
    assert pages.back_with_huge_pages(t) == 0  # smaller than one aligned huge block
    assert pages.span(t) == (t.data_ptr(), 4000)

"""Norms, RoPE, patch embedding, casts, the GEMM helper and the int8 kernels against their references."""
import mmap

import pytest
import torch

from edgefm_kernels import gemm, pages, quant
from edgefm_kernels.registry import get_impl

from kernel_helpers import bound, reference, rel_err, spec, variants, vid
from skips import require_impl_here, require_material


@pytest.mark.parametrize("kind", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_norms(kind, dtype, gen):
    h = 96
    x = torch.randn(2, 17, h, generator=gen) * 3 + 1
    operands = {"weight": 1 + 0.1 * torch.randn(h, generator=gen), "eps": 1e-6}
    if kind == "layer_norm":
        operands["bias"] = torch.randn(h, generator=gen)
    ref = reference(kind).build(spec(kind), {}, **operands)(x)
    for impl, params in variants(kind):
        if impl.reference:
            continue
        out = impl.build(spec(kind), params, **operands)(x.to(dtype))
        assert out.dtype == dtype, f"{vid((impl, params))} must keep the activations' dtype"
        if dtype == torch.float32 and impl.impl_id == "avx512":
            torch.testing.assert_close(out, ref, rtol=5e-7, atol=1e-6)  # its own sum order for mean(x^2)
        elif dtype == torch.float32 and impl.precision == "fp32":
            torch.testing.assert_close(out, ref, rtol=0, atol=0)  # same operations as the reference
        else:  # bf16 activations, or an impl that computes in bf16 (cast in and back)
            assert rel_err(out, ref) <= bound(impl, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_avx512_is_the_reference_on_strided_slices(dtype, gen):
    impl = get_impl("rope", "avx512")
    require_impl_here(impl, spec("rope"))
    ref, fast = get_impl("rope", "ref").build(spec("rope"), {}), impl.build(spec("rope"), {})
    pos = torch.randint(0, 500, (2, 23), generator=gen)
    qkv = torch.randn(2, 23, 7 * 40, generator=gen)  # a fused q/k/v output: q and k are strided views
    tables = ref.tables(pos, 40)
    for part in (qkv[..., :5 * 40].view(2, 23, 5, 40), qkv[..., 5 * 40:6 * 40].view(2, 23, 1, 40)):
        expected = ref(part, tables)
        got = fast(part.to(dtype), tables)
        assert got.dtype == dtype and got.shape == part.shape
        if dtype == torch.float32:
            assert torch.equal(got, expected)  # the same roundings, in the same order
        else:
            assert rel_err(got, expected) <= bound(impl, dtype)
    with pytest.raises(ValueError, match=r"rope tables must be \[B, L, 1, D/2\]"):
        fast(qkv[..., :80].reshape(2, 23, 2, 40), ref.tables(pos[:, :5], 40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_fast_matches_reference_and_shares_tables(dtype, gen):
    ref, fast = (get_impl("rope", i).build(spec("rope"), {}) for i in ("ref", "fast"))
    pos = torch.randint(0, 500, (2, 23), generator=gen)
    x = torch.randn(2, 23, 5, 64, generator=gen)
    tables = ref.tables(pos, 64)  # the engine makes tables with one layer's kernel, every layer reads them
    expected = ref(x, tables)
    got = fast(x.to(dtype), tables)
    assert got.dtype == dtype
    if dtype == torch.float32:
        # the same products; addcmul may fuse the second one (one rounding less): within 2 ulp
        torch.testing.assert_close(got, expected, rtol=2.5e-7, atol=1e-6)
    else:
        assert rel_err(got, expected) <= 3e-2
    torch.testing.assert_close(fast(x, fast.tables(pos, 64)), expected, rtol=2.5e-7, atol=1e-6)
    other = ref.tables(pos + 1, 64)  # a new tables object (next chunk) is picked up
    torch.testing.assert_close(fast(x, other), ref(x, other), rtol=2.5e-7, atol=1e-6)
    strided = torch.randn(2, 23, 8 * 64, generator=gen)[..., 64:384].view(2, 23, 5, 64)  # a fused-QKV slice
    torch.testing.assert_close(fast(strided, tables), ref(strided, tables), rtol=2.5e-7, atol=1e-6)


@pytest.mark.parametrize("variant", variants("patch_embed"), ids=vid)
def test_patch_embed(variant, gen):
    impl, params = variant
    w, b = torch.randn(32, 3, 8, 8, generator=gen) / 14, torch.randn(32, generator=gen)
    px = torch.rand(3, 3, 48, 64, generator=gen) * 2 - 1
    ref = reference("patch_embed").build(spec("patch_embed"), {}, weight=w, bias=b)(px)
    out = impl.build(spec("patch_embed"), params, weight=w, bias=b)(px)
    assert out.shape == (3, 6 * 8, 32)
    assert impl.reference or out.is_contiguous()  # row-major tokens: no copy in every later op
    assert rel_err(out, ref) <= bound(impl, torch.float32)


def test_cast_impls(gen):
    x = torch.randn(4, 5, generator=gen)
    assert get_impl("cast", "fp32").build(spec("cast"), {})(x) is x
    y = get_impl("cast", "bf16").build(spec("cast"), {})(x)
    assert y.dtype == torch.bfloat16 and rel_err(y, x) < 1e-2
    assert get_impl("cast", "fp32").build(spec("cast"), {})(y).dtype == torch.float32


@pytest.mark.parametrize("backend,dtype", [("onednn", torch.float32), ("onednn", torch.bfloat16),
                                           ("mkl", torch.float32)])
def test_gemm_packs_once_and_the_layout_serves_every_row_count(backend, dtype, gen):
    """Two packed layouts at most per weight: single rows (matrix-vector path) and one made at the first
    call with more, which every other row count (prompts of other lengths, decode's 50 rows, three cameras'
    3072) uses, getting bitwise what a layout packed for it gives."""
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("[cpu-isa] oneDNN has no bf16 GEMM on this CPU")
    k, n = 64, 96
    w, b = torch.randn(n, k, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)
    g = gemm.Gemm(lambda: (w.clone(), b.clone()), backend)
    first = int(torch.randint(5, 300, (1,), generator=gen))
    for m in (first, 1, 7, 50, 211, 3072, first + 1):
        x = torch.randn(m, k, generator=gen).to(dtype)
        y = g(x)
        own = gemm.Gemm(lambda: (w.clone(), b.clone()), backend)(x)  # a layout packed for this m
        assert torch.equal(y, own), m
        torch.testing.assert_close(y.float(), torch.nn.functional.linear(x.float(), w.float(), b.float()),
                                   rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=2e-2 if dtype == torch.bfloat16 else 1e-4)
    assert g.w is None and set(g._packed) == {1, 2}  # only the packed layouts are kept


def test_gemm_rejects_bad_configuration():
    with pytest.raises(ValueError, match="fp32 only"):
        gemm.Gemm(lambda: (torch.zeros(2, 2, dtype=torch.bfloat16), None), "mkl")
    with pytest.raises(ValueError, match="epilogue"):
        gemm.Gemm(lambda: (torch.zeros(2, 2), None), "aten", post="relu6")
    with pytest.raises(ValueError, match="backend"):
        gemm.Gemm(lambda: (torch.zeros(2, 2), None), "cublas")


def test_release_pages_never_changes_values(tmp_path, gen):
    """Pages of a mapped file and of ordinary memory read back the same after the release hint."""
    t = torch.randn(300_000, generator=gen)
    path = tmp_path / "w.bin"
    path.write_bytes(t.numpy().tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        mapped = torch.frombuffer(mm, dtype=torch.float32)
        before = mapped.clone()
        pages.release_pages([mapped, t])
        assert torch.equal(mapped, before) and torch.equal(t, before)
        del mapped
        mm.close()


TRIM_SCRIPT = """
import torch
from edgefm_kernels import pages
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
keep = [torch.ones(16_000) for _ in range(2000)]   # ~128 MB in 64 KB heap blocks, all touched
top = torch.ones(16_000)                           # a live block above them: free() cannot trim the top
del keep
before = rss()
released = pages.trim_heap()
print(before - rss(), released)
"""


def test_trim_heap_returns_freed_memory(repo_root):
    """Freed heap blocks below a live one stay resident until trim_heap hands them back (glibc)."""
    import subprocess
    import sys

    require_material(hasattr(pages._libc(), "malloc_trim"), "the C library has no malloc_trim (not glibc)")
    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True, check=True,
                         cwd=repo_root).stdout.split()
    dropped_mb, released = float(out[0]), out[1] == "True"
    assert released and dropped_mb > 100, out


KEEP_SCRIPT = """
import sys, torch
from edgefm_kernels import pages
if sys.argv[1] == "keep":
    assert pages.keep_freed_heap()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
torch.set_num_threads(1)  # no pool threads allocating between the activations
returned = []
for _ in range(4):  # a chunk: eight 15 MB activations live at once, then all freed (120 MB at the heap's top)
    live = [torch.ones(15 << 18) for _ in range(8)]
    peak = rss()
    del live
    returned.append(peak - rss())
print(" ".join(map(str, returned)))
"""


def test_keep_freed_heap_keeps_each_chunks_activations_for_the_next(repo_root):
    """By default glibc's trim threshold is at most 64 MB (twice its largest mmap threshold): 120 MB of
    activations freed together go back to the kernel, and the next chunk faults them in again (15-48 thousand
    page faults a FULL chunk). With keep_freed_heap() the heap keeps them for the next chunk."""
    import subprocess
    import sys

    require_material(hasattr(pages._libc(), "mallopt"), "the C library has no mallopt (not glibc)")
    returned = {mode: [float(v) for v in subprocess.run([sys.executable, "-c", KEEP_SCRIPT, mode], capture_output=True,
                                                         text=True, check=True, cwd=repo_root).stdout.split()]
                for mode in ("default", "keep")}
    # by default the first chunk's activations are mmapped and unmapped when freed; later chunks come from
    # the heap, trimmed or not by where the heap's top lies (it varies from run to run). Kept: never returned.
    assert returned["default"][0] > 100 and max(returned["keep"]) < 10, returned


def test_quantize_rows_error_is_half_a_step(gen):
    w = torch.randn(64, 48, generator=gen)
    q, scale = quant.quantize_rows(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all()


def test_int8_weight_only_refuses_widths_that_crash_torch(gen):
    impl = get_impl("linear", "int8_wo")
    assert "16" in impl.rejects(spec("linear", **{"in": 40}), {})
    with pytest.raises(ValueError, match="divisible"):
        quant.QGemm(lambda: (torch.randn(8, 40, generator=gen), None), "none", "int8_wo")


@pytest.mark.parametrize("h", [5, 720, 961])
def test_rms_norm_avx512_any_width(h, gen):
    """Widths around the 16-lane vector (masked tails) and a bad weight named in the error."""
    impl = get_impl("rms_norm", "avx512")
    require_impl_here(impl, spec("rms_norm"))
    weight = 1 + 0.1 * torch.randn(h, generator=gen)
    x = torch.randn(3, 11, h, generator=gen) * 2
    ref = reference("rms_norm").build(spec("rms_norm"), {}, weight=weight, eps=1e-6)(x)
    torch.testing.assert_close(impl.build(spec("rms_norm"), {}, weight=weight, eps=1e-6)(x), ref, rtol=5e-7, atol=1e-6)
    with pytest.raises(ValueError, match=rf"weight must have shape \({h + 1},\)"):
        impl.build(spec("rms_norm"), {}, weight=weight, eps=1e-6)(torch.randn(2, h + 1))

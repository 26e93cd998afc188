"""The compiled panel GEMM (edgefm_kernels/csrc/panel_gemm.c) against float64 on fresh random inputs, and its build."""
import pytest
import torch

from edgefm_kernels import gemm, native, panel_gemm

from skips import native_mark, require_material

needs_kernel = native_mark(panel_gemm.NAME)  # allowed skip only on a CPU without AVX-512
FP32 = 2e-5  # max |out - ref| / max |ref|, the fp32 bound of the kernel tests


def _ref(x, w, b):
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


def _rel(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


@needs_kernel
@pytest.mark.parametrize("m", [1, 12, 13, 14, 50, 77])
@pytest.mark.parametrize("n,k", [(1, 7), (31, 64), (32, 257), (33, 5), (100, 700), (720, 2048)])
def test_panel_gemm_matches_float64(m, n, k, gen):
    """Row counts around the 13-row register block, columns around the 32-wide panel, K across the 256 block."""
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = torch.randn(n, generator=gen)
    x = torch.randn(m, k, generator=gen)
    for bias in (None, b):
        y = panel_gemm.PanelWeight(w, bias)(x)
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert _rel(y, _ref(x, w, bias)) <= FP32


@needs_kernel
def test_threads_do_not_change_the_result_and_strided_input_works(gen):
    """Each output column belongs to one thread with a fixed summation order: bitwise equal for 1 or 2 threads."""
    w = torch.randn(200, 300, generator=gen)
    pw = panel_gemm.PanelWeight(w)
    x = torch.randn(300, 50, generator=gen).t()  # non-contiguous [50, 300]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = pw(x)
        torch.set_num_threads(2)
        two = pw(x.contiguous())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert _rel(one, _ref(x, w, None)) <= FP32


@needs_kernel
def test_bad_operands_are_named(gen):
    pw = panel_gemm.PanelWeight(torch.randn(16, 8, generator=gen))
    with pytest.raises(ValueError, match=r"x \[M, 8\] float32, got \(3, 9\)"):
        pw(torch.randn(3, 9))
    with pytest.raises(ValueError, match="bfloat16"):
        pw(torch.randn(3, 8).bfloat16())
    with pytest.raises(ValueError, match="fp32 CPU weight"):
        panel_gemm.PanelWeight(torch.randn(16, 8).bfloat16())
    with pytest.raises(ValueError, match=r"bias must have shape \(16,\)"):
        panel_gemm.PanelWeight(torch.randn(16, 8), torch.randn(15))
    assert pw(torch.randn(0, 8)).shape == (0, 16)


@needs_kernel
def test_gemm_backend_panel_with_gelu_epilogue(gen):
    w, b = torch.randn(96, 40, generator=gen) / 40 ** 0.5, torch.randn(96, generator=gen)
    g = gemm.Gemm(lambda: (w.clone(), b.clone()), "panel", "gelu_tanh")
    x = torch.randn(2, 25, 40, generator=gen)
    ref = torch.nn.functional.gelu(_ref(x.reshape(-1, 40), w, b), approximate="tanh").view(2, 25, 96)
    assert _rel(g(x), ref) <= FP32
    assert g.w is None  # only the panels are kept


def test_panel_backend_is_refused_off_avx512():
    from kernel_helpers import spec

    check = gemm.backend_check(torch.float32)
    assert "AVX-512" in check(spec("linear", hw="cpu_x86_avx2"), {"backend": "panel"})
    assert "CPU GEMM" in check(spec("linear", hw="cuda_sm90"), {"backend": "panel"})
    assert "fp32 only" in gemm.backend_rejects("panel", torch.bfloat16)


def test_native_build_is_cached_and_failures_name_the_compiler_error(tmp_path, monkeypatch):
    why = native.unavailable("panel_gemm")
    require_material(not (why and "compiler" in why), f"no working C compiler: {why}")
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.c").write_text("int edgefm_answer(void) { return 42; }\n")
    (src / "broken.c").write_text("int edgefm_broken(void) { return undeclared_name; }\n")
    monkeypatch.setattr(native, "SRC_DIR", src)
    monkeypatch.setenv("EDGEFM_CACHE_DIR", str(tmp_path / "cache"))
    native._load.cache_clear()
    try:
        assert native.load("good").edgefm_answer() == 42
        built = list((tmp_path / "cache" / "native").glob("good-*.so"))
        assert len(built) == 1
        native._load.cache_clear()
        mtime = built[0].stat().st_mtime_ns
        assert native.load("good").edgefm_answer() == 42 and built[0].stat().st_mtime_ns == mtime  # not rebuilt
        why = native.unavailable("broken")
        assert why and "broken.c" in why and "undeclared_name" in why
        assert "no kernel source" in native.unavailable("missing")
        with pytest.raises(native.NativeError, match="undeclared_name"):
            native.load("broken")
        (tmp_path / "not_a_dir").write_text("")
        monkeypatch.setenv("EDGEFM_CACHE_DIR", str(tmp_path / "not_a_dir"))
        native._load.cache_clear()
        assert "cannot write the kernel cache" in native.unavailable("good")  # reported, never raised
    finally:
        native._load.cache_clear()


@needs_kernel
@pytest.mark.parametrize("m,i,k", [(50, 2048, 720), (1, 7, 33), (13, 32, 5), (14, 100, 300), (77, 64, 257)])
def test_panel_glu_matches_float64(m, i, k, gen):
    """silu(x Wg^T) * (x Wu^T) in one pass, inner widths around the 32-wide panel."""
    wg = torch.randn(i, k, generator=gen) * (3 / k ** 0.5)  # gate pre-activations over SiLU's curved range
    wu = torch.randn(i, k, generator=gen) / k ** 0.5
    x = torch.randn(m, k, generator=gen)
    h = panel_gemm.PanelGlu(wg, wu)(x)
    ref = torch.nn.functional.silu(x.double() @ wg.double().t()) * (x.double() @ wu.double().t())
    assert h.shape == (m, i) and _rel(h, ref) <= FP32


@needs_kernel
def test_panel_silu_is_within_a_few_ulp_over_the_fp32_range(gen):
    """The kernel's own exp: gate = up = identity, so h = silu(x) * x elementwise; extremes saturate like torch."""
    x = torch.cat([torch.randn(4000, generator=gen) * 12,
                   torch.tensor([-200.0, -104.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 89.0, 1e4])])
    n = x.numel()
    eye = torch.eye(n)
    h = torch.diagonal(panel_gemm.PanelGlu(eye, eye)(torch.diag(x)))
    ref = torch.nn.functional.silu(x.double()) * x.double()
    rel = ((h.double() - ref).abs() / ref.abs().clamp_min(1e-30))
    assert rel.max().item() <= 5e-7  # a few fp32 ulp (2^-23 = 1.2e-7), the product's rounding included
    assert torch.isfinite(h).all()


@needs_kernel
def test_gemm_silu_glu_epilogue_same_for_every_backend(gen):
    """The panel kernel fuses silu_glu; the other backends apply it after their GEMM: all agree."""
    w = torch.randn(2 * 96, 48, generator=gen) / 48 ** 0.5
    x = torch.randn(50, 48, generator=gen)
    outs = {bk: gemm.Gemm(lambda: (w.clone(), None), bk, "silu_glu")(x) for bk in ("aten", "mkl", "panel")}
    gate, up = (x.double() @ w.double().t()).split(96, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    for bk, out in outs.items():
        assert out.shape == (50, 96) and _rel(out, ref) <= FP32, bk
    with pytest.raises(ValueError, match="bias-free"):
        gemm.Gemm(lambda: (w.clone(), torch.zeros(192)), "panel", "silu_glu")
    with pytest.raises(ValueError, match=r"\[2I, K\]"):
        gemm.Gemm(lambda: (w[:-1].clone(), None), "aten", "silu_glu")

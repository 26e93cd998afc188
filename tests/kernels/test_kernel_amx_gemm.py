"""Our AMX GEMM for few rows (edgefm_kernels/csrc/amx_gemm.c) against float64 on fresh random inputs: bf16 and int8
weights, every fused epilogue, shapes around the 16-row, 16/32-column and 32/64-wide K tiles; through the
registered impls (linear/mlp bf16 with backend=amx, int8_amx); non-finite rows; and its refusal on a CPU
without AMX-INT8."""
import pytest
import torch
import torch.nn.functional as F

from edgefm_kernels import amx_gemm, native
from edgefm_kernels.gemm import Gemm
from edgefm_kernels.quant import QGemm

from kernel_helpers import faked_cpu
from skips import native_mark

needs_amx = native_mark(amx_gemm.NAME)
# max |out - ref| / max |ref|. bf16: inputs and weights rounded to bf16 before, fp32 sums, the output rounded
# once (2^-9): measured 2e-3 - 4e-3. int8: weights per output channel and rows per call rounded to 1/254 of
# their largest value: measured 4e-3 - 1.5e-2 on Gaussian data.
BOUND = {"bf16": 2e-2, "int8": 5e-2}


def _rel(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _reference(x, w, b, post, weights):
    """float64 of the bf16 input's values, with the weight as the kernel sees it before its own rounding."""
    wr = w.bfloat16().double() if weights == "bf16" else w.double()
    y = x.double() @ wr.T + (0 if b is None else b.double())
    if post == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if post == "silu_glu":
        g, u = y.chunk(2, dim=-1)
        return F.silu(g) * u
    return y


def _quantised(x, w):
    """x [M, K] bf16 and w [N, K] as the int8 kernel sees them, in float64: w per output channel
    (amx_gemm.quantize_rows), x per row (scale = max |x| / 127 in fp32, q = round_half_even(x * (1 / scale)))."""
    q, s = amx_gemm.quantize_rows(w)
    xf = x.float()
    xs = xf.abs().amax(dim=1, keepdim=True) / 127
    xs = torch.where(xs > 0, xs, torch.ones_like(xs))
    xq = torch.round(xf * (1 / xs)).clamp(-127, 127)
    return xq.double() * xs.double(), q.double() * s.double()[:, None]


@needs_amx
@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("post", ["none", "gelu_tanh", "silu_glu"])
@pytest.mark.parametrize("m,k,n", [(1, 8, 16), (7, 100, 50), (16, 64, 32), (17, 33, 96), (50, 720, 4096),
                                   (50, 2048, 720), (64, 130, 40), (65, 96, 34), (130, 65, 64)])
def test_amx_gemm_matches_float64(weights, post, m, k, n, gen):
    """Against float64 of what the kernel multiplies: for int8, its quantised operands (the quantisation's own
    error is checked against float elsewhere, at K >= 64: with K = 8 one rounded value can move a GLU output
    by 6% of the largest, 1 seed in 400), so the bound is the output's bf16 rounding for both."""
    if post == "silu_glu" and n % 2:
        n += 1
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = None if post == "silu_glu" else torch.randn(n, generator=gen)
    x = torch.randn(m, k, generator=gen).bfloat16()
    out = amx_gemm.AmxWeight(w, b, post, weights)(x)
    if weights == "int8":
        xq, wq = _quantised(x, w)
        ref = _reference(xq, wq, b, post, "int8")
    else:
        ref = _reference(x, w, b, post, weights)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert _rel(out, ref) <= BOUND["bf16"]


@needs_amx
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_amx_gemm_reads_strided_rows_and_scaled_rows(weights, gen):
    """A row-strided input (a slice of a wider tensor) and rows of very different magnitudes: int8 quantises
    each row on its own scale, so a small row keeps its relative accuracy next to a large one."""
    k, n = 96, 48
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    wide = torch.randn(20, k + 32, generator=gen)
    wide[3] *= 1e-3
    wide[5] *= 1e3
    x = wide.bfloat16()[:, 16:16 + k]
    out = amx_gemm.AmxWeight(w, None, "none", weights)(x)
    ref = _reference(x, w, None, "none", weights)
    for r in range(x.shape[0]):
        assert _rel(out[r], ref[r]) <= BOUND[weights], r


@needs_amx
def test_int8_rows_holding_nan_or_inf_give_nan_rows_and_leave_the_others(gen):
    w = torch.randn(32, 64, generator=gen)
    x = torch.randn(5, 64, generator=gen).bfloat16()
    x[1, 3], x[3, 0] = float("nan"), float("inf")
    out = amx_gemm.AmxWeight(w, None, "none", "int8")(x)
    assert torch.isnan(out[1]).all() and torch.isnan(out[3]).all()
    good = [0, 2, 4]
    assert torch.isfinite(out[good]).all()
    assert _rel(out[good], _reference(x[good], w, None, "none", "int8")) <= BOUND["int8"]


@needs_amx
def test_zero_rows_and_zero_weight_channels_are_exact_zeros(gen):
    w = torch.randn(32, 64, generator=gen)
    w[7] = 0
    x = torch.randn(4, 64, generator=gen).bfloat16()
    x[2] = 0
    for weights in ("bf16", "int8"):
        out = amx_gemm.AmxWeight(w, None, "none", weights)(x)
        assert (out[2] == 0).all() and (out[:, 7] == 0).all()
    assert amx_gemm.AmxWeight(w, None, "none", "int8")(x[:0]).shape == (0, 32)


@needs_amx
def test_amx_gemm_refuses_bad_operands():
    w = torch.randn(32, 64)
    k = amx_gemm.AmxWeight(w, None)
    with pytest.raises(ValueError, match="float32"):
        k(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        k(torch.randn(4, 65).bfloat16())
    with pytest.raises(ValueError, match="bias-free"):
        amx_gemm.AmxWeight(w, torch.zeros(32), "silu_glu")
    with pytest.raises(ValueError, match="'fp8'"):
        amx_gemm.AmxWeight(w, None, "none", "fp8")
    with pytest.raises(ValueError, match="odd|33 rows"):
        amx_gemm.AmxWeight(torch.randn(33, 64), None, "silu_glu")


@needs_amx
@pytest.mark.parametrize("post", ["none", "silu_glu"])
def test_registered_paths_match_the_library_gemm(post, gen):
    """Gemm(backend='amx') and QGemm('int8_amx'), as the dispatch builds them, against oneDNN's bf16 GEMM
    (+ our epilogue) on the expert's decode shape, [B, chunk, K] in."""
    k, n = 720, 512
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    x = torch.randn(1, 50, k, generator=gen).bfloat16()
    library = Gemm(lambda: (w.bfloat16(), None), "onednn", post, "avx512")(x)
    amx = Gemm(lambda: (w.bfloat16(), None), "amx", post)(x)
    int8 = QGemm(lambda: (w, None), post, "int8_amx")(x)
    assert amx.shape == int8.shape == library.shape
    assert _rel(amx, library.double()) <= BOUND["bf16"]
    assert _rel(int8, library.double()) <= BOUND["int8"]


def test_without_amx_int8_the_gemm_is_refused_before_any_build(monkeypatch, tmp_path):
    """A CPU with AMX-BF16 but no AMX-INT8 (flags faked): refused with the flag named, nothing compiled, and
    the impls that use it reject every op; the oneDNN paths stay."""
    from edgefm_kernels.registry import OpSpec, get_impl

    with faked_cpu(monkeypatch, tmp_path, drop={"amx_int8"}, add={"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"},
                   caches=(amx_gemm.unavailable,)):
        why = amx_gemm.unavailable()
        assert why is not None and "amx_int8" in why
        assert not list(tmp_path.rglob("amx_gemm*")), "built although the CPU cannot run it"
        spec = OpSpec("mlp", "expert.layers.0.mlp", "expert_mlp", "decode", "silu_gated:720x2048",
                      "cpu_x86_avx512_bf16", dims={"hidden": 720, "inner": 2048})
        assert "amx_int8" in get_impl("mlp", "int8_amx").rejects(spec, {})
        assert "amx_int8" in get_impl("mlp", "bf16").rejects(spec, {"backend": "amx"})
        assert get_impl("mlp", "bf16").rejects(spec, {"backend": "onednn"}) is None
        with pytest.raises(RuntimeError, match="amx_int8"):
            amx_gemm.AmxWeight(torch.randn(32, 64), None)


@needs_amx
@pytest.mark.parametrize("weights", ["bf16", "int8"])
@pytest.mark.parametrize("post", ["none", "gelu_tanh", "silu_glu"])
def test_residual_is_added_in_the_epilogue(weights, post, gen):
    """y = post(x W^T + b) + residual, one rounding; a residual of the wrong shape or dtype is refused."""
    m, k, n = 50, 96, 64
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = None if post == "silu_glu" else torch.randn(n, generator=gen)
    x = torch.randn(m, k, generator=gen).bfloat16()
    kern = amx_gemm.AmxWeight(w, b, post, weights)
    res = torch.randn(m, kern.out_features, generator=gen).bfloat16()
    ref = _reference(x, w, b, post, weights) + res.double()
    assert _rel(kern(x, res), ref) <= BOUND[weights]
    with pytest.raises(ValueError, match="residual"):
        kern(x, res[:, :-1])
    with pytest.raises(ValueError, match="residual"):
        kern(x, res.float())


@needs_amx
@pytest.mark.parametrize("impl_id,params", [("int8_amx", {}), ("bf16", {"backend": "amx"}),
                                            ("bf16", {"backend": "onednn"}), ("ref", {})])
def test_mlp_with_a_residual_is_the_residual_plus_the_mlp(impl_id, params, gen):
    """Every MLP impl takes ``residual=``: ours add it in the kernel, the others after; same result within
    the impl's precision, and the reference bitwise ``residual + mlp(x)``."""
    from edgefm_kernels.registry import OpSpec, get_impl

    h, inner = 64, 128
    weights = {"gate": torch.randn(inner, h, generator=gen) / h ** 0.5,
               "up": torch.randn(inner, h, generator=gen) / h ** 0.5,
               "down": torch.randn(h, inner, generator=gen) / inner ** 0.5}
    spec = OpSpec("mlp", "expert.layers.0.mlp", "expert_mlp", "decode", f"silu_gated:{h}x{inner}",
                  "cpu_x86_avx512_bf16", dims={"hidden": h, "inner": inner})
    mlp = get_impl("mlp", impl_id).build(spec, params, weights=weights, act="silu_gated")
    dtype = torch.float32 if impl_id == "ref" else torch.bfloat16
    x = torch.randn(1, 50, h, generator=gen).to(dtype)
    res = torch.randn(1, 50, h, generator=gen).to(dtype)
    out = mlp(x, residual=res)
    assert out.dtype == dtype and out.shape == res.shape
    if impl_id == "ref":
        assert torch.equal(out, res + mlp(x))
    else:
        ref = res.double() + F.linear(F.silu(F.linear(x.double(), weights["gate"].double()))
                                      * F.linear(x.double(), weights["up"].double()), weights["down"].double())
        assert _rel(out, ref) <= BOUND["int8" if impl_id == "int8_amx" else "bf16"]


@needs_amx
@pytest.mark.parametrize("m,n", [(50, 4096), (150, 200), (3, 40)])
def test_shared_out_work_gives_the_same_bits_for_any_thread_count(m, n, gen):
    """The threads share out (column range, row group) units as they go (a preempted thread's share is taken
    by the other): every output is made once, the same way, whatever the number of threads, more threads than
    cores or than column ranges included."""
    for weights in ("bf16", "int8"):
        kern = amx_gemm.AmxWeight(torch.randn(n, 96, generator=gen), torch.randn(n, generator=gen), "gelu_tanh",
                                  weights)
        x = torch.randn(m, 96, generator=gen).bfloat16()
        res = torch.randn(m, n, generator=gen).bfloat16()
        old = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = kern(x, res)
            for threads in (2, 3, 5):
                torch.set_num_threads(threads)
                assert torch.equal(kern(x, res), one), (weights, threads)
        finally:
            torch.set_num_threads(old)

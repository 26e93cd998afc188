"""Our AVX512-VNNI int8 GEMM (edgefm_kernels/csrc/vnni_gemm.c) against float64 on fresh random inputs: every fused
epilogue and the residual, shapes around its 10-row blocks, 32-column blocks and 4-wide K groups; rows of very
different magnitudes; non-finite and zero rows; through the registered impl (int8_vnni, as the dispatch builds
it) against oneDNN's dynamic int8 and fp32; and its refusal on a CPU without AVX512-VNNI."""
import pytest
import torch
import torch.nn.functional as F

from edgefm_kernels import amx_gemm, native, vnni_gemm
from edgefm_kernels.quant import QGemm

from kernel_helpers import faked_cpu
from skips import native_mark

needs_vnni = native_mark(vnni_gemm.NAME)
# max |out - ref| / max |ref| against float64 of the quantised operands: only the fp32 epilogue's rounding
# and the int32 -> fp32 conversion remain (measured < 1e-6); against the float operands the int8 rounding of
# both (1/254 of each row's and channel's largest value) dominates: measured 3e-3 - 1.5e-2 on Gaussian data.
BOUND_QUANTISED = 1e-5
BOUND_INT8 = 5e-2


def _rel(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _reference(x, w, b, post, residual=None):
    y = x.double() @ w.double().T + (0 if b is None else b.double())
    if post == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif post == "silu_glu":
        g, u = y.chunk(2, dim=-1)
        y = F.silu(g) * u
    return y if residual is None else y + residual.double()


def _quantised(x, w):
    """x [M, K] fp32 and w [N, K] as the kernel sees them, in float64: w per output channel
    (quantize_rows), x per row (scale = max |x| / 127, q = round_half_even(x * (127 / max |x|)))."""
    q, s = amx_gemm.quantize_rows(w)
    a = x.abs().amax(dim=1, keepdim=True)
    inv = torch.full_like(a, 127.0) / a  # a true division, as the kernel's (``127 / a`` is 127 * a.reciprocal())
    xq = torch.where(a > 0, torch.round(x * inv), torch.zeros_like(x)).clamp(-127, 127)
    return xq.double() * (a / 127).double(), q.double() * s.double()[:, None]


@needs_vnni
@pytest.mark.parametrize("post", ["none", "gelu_tanh", "silu_glu"])
@pytest.mark.parametrize("m,k,n", [(1, 4, 16), (7, 100, 50), (10, 64, 32), (11, 36, 64), (12, 64, 32), (13, 33, 96), (25, 5, 3), (50, 720, 4096),
                                   (50, 2048, 720), (241, 130, 40), (250, 96, 34)])
def test_vnni_gemm_matches_float64(post, m, k, n, gen):
    """Against float64 of the quantised operands (tight), and of the float ones (the int8 bound); with and
    without a residual."""
    if post == "silu_glu" and n % 2:
        n += 1
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = None if post == "silu_glu" else torch.randn(n, generator=gen)
    x = torch.randn(m, k, generator=gen)
    kern = vnni_gemm.VnniWeight(w, b, post)
    res = torch.randn(m, kern.out_features, generator=gen)
    xq, wq = _quantised(x, w)
    for r in (None, res):
        out = kern(x, r)
        assert out.shape == (m, kern.out_features) and out.dtype == torch.float32
        assert _rel(out, _reference(xq, wq, b, post, r)) <= BOUND_QUANTISED
        if k >= 64:  # with K < 64 one rounded value can move an output by several % of the largest
            assert _rel(out, _reference(x, w, b, post, r)) <= BOUND_INT8


@needs_vnni
def test_rows_are_quantised_each_on_its_own_scale_and_strided_rows_are_read(gen):
    k, n = 96, 48
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    wide = torch.randn(30, k + 32, generator=gen)
    wide[3] *= 1e-3
    wide[17] *= 1e3
    x = wide[:, 16:16 + k]
    out = vnni_gemm.VnniWeight(w, None, "none")(x)
    ref = _reference(x, w, None, "none")
    for r in range(x.shape[0]):
        assert _rel(out[r], ref[r]) <= BOUND_INT8, r


@needs_vnni
def test_rows_holding_nan_or_inf_give_nan_rows_zero_rows_give_zeros(gen):
    w = torch.randn(32, 64, generator=gen)
    w[7] = 0
    x = torch.randn(14, 64, generator=gen)
    x[1, 3], x[3, 0], x[13, 63] = float("nan"), float("inf"), float("-inf")
    x[2] = 0
    out = vnni_gemm.VnniWeight(w, None, "none")(x)
    assert torch.isnan(out[[1, 3, 13]]).all()
    good = [r for r in range(14) if r not in (1, 3, 13)]
    assert torch.isfinite(out[good]).all() and (out[2] == 0).all() and (out[good][:, 7] == 0).all()
    assert _rel(out[good], _reference(x[good], w, None, "none")) <= BOUND_INT8
    assert vnni_gemm.VnniWeight(w, None, "none")(x[:0]).shape == (0, 32)


@needs_vnni
def test_vnni_gemm_refuses_bad_operands():
    w = torch.randn(32, 64)
    k = vnni_gemm.VnniWeight(w, None)
    with pytest.raises(ValueError, match="bfloat16"):
        k(torch.randn(4, 64).bfloat16())
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        k(torch.randn(4, 65))
    with pytest.raises(ValueError, match="residual"):
        k(torch.randn(4, 64), torch.randn(4, 31))
    with pytest.raises(ValueError, match="bias"):
        vnni_gemm.VnniWeight(w, torch.zeros(32), "silu_glu")
    with pytest.raises(ValueError, match="'relu'"):
        vnni_gemm.VnniWeight(w, None, "relu")
    with pytest.raises(ValueError, match=r"\[2I, K\]"):
        vnni_gemm.VnniWeight(torch.randn(33, 64), None, "silu_glu")


@needs_vnni
@pytest.mark.parametrize("post", ["none", "gelu_tanh", "silu_glu"])
def test_registered_int8_vnni_matches_fp32_and_beats_onednn_int8_precision(post, gen):
    """QGemm('int8_vnni') as the dispatch builds it, [B, rows, K] in, against fp32: within the int8 bound, and
    per-row quantisation no less precise than oneDNN's per-call one on rows of different magnitudes."""
    k, n = 256, 128
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    b = None if post == "silu_glu" else torch.randn(n, generator=gen)
    x = torch.randn(1, 60, k, generator=gen) * torch.logspace(-2, 1, 60)[None, :, None]
    ref = _reference(x[0], w, b, post)
    ours = QGemm(lambda: (w, b), post, "int8_vnni")(x)
    dyn = QGemm(lambda: (w, b), post, "int8_dyn")(x)
    assert ours.shape == dyn.shape == (1, 60, ref.shape[1]) and ours.dtype == torch.float32
    err_ours = ((ours[0].double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
    err_dyn = ((dyn[0].double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
    assert err_ours <= BOUND_INT8 and err_ours < err_dyn, (err_ours, err_dyn)


def test_without_avx512_vnni_the_gemm_is_refused_before_any_build(monkeypatch, tmp_path):
    """A CPU without AVX512-VNNI (flags faked): refused with the flag named, nothing compiled, and the impls
    that use it reject every op; oneDNN's int8 stays."""
    from edgefm_kernels.registry import OpSpec, get_impl

    with faked_cpu(monkeypatch, tmp_path, drop={"avx512_vnni"}, add={"avx512f", "avx512bw"},
                   caches=(vnni_gemm.unavailable,)):
        why = vnni_gemm.unavailable()
        assert why is not None and "avx512_vnni" in why
        assert not list(tmp_path.rglob("vnni_gemm*")), "built although the CPU cannot run it"
        spec = OpSpec("mlp", "vision.layers.0.mlp", "vision_mlp", "prefill", "gelu_tanh:768x3072",
                      "cpu_x86_avx512_bf16", dims={"hidden": 768, "inner": 3072})
        assert "avx512_vnni" in get_impl("mlp", "int8_vnni").rejects(spec, {})
        assert get_impl("mlp", "int8_dyn").rejects(spec, {}) is None
        with pytest.raises(RuntimeError, match="avx512_vnni"):
            vnni_gemm.VnniWeight(torch.randn(32, 64), None)

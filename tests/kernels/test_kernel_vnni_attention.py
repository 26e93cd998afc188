"""Our AVX512-VNNI int8 attention (edgefm_kernels/csrc/vnni_attention.c) on fresh random inputs: against the float64
reference of the same arithmetic (vnni_attention.reference), against fp32 attention (the int8 bound), with
masks, grouped KV heads, odd sizes and strided operands; non-finite rows; bad operands; through the
registered impl; and its refusal on a CPU without AVX512-VNNI."""
import pytest
import torch

from edgefm_kernels import cpu_attention, vnni_attention
from edgefm_kernels.attention import EagerAttention
from edgefm_kernels.registry import OpSpec, get_impl

from kernel_helpers import faked_cpu
from skips import native_mark

needs_vnni = native_mark(vnni_attention.NAME)
# Against the float64 reference, in units of a row's "one byte of p": (largest |v - mean v| of the channel) /
# (the row's sum of p bytes). The kernel rounds in fp32 where the reference rounds in float64, so a p byte,
# a query or a key value that lies within ~1e-6 of a rounding boundary can round the other way. Measured
# (12 heads x 1024 x 1024): 99.99% of outputs within 2.1 units, the largest 7.2 (a query value flipped in a
# very peaked row). A wrong kernel is off by the outputs' own size, hundreds of units.
BOUND_UNITS, BOUND_UNITS_RMS = 16.0, 0.5
# Against fp32 attention: max |out - ref| / max |ref|, measured 0.03-0.04 on these Gaussian inputs (scores
# up to ~30: the softmax is peaked, so a query's rounding moves whole rows).
BOUND_INT8 = 0.08


def _units(q, k, v, mask):
    """[B, H, Lq, D] float64: the reference's one-byte-of-p unit per output."""
    g = q.shape[1] // k.shape[1]
    vd = v.double().repeat_interleave(g, 1)
    psum = vnni_attention.p_bytes(q, k.repeat_interleave(g, 1), mask).sum(-1, keepdim=True)
    vrange = (vd - vd.mean(2, keepdim=True)).abs().amax(2, keepdim=True)  # [B, H, 1, D]
    return (vrange / psum).clamp_min(1e-6)  # a constant channel (one key) is exact: its mean


def _check(q, k, v, mask):
    out = vnni_attention.attention(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == torch.float32
    ref = vnni_attention.reference(q, k, v, mask)
    err = (out.double() - ref).abs() / _units(q, k, v, mask)
    assert err.max().item() <= BOUND_UNITS, err.max().item()
    assert err.pow(2).mean().sqrt().item() <= BOUND_UNITS_RMS, err.pow(2).mean().sqrt().item()
    exact = EagerAttention()(q.double(), k.double(), v.double(), mask)
    rel = ((out.double() - exact).abs().max() / exact.abs().max()).item()
    assert rel <= BOUND_INT8, rel
    return out


@needs_vnni
@pytest.mark.parametrize("b,h,hkv,lq,lk,d", [(1, 12, 12, 1024, 1024, 64), (2, 4, 2, 37, 50, 24), (1, 3, 1, 5, 3, 7),
                                             (1, 2, 2, 49, 65, 64), (1, 1, 1, 1, 1, 1), (1, 2, 1, 60, 130, 80)])
def test_vnni_attention_matches_its_reference_and_fp32(b, h, hkv, lq, lk, d, gen):
    """Shapes around the 48-query blocks, 6-row and 64-key register blocks, 4-wide dims and 64-channel value
    blocks; keys and values offset from zero (the centring); grouped KV heads."""
    q = torch.randn(b, h, lq, d, generator=gen) * 2
    k = torch.randn(b, hkv, lk, d, generator=gen) * 2 + torch.randn(d, generator=gen)
    v = torch.randn(b, hkv, lk, d, generator=gen) + torch.randn(d, generator=gen) * 3
    _check(q, k, v, None)


@needs_vnni
def test_vnni_attention_masks_and_strided_operands(gen):
    """A bool mask (a row with no visible key gets uniform weights, as the reference), and q/k/v as slices of
    one fused QKV output (row stride 3 x H x D), as the vision tower passes them."""
    b, h, l, d = 2, 3, 70, 64
    qkv = torch.randn(b, l, 3, h, d, generator=gen) * 2
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert q.stride(2) == 3 * h * d
    mask = torch.rand(b, l, l, generator=gen) > 0.4
    mask[1, 5] = False
    out = _check(q, k, v, mask)
    uniform = v[1].mean(dim=1)  # [H, D]: every key weighted alike
    torch.testing.assert_close(out[1, :, 5], uniform, atol=3 * v.abs().max().item() / 127, rtol=0)


@needs_vnni
def test_vnni_attention_nonfinite_inputs_give_nan_where_the_reference_does(gen):
    """A query row with a NaN: that output row NaN, the others finite; a key with an inf: its head NaN; a value
    channel with a NaN: that output column NaN."""
    q, k, v = (torch.randn(1, 2, 20, 16, generator=gen) for _ in range(3))
    q[0, 0, 3, 2] = float("nan")
    k[0, 1, 7, 0] = float("inf")
    v[0, 0, 11, 5] = float("nan")
    out = vnni_attention.attention(q, k, v, None)
    assert out[0, 0, 3].isnan().all()
    assert out[0, 1].isnan().all()
    assert out[0, 0, :, 5].isnan().all()
    rest = torch.cat([out[0, 0, :3], out[0, 0, 4:]])
    assert torch.isfinite(torch.cat([rest[:, :5], rest[:, 6:]], dim=1)).all()


@needs_vnni
def test_vnni_attention_refuses_bad_operands():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="float32"):
        vnni_attention.attention(q.double(), q, q, None)
    with pytest.raises(ValueError, match="mask"):
        vnni_attention.attention(q, q, q, torch.ones(1, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="Lk=65536"):
        vnni_attention.attention(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 65536, 4), torch.randn(1, 1, 65536, 4),
                                 None)


@needs_vnni
def test_registered_int8_vnni_attention_is_the_kernel_and_within_the_int8_bound(gen):
    """impl 'int8_vnni' as the dispatch builds it for the vision tower's op: the kernel's own answer, bf16 in
    and out where asked, and within the int8 bound of the fp32 kernel."""
    spec = OpSpec("attention", "vision.layers.0.self_attn.attn", "vision_attn", "prefill", "h12/12xd64",
                  "cpu_x86_avx512_bf16", dims={"heads": 12, "kv_heads": 12, "head_dim": 64})
    impl = get_impl("attention", "int8_vnni")
    assert impl.rejects(spec, {}) is None and impl.precision == "int8"
    kern = impl.build(spec, {})
    q, k, v = (torch.randn(1, 12, 200, 64, generator=gen) for _ in range(3))
    out = kern(q, k, v, None)
    assert torch.equal(out, vnni_attention.attention(q, k, v, None))
    fp32 = cpu_attention.attention(q, k, v, None)
    assert ((out - fp32).abs().max() / fp32.abs().max()).item() <= BOUND_INT8
    assert kern(q.bfloat16(), k.bfloat16(), v.bfloat16(), None).dtype == torch.bfloat16


def test_without_avx512_vnni_the_attention_is_refused_before_any_build(monkeypatch, tmp_path):
    """A CPU without AVX512-VNNI (flags faked): refused with the flag named, nothing compiled, and the impl
    rejects the vision op while the fp32 AVX-512 kernel still serves it."""
    spec = OpSpec("attention", "vision.layers.0.self_attn.attn", "vision_attn", "prefill", "h12/12xd64",
                  "cpu_x86_avx512_bf16", dims={"heads": 12, "kv_heads": 12, "head_dim": 64})
    with faked_cpu(monkeypatch, tmp_path, drop={"avx512_vnni"}, add={"avx512f", "avx512bw"},
                   caches=(vnni_attention.unavailable,)):
        why = vnni_attention.unavailable()
        assert why is not None and "avx512_vnni" in why
        assert not list(tmp_path.rglob("vnni_attention*")), "built although the CPU cannot run it"
        assert "avx512_vnni" in get_impl("attention", "int8_vnni").rejects(spec, {})
        assert get_impl("attention", "avx512").rejects(spec, {}) is None

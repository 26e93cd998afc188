"""GPU-only implementations: their refusals and pure helpers on any machine; the kernels themselves on
a CUDA device only (skipped with the reason otherwise; scripts/device_check.sh runs them on a GPU)."""
import pytest
import torch

from edgefm_kernels import cuda_linear, flashinfer_ops
from edgefm_kernels.registry import get_impl

from kernel_helpers import rel_err, reference, spec
from skips import gpu_mark, require_material, skip_hardware

CUDA = torch.cuda.is_available()


def test_gpu_impls_refuse_cpu_profiles_with_a_reason():
    for kind, impl_id in (("attention", "flashinfer"), ("linear", "fp8"), ("rms_norm", "triton"), ("rope", "triton")):
        why = get_impl(kind, impl_id).rejects(spec(kind, heads=4, kv_heads=2, head_dim=64), {})
        assert why and "needs hardware" in why


def test_fp8_needs_hopper_or_ada():
    impl = get_impl("linear", "fp8")
    assert "sm89" in impl.rejects(spec("linear", hw="cuda_sm80", **{"in": 960}), {})
    assert "divisible by 16" in impl.rejects(spec("linear", hw="cuda_sm90", **{"in": 40}), {})
    assert cuda_linear.sm_of("cuda_sm90") == 90 and cuda_linear.sm_of("cuda_sm87") == 87
    assert cuda_linear.sm_of("cpu_x86_avx512_bf16") is None


def test_fp8_quantisation_roundtrip(gen):
    """The e4m3 per-row quantiser (a numeric helper, runs on CPU): relative error of e4m3's mantissa."""
    w = torch.randn(32, 64, generator=gen)
    q, scale = cuda_linear.quantize_fp8(w, dim=1)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (32, 1)
    back = q.float() * scale
    assert ((back - w).abs() <= w.abs() * 2 ** -3 + scale * 2 ** -6).all()


def test_flashinfer_reports_why_it_cannot_run():
    why = flashinfer_ops.available()
    assert why is None or "flashinfer" in why or "CUDA" in why
    impl = get_impl("attention", "flashinfer")
    assert "head_dim" in impl.rejects(spec("attention", hw="cuda_sm90", heads=4, kv_heads=2, head_dim=48), {})


@gpu_mark("FlashInfer needs a CUDA device")
@pytest.mark.parametrize("lq,lk,masked", [(211, 211, True), (50, 261, True), (1, 211, False), (64, 64, False)])
def test_flashinfer_matches_eager(lq, lk, masked, gen):
    why = flashinfer_ops.available()
    require_material(why is None, f"FlashInfer unavailable on this GPU machine: {why}")
    q = torch.randn(1, 15, lq, 64, generator=gen).cuda()
    k, v = (torch.randn(1, 5, lk, 64, generator=gen).cuda() for _ in range(2))
    mask = None
    if masked:
        mask = (torch.rand(1, lq, lk, generator=gen) < 0.7).cuda()
        mask[..., 0] = True
        mask[0, lq // 2] = False
    ref = reference("attention").build(spec("attention"), {})(q, k, v, mask)
    hw = f"cuda_sm{''.join(map(str, torch.cuda.get_device_capability()))}"
    kern = get_impl("attention", "flashinfer").build(spec("attention", hw=hw, heads=15, kv_heads=5, head_dim=64), {})
    out = kern(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert out.shape == q.shape and rel_err(out.float(), ref) <= 3e-2


@gpu_mark("fp8 GEMMs need a CUDA device")
def test_fp8_linear_matches_reference(gen):
    if torch.cuda.get_device_capability() < (8, 9):
        skip_hardware("no-gpu", "fp8 tensor cores need sm89+")
    w = [(torch.randn(256, 128, generator=gen) / 11, torch.randn(256, generator=gen)), (torch.randn(64, 128, generator=gen) / 11, None)]
    x = torch.randn(50, 128, generator=gen)
    ref = reference("linear").build(spec("linear"), {}, weights=w)(x)
    hw = f"cuda_sm{''.join(map(str, torch.cuda.get_device_capability()))}"
    out = get_impl("linear", "fp8").build(spec("linear", hw=hw, **{"in": 128}), {}, weights=w)(x.cuda())
    for o, r in zip(out, ref):
        assert rel_err(o.float().cpu(), r) <= 1.5e-1

"""The compiled AVX-512 attention (edgefm_kernels/csrc/attention.c) against float64 on fresh random inputs."""
import pytest
import torch

from edgefm_kernels import cpu_attention
from edgefm_kernels.attention import EagerAttention

from kernel_helpers import spec, variants
from skips import native_mark, require_native

needs_kernel = native_mark(cpu_attention.NAME)  # allowed skip only on a CPU without AVX-512
FP32 = 1e-5  # max |out - ref| / max |ref|; measured ~1e-6 at 1024 keys


def _rel(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _inputs(gen, b, hq, hkv, lq, lk, d, masked, scale=1.0):
    q = torch.randn(b, hq, lq, d, generator=gen) * scale
    k, v = (torch.randn(b, hkv, lk, d, generator=gen) for _ in range(2))
    mask = None
    if masked:
        mask = torch.rand(b, lq, lk, generator=gen) < 0.6
        mask[0, lq // 2] = False  # a query that sees no key: uniform weights, as the reference gives it
    return q, k, v, mask


@needs_kernel
@pytest.mark.parametrize("lq,lk", [(1, 1), (5, 15), (47, 16), (48, 17), (49, 63), (97, 64), (6, 65), (30, 130)])
@pytest.mark.parametrize("d", [8, 16, 64, 72, 128, 160])
def test_matches_float64_across_block_edges(lq, lk, d, gen):
    """Queries around the 6-row and 48-row blocks, keys around the 16-key groups and 64-key blocks, head
    sizes below, at and between whole vectors (72: SigLIP-so400m) and past the 64-dim value passes."""
    for hq, hkv, masked in ((2, 2, False), (4, 2, True)):
        q, k, v, mask = _inputs(gen, 2, hq, hkv, lq, lk, d, masked)
        ref = EagerAttention()(q.double(), k.double(), v.double(), mask)
        out = cpu_attention.attention(q, k, v, mask)
        assert out.shape == (2, hq, lq, d) and out.dtype == torch.float32
        assert _rel(out, ref) <= FP32, (hq, hkv, masked)


@needs_kernel
def test_vision_shape_from_a_fused_qkv_and_peaked_scores(gen):
    """The vision tower's call: q/k/v are strided slices of one [B, L, 3*H*D] projection; large logits
    (peaked softmax) must not overflow. The result's transpose(1, 2) is contiguous: the output projection
    reads it without a copy."""
    b, length, h, d = 1, 300, 12, 64
    qkv = torch.randn(b, length, 3 * h * d, generator=gen) * 3
    q, k, v = (t.view(b, length, h, d).transpose(1, 2) for t in qkv.split(h * d, -1))
    out = cpu_attention.attention(q, k, v, None)
    assert _rel(out, EagerAttention()(q.double(), k.double(), v.double(), None)) <= FP32
    assert out.transpose(1, 2).is_contiguous()


@needs_kernel
def test_threads_do_not_change_the_result(gen):
    """Each (batch, head) runs on one thread in a fixed order: bitwise equal for 1 and 2 threads."""
    q, k, v, mask = _inputs(gen, 2, 6, 3, 70, 90, 64, True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_attention.attention(q, k, v, mask)
        torch.set_num_threads(2)
        two = cpu_attention.attention(q, k, v, mask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_kernel
def test_bad_operands_are_named(gen):
    q, k, v, mask = _inputs(gen, 1, 2, 2, 8, 8, 64, True)
    with pytest.raises(ValueError, match="q must be a 4-d float32"):
        cpu_attention.attention(q.double(), k, v, mask)
    with pytest.raises(ValueError, match="k and v must be"):
        cpu_attention.attention(q, k, v[..., :7, :], mask)
    with pytest.raises(ValueError, match="mask must be bool"):
        cpu_attention.attention(q, k, v, mask[:, :4])
    with pytest.raises(ValueError, match="Lk=0"):
        cpu_attention.attention(q, k[..., :0, :], v[..., :0, :], None)


def test_impl_serves_any_head_size_on_avx512_cpus_only():
    require_native(cpu_attention.NAME)
    impl = next(i for i, _ in variants("attention", heads=2, kv_heads=2, head_dim=64) if i.impl_id == "avx512")
    assert impl.rejects(spec("attention", heads=2, kv_heads=2, head_dim=72), {}) is None
    assert "multiple" in impl.rejects(spec("attention", heads=5, kv_heads=2, head_dim=64), {})
    assert impl.rejects(spec("attention", hw="cpu_x86_avx2", heads=2, kv_heads=2, head_dim=64), {})

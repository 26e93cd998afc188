"""Attention implementations against LeRobot's eager reference: GQA, masks, fully masked rows, bf16."""
import pytest
import torch

from kernel_helpers import bound, reference, rel_err, spec, variants, vid

SHAPES = {  # name -> (B, Hq, Hkv, Lq, Lk, D, masked)
    "vision_mha_nomask": (2, 4, 4, 33, 33, 16, False),
    "vlm_gqa": (1, 6, 2, 40, 40, 16, True),
    "expert_self_gqa": (2, 6, 2, 9, 49, 32, True),
    "expert_cross_gqa": (1, 15, 5, 12, 29, 64, True),
}


def _mask(gen, b, lq, lk):
    m = torch.rand(b, lq, lk, generator=gen) < 0.6
    m[..., 0] = True
    m[0, lq // 2] = False  # a fully masked query row (a masked camera's token)
    return m


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_matches_eager(name, dtype, gen):
    b, hq, hkv, lq, lk, d, masked = SHAPES[name]
    q = torch.randn(b, hq, lq, d, generator=gen)
    k, v = (torch.randn(b, hkv, lk, d, generator=gen) for _ in range(2))
    mask = _mask(gen, b, lq, lk) if masked else None
    ref = reference("attention").build(spec("attention"), {})(q, k, v, mask)
    tested = 0
    for impl, params in variants("attention", heads=hq, kv_heads=hkv, head_dim=d):
        out = impl.build(spec("attention", heads=hq, kv_heads=hkv), params)(q.to(dtype), k.to(dtype), v.to(dtype), mask)
        assert out.shape == q.shape and out.dtype == dtype, vid((impl, params))
        assert torch.isfinite(out).all(), vid((impl, params))
        assert rel_err(out, ref) <= bound(impl, dtype), f"{vid((impl, params))}: {rel_err(out, ref):.2e}"
        tested += 1
    assert tested >= 2


def test_fully_masked_row_gets_uniform_weights(gen):
    """LeRobot's finfo.min masking: a row that sees no key averages all values (never NaN)."""
    b, h, lq, lk, d = 1, 2, 5, 7, 8
    q, k, v = torch.randn(b, h, lq, d, generator=gen), torch.randn(b, h, lk, d, generator=gen), torch.randn(b, h, lk, d, generator=gen)
    mask = torch.ones(b, lq, lk, dtype=torch.bool)
    mask[0, 3] = False
    for impl, params in variants("attention", heads=h, kv_heads=h, head_dim=d):
        out = impl.build(spec("attention", heads=h, kv_heads=h), params)(q, k, v, mask)
        # a quantised impl's values are rounded (int8: to 1/127 of each channel's range)
        tol = 1e-5 if impl.precision == "fp32" else bound(impl, v.dtype) * v.abs().max().item()
        torch.testing.assert_close(out[0, :, 3], v[0].mean(dim=1), rtol=0, atol=tol)


def test_sdpa_mask_cache_follows_the_mask_object(gen):
    """The additive form is cached per mask object: a new mask (next chunk) is converted again."""
    impl = next(i for i, _ in variants("attention", heads=2, kv_heads=1, head_dim=8) if i.impl_id == "sdpa")
    kern = impl.build(spec("attention", heads=2, kv_heads=1), {"gqa": "native"})
    q, k, v = torch.randn(1, 2, 4, 8, generator=gen), torch.randn(1, 1, 6, 8, generator=gen), torch.randn(1, 1, 6, 8, generator=gen)
    eager = reference("attention").build(spec("attention"), {})
    for _ in range(3):
        mask = torch.rand(1, 4, 6, generator=gen) < 0.5
        mask[..., 0] = True
        torch.testing.assert_close(kern(q, k, v, mask), eager(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_sdpa_all_visible_mask_takes_the_unmasked_path(gen):
    """A chunk without padding has an all-True cross mask: SDPA runs unmasked, same result as eager;
    the next chunk's partial mask is applied again (the shortcut is per mask object)."""
    impl = next(i for i, _ in variants("attention", heads=6, kv_heads=2, head_dim=16) if i.impl_id == "sdpa")
    kern = impl.build(spec("attention", heads=6, kv_heads=2), {"gqa": "native"})
    eager = reference("attention").build(spec("attention"), {})
    q = torch.randn(1, 6, 10, 16, generator=gen)
    k, v = torch.randn(1, 2, 30, 16, generator=gen), torch.randn(1, 2, 30, 16, generator=gen)
    full = torch.ones(1, 10, 30, dtype=torch.bool)
    torch.testing.assert_close(kern(q, k, v, full), eager(q, k, v, full), rtol=1e-5, atol=1e-5)
    assert kern.additive(full, torch.float32) is None
    part = _mask(gen, 1, 10, 30)
    torch.testing.assert_close(kern(q, k, v, part), eager(q, k, v, part), rtol=1e-5, atol=1e-5)
    assert kern.additive(part, torch.float32).shape == (1, 1, 10, 30)


def test_sdpa_parameters_are_checked():
    impl = next(i for i, _ in variants("attention", heads=4, kv_heads=2) if i.impl_id == "sdpa")
    assert impl.rejects(spec("attention", heads=4, kv_heads=4), {"gqa": "native"}) is None  # MHA: a no-op
    assert "multiple" in impl.rejects(spec("attention", heads=5, kv_heads=2), {})
    assert "not in" in impl.rejects(spec("attention", heads=4, kv_heads=2), {"gqa": "sideways"})
    with pytest.raises(ValueError, match="gqa"):
        impl.build(spec("attention", heads=4, kv_heads=2), {"gqa": "sideways"})

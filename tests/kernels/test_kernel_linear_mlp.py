"""Every linear / MLP implementation against the reference on fresh random inputs, fp32 and bf16 activations;
the reference itself against float64 math written out here."""
import pytest
import torch
import torch.nn.functional as F

from kernel_helpers import bound, reference, rel_err, spec, variants, vid
from skips import require_impl_here

GROUPS = {  # name -> (in, [(out, has_bias)])
    "qkv_bias": (64, [(64, True), (32, True), (32, True)]),
    "qkv_gqa": (96, [(96, False), (32, False), (32, False)]),
    "single": (48, [(80, True)]),
    "mixed_bias": (48, [(24, True), (16, False)]),
}
LINEARS = variants("linear", **{"in": 64})
MLPS = variants("mlp", hidden=48, inner=160)
# the implementations compared with the reference (the reference is checked against float64 below)
LINEAR_IMPLS = [v for v in LINEARS if not v[0].reference]
MLP_IMPLS = [v for v in MLPS if not v[0].reference]


def _weights(gen, d_in, outs):
    return [(torch.randn(o, d_in, generator=gen) / d_in ** 0.5, torch.randn(o, generator=gen) if b else None)
            for o, b in outs]


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_reference_linear_is_float64_math(group, gen):
    d_in, outs = GROUPS[group]
    weights = _weights(gen, d_in, outs)
    x = torch.randn(2, 37, d_in, generator=gen)
    out = reference("linear").build(spec("linear"), {}, weights=weights)(x)
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(outs)
    for o, (w, b) in zip(out, weights):
        want = x.double() @ w.double().T + (b.double() if b is not None else 0.0)
        assert o.dtype == torch.float32 and rel_err(o, want) <= 1e-6


@pytest.mark.parametrize("variant", LINEAR_IMPLS, ids=vid)
@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_matches_reference(variant, group, dtype, gen):
    impl, params = variant
    d_in, outs = GROUPS[group]
    require_impl_here(impl, spec("linear", **{"in": d_in}), params)
    weights = _weights(gen, d_in, outs)
    x = torch.randn(2, 37, d_in, generator=gen).to(dtype)
    ref = reference("linear").build(spec("linear"), {}, weights=weights)(x.float())
    ref = ref if isinstance(ref, tuple) else (ref,)
    mod = impl.build(spec("linear"), params, weights=weights)
    for _ in range(2):  # the second call runs on packed weights where the backend packs lazily
        out = mod(x)
        out = out if isinstance(out, tuple) else (out,)
        assert len(out) == len(outs)
        for o, r, (n, _) in zip(out, ref, outs):
            assert o.shape == (2, 37, n) and o.dtype == dtype
            assert rel_err(o, r) <= bound(impl, dtype), f"{vid(variant)} error {rel_err(o, r):.2e}"


@pytest.mark.parametrize("variant,dtype", [(v, d) for v in LINEARS for d in (torch.float32, torch.bfloat16)
                                           if d == torch.float32 or not v[0].reference],  # the reference: fp32
                         ids=lambda p: vid(p) if isinstance(p, tuple) else str(p).split(".")[-1])
def test_linear_with_a_residual_is_the_residual_plus_the_linear(variant, dtype, gen):
    """A one-weight linear takes ``residual=`` (the attention output projections): our AMX GEMMs add it in
    their epilogue, the others after the GEMM; within the impl's bound of ``residual + x W^T + b``, the
    reference bitwise that sum, and a group of several outputs refuses a residual."""
    impl, params = variant
    require_impl_here(impl, spec("linear", **{"in": 64}), params)
    weights = _weights(gen, 64, [(80, True)])
    x = torch.randn(2, 37, 64, generator=gen).to(dtype)
    res = torch.randn(2, 37, 80, generator=gen).to(dtype)
    mod = impl.build(spec("linear"), params, weights=weights)
    out = mod(x, residual=res)
    assert out.shape == res.shape and out.dtype == dtype
    if impl.reference:
        assert torch.equal(out, res + mod(x))
    want = res.double() + x.double() @ weights[0][0].double().T + weights[0][1].double()
    assert rel_err(out, want) <= bound(impl, dtype), f"{vid(variant)} error {rel_err(out, want):.2e}"
    group = impl.build(spec("linear"), params, weights=_weights(gen, 64, [(40, True), (40, False)]))
    with pytest.raises(ValueError, match="one-weight"):
        group(x, residual=res)


@pytest.mark.parametrize("variant", LINEARS, ids=vid)
def test_linear_two_dim_input_and_new_row_count(variant, gen):
    """state_proj style [B, in] inputs, and a row count the packed weights were not made for."""
    impl, params = variant
    weights = _weights(gen, 32, [(48, True)])
    mod = impl.build(spec("linear"), params, weights=weights)
    ref = reference("linear").build(spec("linear"), {}, weights=weights)
    for rows in (1, 7, 1):
        x = torch.randn(rows, 32, generator=gen)
        assert rel_err(mod(x), ref(x)) <= bound(impl, torch.float32)


def test_fused_fp32_is_exact_up_to_summation_order(gen):
    """Fused groups in fp32 split back into exactly the per-weight shapes and values (aten backend)."""
    impl = next(i for i, _ in LINEARS if i.impl_id == "fused")
    weights = _weights(gen, 64, [(64, True), (32, False), (16, True)])
    x = torch.randn(3, 64, generator=gen)
    out = impl.build(spec("linear"), {"backend": "aten"}, weights=weights)(x)
    ref = reference("linear").build(spec("linear"), {}, weights=weights)(x)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-6, atol=1e-6)


def _mlp_weights(gen, act, h, i):
    if act == "silu_gated":
        return {"gate": torch.randn(i, h, generator=gen) / h ** 0.5, "up": torch.randn(i, h, generator=gen) / h ** 0.5,
                "down": torch.randn(h, i, generator=gen) / i ** 0.5}
    return {"fc1": (torch.randn(i, h, generator=gen) / h ** 0.5, torch.randn(i, generator=gen)),
            "fc2": (torch.randn(h, i, generator=gen) / i ** 0.5, torch.randn(h, generator=gen))}


@pytest.mark.parametrize("act", ["silu_gated", "gelu_tanh"])
def test_reference_mlp_is_float64_math(act, gen):
    w = _mlp_weights(gen, act, 48, 160)
    x = torch.randn(1, 50, 48, generator=gen)
    out = reference("mlp").build(spec("mlp"), {}, weights=w, act=act)(x)
    d = {k: (tuple(t.double() if t is not None else None for t in v) if isinstance(v, tuple) else v.double())
         for k, v in w.items()}
    xd = x.double()
    if act == "silu_gated":
        want = (F.silu(xd @ d["gate"].T) * (xd @ d["up"].T)) @ d["down"].T
    else:
        h = xd @ d["fc1"][0].T + d["fc1"][1]
        want = F.gelu(h, approximate="tanh") @ d["fc2"][0].T + d["fc2"][1]
    assert out.shape == x.shape and rel_err(out, want) <= 1e-6


@pytest.mark.parametrize("variant", MLP_IMPLS, ids=vid)
@pytest.mark.parametrize("act", ["silu_gated", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mlp_matches_reference(variant, act, dtype, gen):
    impl, params = variant
    w = _mlp_weights(gen, act, 48, 160)
    x = torch.randn(1, 50, 48, generator=gen).to(dtype)
    ref = reference("mlp").build(spec("mlp"), {}, weights=w, act=act)(x.float())
    mod = impl.build(spec("mlp"), params, weights=w, act=act)
    for _ in range(2):
        out = mod(x)
        assert out.shape == x.shape and out.dtype == dtype
        assert rel_err(out, ref) <= bound(impl, dtype), f"{vid(variant)} error {rel_err(out, ref):.2e}"


def test_mlp_rejects_unknown_activation(gen):
    impl = next(i for i, _ in MLPS if i.impl_id == "fused")
    with pytest.raises(ValueError, match="swish"):
        impl.build(spec("mlp"), {}, weights=_mlp_weights(gen, "silu_gated", 8, 16), act="swish")


def test_cpu_backends_are_rejected_off_cpu():
    impl = next(i for i, _ in LINEARS if i.impl_id == "fused")
    assert "CPU" in impl.rejects(spec("linear", hw="cuda_sm90"), {"backend": "mkl"})
    assert impl.rejects(spec("linear", hw="cuda_sm90"), {"backend": "aten"}) is None
    bf16 = next(i for i, _ in LINEARS if i.impl_id == "bf16")
    assert "not in" in bf16.rejects(spec("linear"), {"backend": "mkl"})  # fp32-only packing

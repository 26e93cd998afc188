"""Fast mode's bf16 kernels against the PyTorch reference on fresh random inputs: the AMX attention
(edgefm_kernels/csrc/amx_attention.c) and the bf16 GEMM epilogues (edgefm_kernels/csrc/bf16_rows.c); and, on a CPU
without the instruction sets, their refusal before any build and the dispatch falling back."""
import pytest
import torch
import torch.nn.functional as F

from edgefm_kernels import amx_attention, bf16_rows, native
from edgefm_kernels.attention import EagerAttention
from edgefm_kernels.gemm import Gemm

from kernel_helpers import faked_cpu
from skips import native_mark

needs_amx = native_mark(amx_attention.NAME)
needs_bf16 = native_mark(bf16_rows.NAME)
# bf16 inputs, fp32 sums, probabilities rounded to bf16 (2^-9 relative) and the output to bf16:
# max |out - ref| / max |ref| measured 1e-3 - 4e-3; torch's bf16 SDPA on the same inputs 1e-3 (unmasked)
BF16_ATTN = 1.5e-2


def _rel(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _reference(q, k, v, mask):
    """LeRobot's eager attention in float64 on the bf16 inputs' values."""
    return EagerAttention()(q.double(), k.double(), v.double(), mask)


@needs_amx
@pytest.mark.parametrize("lq,lk", [(1, 1), (5, 7), (15, 16), (16, 17), (17, 31), (33, 32), (50, 261), (211, 211)])
def test_amx_attention_matches_float64_across_tile_edges(lq, lk, gen):
    """Queries around the 16-row tile, keys around the 16-key and 32-key tiles; GQA and a bool mask with a
    query that sees no key (uniform weights, as the reference)."""
    for b, hq, hkv, masked in ((1, 2, 2, False), (2, 6, 2, True)):
        q = torch.randn(b, hq, lq, 64, generator=gen).bfloat16()
        k, v = (torch.randn(b, hkv, lk, 64, generator=gen).bfloat16() for _ in range(2))
        mask = None
        if masked:
            mask = torch.rand(b, lq, lk, generator=gen) < 0.6
            mask[0, lq // 2] = False
        out = amx_attention.attention(q, k, v, mask)
        assert out.shape == (b, hq, lq, 64) and out.dtype == torch.bfloat16
        assert _rel(out, _reference(q, k, v, mask)) <= BF16_ATTN, (b, hq, hkv, masked)


@needs_amx
def test_amx_attention_vision_shape_from_a_fused_qkv(gen):
    """The vision tower's call (12 heads x 1024 x 1024, strided slices of one QKV projection, logits
    large enough to peak the softmax); the result's transpose(1, 2) is contiguous for the output
    projection, and it is as close to float64 as torch's own bf16 SDPA."""
    b, length, h, d = 1, 1024, 12, 64
    qkv = (torch.randn(b, length, 3 * h * d, generator=gen) * 2).bfloat16()
    q, k, v = (t.view(b, length, h, d).transpose(1, 2) for t in qkv.split(h * d, -1))
    out = amx_attention.attention(q, k, v, None)
    assert out.transpose(1, 2).is_contiguous()
    ref = _reference(q, k, v, None)
    sdpa = _rel(F.scaled_dot_product_attention(q, k, v), ref)
    assert _rel(out, ref) <= max(BF16_ATTN, 1.5 * sdpa)


@needs_amx
def test_amx_attention_gives_the_same_bits_for_any_thread_count(gen):
    """The blocks of query rows are shared out a few at a time (a preempted thread's share is taken by the
    other): each is made once, the same way, whatever the number of threads."""
    q = torch.randn(2, 6, 77, 64, generator=gen).bfloat16()
    k, v = (torch.randn(2, 2, 90, 64, generator=gen).bfloat16() for _ in range(2))
    mask = torch.rand(2, 77, 90, generator=gen) < 0.7
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = amx_attention.attention(q, k, v, mask)
        for threads in (2, 3, 5):
            torch.set_num_threads(threads)
            assert torch.equal(amx_attention.attention(q, k, v, mask), one), threads
    finally:
        torch.set_num_threads(old)


@needs_amx
def test_amx_attention_leaves_the_callers_denormals_alone(gen):
    """The kernel runs its softmax with flush-to-zero (no slow denormal exponentials) and restores the
    thread's float mode: a denormal product on the calling thread stays denormal afterwards."""
    tiny = torch.tensor([1e-39], dtype=torch.float32)
    assert (tiny * 0.5).item() != 0.0
    q, k, v = (torch.randn(1, 2, 40, 64, generator=gen).bfloat16() for _ in range(3))
    amx_attention.attention(q, k, v, None)
    assert (tiny * 0.5).item() != 0.0


@needs_amx
def test_amx_attention_refuses_what_it_cannot_serve():
    q = torch.randn(1, 2, 4, 32).bfloat16()
    with pytest.raises(ValueError, match="head size 64"):
        amx_attention.attention(q, q, q, None)
    q = torch.randn(1, 2, 4, 64)
    with pytest.raises(ValueError, match="bfloat16"):
        amx_attention.attention(q, q.bfloat16(), q.bfloat16(), None)
    q = torch.randn(1, 2, 4, 64).bfloat16()
    with pytest.raises(ValueError, match="mask"):
        amx_attention.attention(q, q, q, torch.ones(1, 4, 5, dtype=torch.bool))


@needs_bf16
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (1024, 3072), (2, 50, 96)])
def test_gelu_tanh_is_the_reference_rounded_once(shape, gen):
    """In place; every element within one bf16 rounding of GELU-tanh of the same input in float64 (in fp32,
    torch's 0.5 x (1 + tanh) cancels in the negative tail: it is no reference there; in float64 it still
    cancels below ~1e-16, hence the 1e-9 absolute slack)."""
    x = (torch.randn(shape, generator=gen) * 4).bfloat16()
    ref = F.gelu(x.double(), approximate="tanh")
    y = x.clone()
    assert bf16_rows.gelu_tanh_(y) is y
    assert torch.all((y.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-9)
    # far tails: exp overflow must give -0 / x, never NaN
    tails = torch.tensor([-200.0, -30.0, -9.0, 9.0, 30.0, 200.0]).bfloat16()
    out = bf16_rows.gelu_tanh_(tails.clone()).float()
    assert torch.isfinite(out).all() and torch.allclose(out.double(), F.gelu(tails.double(), approximate="tanh"),
                                                        atol=1e-6)


@needs_bf16
@pytest.mark.parametrize("rows,inner", [(1, 1), (50, 2048), (7, 33)])
def test_silu_glu_is_the_reference_rounded_once(rows, inner, gen):
    y = (torch.randn(rows, 2 * inner, generator=gen) * 4).bfloat16()
    gate, up = y.double().split(inner, -1)
    ref = F.silu(gate) * up
    out = bf16_rows.silu_glu(y)
    assert out.shape == (rows, inner) and out.dtype == torch.bfloat16
    assert torch.all((out.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-9)


@needs_bf16
@pytest.mark.parametrize("post", ["gelu_tanh", "silu_glu"])
def test_gemm_with_our_epilogue_matches_the_library_one(post, gen):
    """Gemm(epilogue='avx512') = the oneDNN GEMM + its epilogue, within bf16 rounding of the fp32 result."""
    k, n = 96, 64
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).bfloat16()
    b = None if post == "silu_glu" else torch.randn(n, generator=gen).bfloat16()
    x = torch.randn(2, 13, k, generator=gen).bfloat16()
    ours = Gemm(lambda: (w, b), "onednn", post, "avx512")(x)
    y = F.linear(x.float(), w.float(), None if b is None else b.float())
    ref = F.gelu(y, approximate="tanh") if post == "gelu_tanh" else F.silu(y[..., :n // 2]) * y[..., n // 2:]
    assert ours.shape == ref.shape
    assert _rel(ours, ref.double()) <= 2e-2


def test_without_amx_the_kernel_is_refused_before_any_build_and_fast_mode_falls_back(monkeypatch, tmp_path):
    """A CPU lacking AMX (flags faked): the kernel is refused with the missing flags named, nothing is
    compiled, the AMX skill is not loaded, and fast mode's vision attention resolves to the table's
    default; a user table that insists on it fails at build naming the reason."""
    from edgefm_kernels.registry import OpSpec, get_impl
    from edgefm_ros.dispatch import skills
    from edgefm_ros.dispatch.table import DispatchError, Table, builtin_tables

    with faked_cpu(monkeypatch, tmp_path, drop={"amx_tile", "amx_bf16", "amx_int8"}, add={"avx512f", "avx512_bf16"},
                   caches=(amx_attention.unavailable,)):
        why = native.unavailable(amx_attention.NAME)
        assert why is not None and "amx_tile" in why and "amx_bf16" in why
        with pytest.raises(native.NativeError, match="lacks"):
            native.load(amx_attention.NAME)
        assert not list(tmp_path.rglob("amx_attention*")), "built although the CPU cannot run it"
        assert "cpu-amx-fast" not in [p.stem for p in skills.tables_for("cpu_x86_avx512_bf16", mode="fast")]
        assert "cpu_amx_fast" not in [p.stem for p in skills.tables_for("cpu_x86_avx512_bf16", mode="fast")]
        spec = OpSpec("attention", "vision.layers.0.attn", "vision_attn", "prefill", "h12/12xd64",
                      "cpu_x86_avx512_bf16", dims={"heads": 12, "kv_heads": 12, "head_dim": 64})
        chosen = Table.from_files(builtin_tables("fast")).resolve(spec)
        assert chosen.record.impl_id != "amx"
        assert "lacks" in get_impl("attention", "amx").rejects(spec, {})
        insist = Table([*Table.from_files(builtin_tables("fast")).records,
                        *Table.from_files([_user_table(tmp_path)]).records])
        with pytest.raises(DispatchError, match="lacks"):
            insist.resolve(spec)


def _user_table(tmp_path):
    p = tmp_path / "amx.yaml"
    p.write_text("records:\n  - {hw_profile: cpu_x86_avx512_bf16, op_kind: attention, layer_role: vision_attn, "
                 "impl_id: amx}\n")
    return p


@needs_bf16
@pytest.mark.parametrize("rows,h", [(1, 16), (50, 720), (3, 37), (1024, 768)])
def test_bf16_norms_match_the_fp32_reference(rows, h, gen):
    """RMSNorm and LayerNorm of bf16 rows against the fp32 reference on the same values: within two bf16
    roundings (the fast RMSNorm rounds the normalised value, then its product with the weight)."""
    from edgefm_kernels.norm import LayerNormBf16, RmsNormBf16

    x = (torch.randn(rows, h, generator=gen) * 3 + 0.5).bfloat16()
    w, b = torch.randn(h, generator=gen), torch.randn(h, generator=gen)
    xf = x.double()
    rms = w.bfloat16().double() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    out = RmsNormBf16(w, 1e-6)(x)
    assert out.dtype == torch.bfloat16
    assert torch.all((out.double() - rms).abs() <= rms.abs() * 2 ** -7 + 1e-6)
    ln = F.layer_norm(xf, (h,), w.double(), b.double(), 1e-6)
    out = LayerNormBf16(w, b, 1e-6)(x)
    assert _rel(out, ln) <= 2 ** -7
    assert torch.all((out.double() - ln).abs() <= ln.abs() * 2 ** -8 + 1e-3 * ln.abs().max())


@needs_bf16
@pytest.mark.parametrize("heads,d", [(15, 64), (3, 34)])
def test_bf16_rope_is_the_reference_rounded_once(heads, d, gen):
    """q from a strided fused-QKV slice, the reference's tables: within one bf16 rounding of the fp32 rotation."""
    from edgefm_kernels.rope import RopeBf16, RopeRef

    b, length = 2, 21
    qkv = (torch.randn(b, length, 3 * heads * d, generator=gen) * 2).bfloat16()
    q = qkv[..., :heads * d].view(b, length, heads, d)
    pos = torch.randint(0, 300, (b, length), generator=gen)
    tables = RopeRef().tables(pos, d)
    ref = RopeRef()(q.double().float(), tables).double()
    out = RopeBf16()(q, tables)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert torch.all((out.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-6)

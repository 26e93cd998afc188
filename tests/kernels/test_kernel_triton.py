"""Triton kernels against the references, on CPU through Triton's interpreter (small shapes).

Skipped with the reason when triton is not installed. Without a GPU the interpreter is switched on
before triton is first imported (triton reads it then), so nothing GPU-only is pretended here: the
same kernel source runs, interpreted.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from skips import require_material, require_module  # noqa: E402

require_module("triton", "triton is not installed (requirements.txt pins triton==3.9.0)")

from edgefm_kernels.registry import get_impl  # noqa: E402

from kernel_helpers import rel_err, spec  # noqa: E402


@pytest.fixture(autouse=True)
def interpreter():
    require_material(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                     "no GPU and TRITON_INTERPRET was switched off before triton was imported")


def dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_rms_norm(dtype, gen):
    w = 1 + 0.1 * torch.randn(48, generator=gen)
    x = torch.randn(3, 5, 48, generator=gen) * 2
    ref = get_impl("rms_norm", "fast").build(spec("rms_norm"), {}, weight=w, eps=1e-5)(x.to(dtype))
    out = get_impl("rms_norm", "triton").build(spec("rms_norm", hw="cuda_sm90"), {}, weight=w.to(dev()), eps=1e-5)(
        x.to(dtype).to(dev()))
    assert out.dtype == dtype and out.shape == x.shape
    # bf16: both sides are bf16, but the reference rounds twice (normalised value, then after the weight)
    # and the kernel once, so they may differ by ~1.5 ulp = 2^-7 * 1.5 of the largest value
    assert rel_err(out.cpu(), ref) <= (1e-6 if dtype == torch.float32 else 2e-2)


def test_triton_rope(gen):
    ref = get_impl("rope", "ref").build(spec("rope"), {})
    tri = get_impl("rope", "triton").build(spec("rope", hw="cuda_sm90"), {})
    pos = torch.randint(0, 300, (2, 7), generator=gen)
    x = torch.randn(2, 7, 3, 16, generator=gen)
    tables = ref.tables(pos, 16)
    expected = ref(x, tables)
    got = tri(x.to(dev()), tuple(t.to(dev()) for t in tables)).cpu()
    assert rel_err(got, expected) <= 1e-6
    # non-contiguous input: a head-split view of a fused projection, as the models pass it
    wide = torch.randn(2, 7, 3 * 16 + 8, generator=gen)[..., :48].view(2, 7, 3, 16)
    assert rel_err(tri(wide.to(dev()), tuple(t.to(dev()) for t in tables)).cpu(), ref(wide, tables)) <= 1e-6


def test_triton_kv_store(gen):
    codec = get_impl("kv", "triton").build(spec("kv", hw="cuda_sm90"), {})
    ref = get_impl("kv", "plain").build(spec("kv"), {})
    store, ref_store = codec.alloc(2, 2, 12, 16, torch.float32), ref.alloc(2, 2, 12, 16, torch.float32)
    for start, n in ((0, 5), (5, 4)):
        k, v = torch.randn(2, 2, n, 16, generator=gen), torch.randn(2, 2, n, 16, generator=gen)
        codec.write(store, k.to(store["k"].device), v.to(store["k"].device), start)
        ref.write(ref_store, k, v, start)
    got = codec.read(store, 9)
    want = ref.read(ref_store, 9)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    with pytest.raises(ValueError, match="capacity"):
        codec.write(store, k, v, 10)


def test_triton_impls_are_gpu_records_only():
    assert "needs hardware" in get_impl("rms_norm", "triton").rejects(spec("rms_norm"), {})
    assert "power-of-two" in get_impl("rope", "triton").rejects(spec("rope", hw="cuda_sm90", head_dim=48), {})

"""CPU graph capture and replay (runtime/cpu_graph.py): recorded torch ops and native kernels run again on new
inputs give what the eager call gives, bit for bit; host reads become guards; what cannot be replayed is
refused. Inputs are drawn fresh each run."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgefm_kernels import bf16_rows, native
from edgefm_ros.runtime.cpu_graph import CaptureError, CpuGraph, GuardFailed
from edgefm_ros.runtime.engine import Engine
from skips import require_material


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))


def mixed(x, w, scale, parts):
    """Views, a fresh result, an in-place update of a factory-made accumulator, an out= op, a list input."""
    acc = torch.zeros(x.shape[0], w.shape[0])
    for p in parts:
        acc.add_(F.linear(x * p.sum(), w))
    h = torch.empty_like(acc)
    torch.tanh(acc, out=h)
    return (h.t().contiguous() * scale[None, :]).sum(dim=0), acc[:, :2]


def test_replay_recomputes_torch_ops_on_new_inputs(gen):
    def args():
        return (torch.randn(6, 5, generator=gen), torch.randn(4, 5, generator=gen), torch.randn(6, generator=gen),
                [torch.randn(3, generator=gen), torch.randn(2, generator=gen)])

    g = CpuGraph(mixed, args())
    for _ in range(3):
        a = args()
        g.load(*a)
        out = g.replay()
        for got, want in zip(out, mixed(*a)):
            assert torch.equal(got, want)


def test_load_keeps_the_parts_given_as_none(gen):
    x, w = torch.randn(3, 4, generator=gen), torch.randn(2, 4, generator=gen)
    g = CpuGraph(lambda a, b: F.linear(a, b).relu(), (x, w))
    x2 = torch.randn(3, 4, generator=gen)
    g.load(x2, None)
    assert torch.equal(g.replay(), F.linear(x2, w).relu())
    assert g.fits(x2.t().contiguous().t(), w)  # strides may differ: values are copied in
    assert not g.fits(torch.randn(4, 4), w) and not g.fits(x2.double(), w)
    with pytest.raises(ValueError, match="takes 2 arguments"):
        g.load(x2)


def test_replay_runs_native_kernels_again(gen):
    require_material(bf16_rows.NAME and native.unavailable(bf16_rows.NAME) is None,
                     f"kernel {bf16_rows.NAME} unavailable here: {native.unavailable(bf16_rows.NAME)}")

    def fn(x, w):
        return bf16_rows.rms_norm(x * 2, w, 1e-6).float().sum(dim=1)

    def args():
        return torch.randn(7, 40, generator=gen).bfloat16(), torch.randn(40, generator=gen).bfloat16()

    g = CpuGraph(fn, args())
    assert any("native" in getattr(e, "__qualname__", "") for e in g.entries)
    for _ in range(3):
        a = args()
        g.load(*a)
        assert torch.equal(g.replay(), fn(*a))


def test_a_kernel_call_that_escapes_the_recording_is_caught(gen):
    """Called on a library object held from before the capture, the kernel is not recorded: the check replay
    leaves the capture's poison in its output, and the capture is refused."""
    require_material(native.unavailable(bf16_rows.NAME) is None, "bf16_rows unavailable here")
    lib = native.bind(bf16_rows.NAME, bf16_rows.SIGNATURES)  # bound before the capture: not reported

    def fn(x, w):
        y = torch.empty_like(x)
        lib.edgefm_rms_norm_bf16(x.data_ptr(), w.data_ptr(), x.shape[0], x.shape[1], 1e-6, y.data_ptr(), 1)
        return y

    with pytest.raises(CaptureError, match="differs from its eager run"):
        CpuGraph(fn, (torch.randn(4, 32, generator=gen).bfloat16(), torch.randn(32, generator=gen).bfloat16()))


def test_host_reads_become_guards(gen):
    def fn(x):
        return x * 2 if bool(x.sum() > 0) else x - 1

    x = torch.rand(5, generator=gen) + 0.1
    g = CpuGraph(fn, (x,))
    g.load(x + 1)
    assert torch.equal(g.replay(), (x + 1) * 2)
    g.load(-x)
    with pytest.raises(GuardFailed):
        g.replay()


def test_random_draws_are_refused_but_attention_without_dropout_is_captured(gen):
    with pytest.raises(CaptureError, match="random"):
        CpuGraph(lambda x: x + torch.rand(x.shape), (torch.ones(3),))
    q, k, v = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3))
    g = CpuGraph(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), (q, k, v))
    q2 = torch.randn(1, 2, 5, 8, generator=gen)
    g.load(q2, k, v)
    assert torch.equal(g.replay(), F.scaled_dot_product_attention(q2, k, v))


def test_cuda_tensors_are_refused():
    with pytest.raises(ValueError, match="CPU tensors only"):
        CpuGraph(lambda x: x, (torch.empty(0, device="meta"),))


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_engine_decode_replayed_is_bitwise_the_eager_decode(tiny, golden_inputs, mode, gen):
    """Every Euler step replays one captured step; for fresh noise and a second prefix (another language
    mask: a guard of the attention kernels reads it) the actions are the eager ones bit for bit, and a trace
    keeps each step's own velocity."""
    require_material(mode == "exact" or native.unavailable(bf16_rows.NAME) is None, "fast kernels unavailable")
    eng = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode=mode, vision_position_ids="legacy")
    assert eng.cpu_graphs
    inp = golden_inputs
    masks = inp.lang_masks.clone()
    masks[:, masks.shape[1] // 2:] = False
    other = type(inp)(inp.images, inp.img_masks, inp.lang_tokens, masks, inp.state)
    shape = (inp.batch, eng.model_config.chunk_size, eng.model_config.max_action_dim)
    for ins in (inp, other, inp):
        prefix = eng.prefill(ins)
        noise = torch.randn(shape, generator=gen)
        trace_g, trace_e = [], []
        eng.cpu_graphs = True
        replayed = eng.decode(prefix, noise, trace=trace_g)
        eng.cpu_graphs = False
        eager = eng.decode(prefix, noise, trace=trace_e)
        assert torch.equal(replayed, eager)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(trace_g, trace_e))
        assert len({t[0].data_ptr() for t in trace_g}) == len(trace_g)
    assert len(eng.velocity_graphs) >= 1


def test_engine_decode_falls_back_to_eager_steps_when_a_guard_fails(tiny, golden_inputs, gen, monkeypatch):
    """A replay whose guard fails mid-decode (a host value read at capture differs) hands the rest of the
    decode to eager steps: the actions are still the eager ones."""
    eng = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="exact", vision_position_ids="legacy")
    prefix = eng.prefill(golden_inputs)
    noise = torch.randn((golden_inputs.batch, eng.model_config.chunk_size, eng.model_config.max_action_dim),
                        generator=gen)
    eng.decode(prefix, noise)  # captures
    graph, calls = eng.velocity_graphs[0], []
    replay = graph.replay

    def flaky():
        calls.append(1)
        if len(calls) == 3:
            raise GuardFailed("a guard read another value")
        return replay()

    monkeypatch.setattr(graph, "replay", flaky)
    got = eng.decode(prefix, noise)
    assert len(calls) == 3  # two steps replayed, the third failed, the rest eager
    eng.cpu_graphs = False
    assert torch.equal(got, eng.decode(prefix, noise))

"""runtime/graphs.py: argument flattening on any machine; capture and replay only on a CUDA device."""
import dataclasses

import pytest
import torch

from edgefm_ros.runtime import graphs

from skips import gpu_mark, no_gpu_mark


@dataclasses.dataclass
class Box:
    contexts: list
    tables: tuple
    mask: torch.Tensor
    note: str = "x"


def test_flatten_roundtrip_keeps_structure_and_constants(gen):
    tree = (Box([(torch.randn(2, generator=gen), torch.randn(3, generator=gen))], (torch.ones(1), None), torch.zeros(2, dtype=torch.bool)),
            {"noise": torch.randn(4, generator=gen), "dt": -0.1})
    leaves, spec = graphs.flatten(tree)
    assert len(leaves) == 5
    back = graphs.unflatten(spec, [t.clone() for t in leaves])
    assert isinstance(back[0], Box) and back[0].note == "x" and back[0].tables[1] is None and back[1]["dt"] == -0.1
    assert torch.equal(back[0].contexts[0][1], tree[0].contexts[0][1]) and back[0].contexts[0][1] is not tree[0].contexts[0][1]
    _, spec2 = graphs.flatten((Box([(torch.ones(2), torch.ones(3))], (torch.ones(1), None), torch.ones(2)), {"noise": torch.ones(4), "dt": -0.2}))
    assert not graphs.same_structure(spec, spec2)  # a different constant means another graph


@no_gpu_mark("checks the refusal on a machine without CUDA")
def test_capture_refuses_without_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        graphs.CapturedPhase(lambda x: x * 2, (torch.ones(3),))


@gpu_mark("CUDA graphs need a CUDA device")
def test_captured_phase_replays_new_inputs():
    def fn(box, noise):
        x = noise
        for _ in range(3):
            x = x + box.mask.float() * box.contexts[0][0].sum()
        return x
    box = Box([(torch.ones(2, device="cuda"), torch.ones(3, device="cuda"))], (torch.ones(1, device="cuda"), None),
              torch.ones(4, dtype=torch.bool, device="cuda"))
    g = graphs.CapturedPhase(fn, (box, torch.zeros(4, device="cuda")))
    for scale in (1.0, 2.0):
        b2 = Box([(scale * torch.ones(2, device="cuda"), torch.ones(3, device="cuda"))], box.tables,
                 torch.tensor([True, False, True, False], device="cuda"))
        out = g(b2, torch.full((4,), scale, device="cuda"))
        torch.testing.assert_close(out, fn(b2, torch.full((4,), scale, device="cuda")))
    assert g.capture_s > 0

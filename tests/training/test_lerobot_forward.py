"""The training forward equals LeRobot 0.4.4's (``VLAFlowMatching.forward``) on the TINY reference checkpoint:
same per-element flow-matching losses for the same inputs, actions, noise and times (golden written by
make_lerobot_forward_golden.py with LeRobot itself)."""
from __future__ import annotations

from pathlib import Path

import torch

from edgefm_ros.runtime.checkpoint import load_checkpoint
from edgefm_ros.runtime.preprocess import ModelInputs
from edgefm_ros.runtime.safetensors_mmap import load_all
from edgefm_ros.training.flow import flow_loss, noisy_actions
from edgefm_ros.training.model import TrainableSmolVLA

GOLDEN = Path(__file__).resolve().parent / "data" / "lerobot044_tiny_forward.safetensors"


def test_training_losses_equal_lerobot_forward(shared_reference):
    ck = load_checkpoint(shared_reference / "smolvla-tiny", shared_reference / "vlm" / "smolvlm-tiny")
    model = TrainableSmolVLA(ck.config, ck.vlm, load_all(ck.weights_path), "legacy")  # LeRobot 0.4.4's ids
    g = load_all(ck.path / "golden" / "inputs.safetensors")
    gold = load_all(GOLDEN)
    inp = ModelInputs((g["images.0"], g["images.1"]), (g["img_masks.0"].bool(), g["img_masks.1"].bool()),
                      g["lang_tokens"], g["lang_masks"].bool(), g["state"])
    assert not bool(inp.lang_masks.all()) and not bool(inp.img_masks[1].all())  # padding and a masked camera
    x_t, u_t = noisy_actions(gold["actions"], gold["noise"], gold["time"])
    with torch.no_grad():
        v_t = model.velocity(inp, x_t, gold["time"])
    ours = (u_t - v_t).pow(2)  # LeRobot's F.mse_loss(u_t, v_t, reduction="none")
    torch.testing.assert_close(ours, gold["losses"], atol=2e-5, rtol=1e-4)
    # our reduction: the real action dims (6) of every chunk step
    no_pad = torch.zeros(2, 8, dtype=torch.bool)
    torch.testing.assert_close(flow_loss(v_t, u_t, no_pad, 6), gold["losses"][..., :6].mean(), atol=1e-5, rtol=1e-5)

"""Writes tests/training/data/lerobot044_tiny_forward.safetensors: LeRobot 0.4.4's training forward
(``VLAFlowMatching.forward``: per-element flow-matching losses) on the TINY reference checkpoint and its
golden inputs, for given actions, noise and times. Run with the LeRobot harness venv:

    cd /work/lerobot_harness && PYTHONPATH=/work/lerobot_harness /work/lerobot-venv/bin/python \
        /work/main/tests/training/make_lerobot_forward_golden.py --reference /work/shared/reference

test_lerobot_forward.py checks edgefm_ros.training's forward against it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import common  # noqa: F401  (the harness: offline env + torchvision shim, before lerobot)
import torch
from safetensors.torch import load_file, save_file

OUT = Path(__file__).resolve().parent / "data" / "lerobot044_tiny_forward.safetensors"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", type=Path, required=True, help="../shared/reference")
    args = ap.parse_args()
    ckpt = args.reference / "smolvla-tiny"
    policy = common.load_policy(ckpt)
    g = load_file(str(ckpt / "golden" / "inputs.safetensors"))
    gen = torch.Generator().manual_seed(7)
    b, c = g["noise"].shape[:2]
    actions = torch.zeros(b, c, 32)
    actions[..., :6] = torch.randn(b, c, 6, generator=gen)  # prepare_action's zero padding to max_action_dim
    noise = torch.randn(b, c, 32, generator=gen)
    time = torch.tensor([0.3, 0.85])
    with torch.no_grad():
        losses = policy.model.forward([g["images.0"], g["images.1"]], [g["img_masks.0"], g["img_masks.1"]],
                                      g["lang_tokens"], g["lang_masks"], g["state"], actions, noise, time)
    save_file({"actions": actions, "noise": noise, "time": time, "losses": losses.contiguous()}, str(OUT),
              metadata={"lerobot": "0.4.4", "checkpoint": "smolvla-tiny", "vision_position_ids": "legacy"})
    print(f"wrote {OUT}: losses {list(losses.shape)}, mean {losses.mean():.6f}")


if __name__ == "__main__":
    main()

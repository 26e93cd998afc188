"""LeRobot 0.4.4's side of the RTC parity check (tests/runtime/test_rtc_parity.py): SmolVLA's sample_actions
with its RTCProcessor on the TINY reference checkpoint and its golden inputs, for several schedules, delays
and previous chunks. Run in the LeRobot 0.4.4 environment of ../shared/reference (lerobot_harness):

    /work/lerobot-venv/bin/python scripts/lerobot_rtc_goldens.py [--reference ../shared/reference] [--seed N]
    # FULL (the harness's random-weight SmolVLM2-500M checkpoint, 1.8 GB; tests/runtime/test_rtc_parity.py
    # reads it through EDGEFM_LEROBOT_HARNESS):
    /work/lerobot-venv/bin/python scripts/lerobot_rtc_goldens.py --harness H --variant full \
        --out H/artifacts/full/golden-rtc/rtc.safetensors

Writes tests/runtime/data/lerobot044_rtc_tiny.safetensors (TINY, the default): per case i "noise.i",
"prev.i" (normalised, the unpadded prefix LeRobot is given), "actions.i" (LeRobot's result) and "meta.i" =
[delay, horizon, schedule index, max_guidance_weight]; plus "schedules" (the schedule names' order, as codes).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCHEDULES = ("ZEROS", "ONES", "LINEAR", "EXP")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default=str(REPO.parent / "shared" / "reference"))
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--harness", default=None, help="the harness folder (default: <reference>/lerobot_harness)")
    ap.add_argument("--variant", default="tiny", choices=("tiny", "full"))
    ap.add_argument("--out", default=str(REPO / "tests" / "runtime" / "data" / "lerobot044_rtc_tiny.safetensors"))
    args = ap.parse_args()
    ref = Path(args.reference)
    harness = Path(args.harness) if args.harness else ref / "lerobot_harness"
    sys.path.insert(0, str(harness))
    import common  # noqa: F401  (offline mode, torchvision shim: before lerobot)

    if args.variant == "tiny":
        common.VLM_DIR = ref / "vlm"  # the VLM config folders beside the checkpoints
        ckpt, golden = ref / "smolvla-tiny", ref / "smolvla-tiny" / "golden"
    else:  # made by the harness (make_goldens.py --variants full), its vlm/ beside it
        common.VLM_DIR = harness / "vlm"
        ckpt, golden = harness / "artifacts" / "full" / "checkpoint", harness / "artifacts" / "full" / "golden"
    import torch
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from safetensors.torch import load_file, save_file

    torch.set_grad_enabled(False)
    policy = common.load_policy(ckpt)
    g = load_file(str(golden / "inputs.safetensors"))
    n_img = len([k for k in g if k.startswith("images.")])
    inputs = dict(images=[g[f"images.{i}"] for i in range(n_img)],
                  img_masks=[g[f"img_masks.{i}"].bool() for i in range(n_img)],
                  lang_tokens=g["lang_tokens"], lang_masks=g["lang_masks"].bool(), state=g["state"])
    cfg = policy.config
    c, a_max, a = cfg.chunk_size, cfg.max_action_dim, cfg.output_features["action"].shape[0]
    gen = torch.Generator().manual_seed(args.seed)
    cases = [("LINEAR", 2, 5, 10.0, c, a), ("LINEAR", 0, 10, 10.0, c - 3, a), ("EXP", 3, 6, 5.0, c, a_max),
             ("ZEROS", 2, 10, 10.0, c - 2, a), ("ONES", 1, 4, 2.0, c, a), ("LINEAR", 4, 3, 10.0, 5, a)]
    if args.variant == "full":  # 50-action chunks; two cases (each sample_actions takes seconds on a CPU)
        cases = [("LINEAR", 5, 10, 10.0, 30, a), ("EXP", 8, 20, 5.0, c, a)]
    out = {"schedules": torch.tensor([ord(s[0]) for s in SCHEDULES], dtype=torch.int64)}
    for i, (schedule, delay, horizon, beta, n, width) in enumerate(cases):
        cfg.rtc_config = RTCConfig(enabled=True, prefix_attention_schedule=RTCAttentionSchedule(schedule),
                                   max_guidance_weight=beta, execution_horizon=horizon)
        policy.init_rtc_processor()
        b = inputs["state"].shape[0]
        noise = torch.randn(b, c, a_max, generator=gen)
        prev = torch.randn(b, n, width, generator=gen)
        actions = policy.model.sample_actions(**inputs, noise=noise.clone(), inference_delay=delay,
                                              prev_chunk_left_over=prev.clone(), execution_horizon=horizon)
        out[f"noise.{i}"], out[f"prev.{i}"], out[f"actions.{i}"] = noise, prev, actions.contiguous()
        out[f"meta.{i}"] = torch.tensor([delay, horizon, SCHEDULES.index(schedule), beta], dtype=torch.float64)
        print(f"case {i}: {schedule} d={delay} H={horizon} beta={beta} prefix {tuple(prev.shape)} -> "
              f"{tuple(actions.shape)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_file(out, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

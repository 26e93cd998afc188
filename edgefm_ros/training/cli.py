"""``edgefm-vla train``: argument parsing and the run (a thin shell over trainer.train)."""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from dataclasses import fields
from pathlib import Path

from .data import read_demos
from .recipe import ARCHS, AUGMENTATIONS, TrainConfig
from .trainer import train

DEFAULTS = TrainConfig()


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, action="append", help="LeRobot v3.0 dataset directory (edgefm-sim "
                   "collect, edgefm-bag to-dataset; video or image cameras); repeat it to train on several as one "
                   "(same cameras, dims and fps)")
    p.add_argument("--out", required=True, help="checkpoint directory to write (LeRobot layout)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--arch", default=None, choices=sorted(ARCHS), help="from scratch (default: tiny)")
    src.add_argument("--init", default=None, help="fine-tune this SmolVLA checkpoint instead")
    p.add_argument("--tasks", default=None, help="comma-separated task names to train on (default: all)")
    p.add_argument("--task-weights", default=None, type=parse_task_weights,
                   help="TASK=W,...: draw these tasks' frames W times as often as the others' (default 1 each)")
    p.add_argument("--steps", type=int, default=DEFAULTS.steps)
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr, help="peak learning rate")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--threads", type=int, default=DEFAULTS.threads)
    p.add_argument("--chunk-size", type=int, default=None, help="default: the architecture's / --init's")
    p.add_argument("--n-action-steps", type=int, default=None, help="actions executed per chunk (default: half)")
    p.add_argument("--augment", choices=AUGMENTATIONS, default=DEFAULTS.augment,
                   help="conditions: each sample under a random camera condition (blur, exposure, noise, JPEG)")
    p.add_argument("--start-frames", type=int, default=None,
                   help="draw each episode's first N frames --start-weight times as often (default 0: off)")
    p.add_argument("--start-weight", type=float, default=None,
                   help="how much more often the --start-frames are drawn (default 1)")
    p.add_argument("--freeze-vision", action="store_true", default=None,
                   help="train everything but the vision tower (LeRobot's freeze_vision_encoder; for an --init "
                        "checkpoint whose vision tower is already trained)")
    p.add_argument("--rtc-prefix-max", type=int, default=None,
                   help="training-time real-time chunking: each sample's first d ~ U{0..N} actions are given "
                        "(clean, out of the loss), as the rows that execute while a chunk is computed; the "
                        "checkpoint then runs RTC by conditioning on them (default 0: off)")
    p.add_argument("--log-every", type=int, default=DEFAULTS.log_every)
    p.add_argument("--save-every", type=int, default=DEFAULTS.save_every)
    p.add_argument("--log", default=None, help="also append the progress lines to this file")


def parse_task_weights(text: str) -> dict[str, float]:
    """``"push=3,reach=2"`` -> {"push": 3.0, "reach": 2.0}; ArgumentTypeError naming the bad item."""
    out = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, sep, value = item.partition("=")
        try:
            w = float(value) if sep else math.nan
        except ValueError:
            w = math.nan
        if not name or not (math.isfinite(w) and w >= 0):
            raise argparse.ArgumentTypeError(f"task weight {item!r}: expected TASK=W with W a number >= 0")
        out[name] = w
    if not out:
        raise argparse.ArgumentTypeError(f"task weights {text!r}: expected TASK=W,...")
    return out


def recipe_from_args(args) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return TrainConfig(**given)


def run_train(args) -> int:
    cfg = recipe_from_args(args)  # ValueError naming a bad value before anything is read
    log_file = open(args.log, "a") if args.log else None

    def log(line: str) -> None:
        stamped = f"[{time.strftime('%H:%M:%S')}] {line}"
        print(stamped, flush=True)
        if log_file:
            log_file.write(stamped + "\n")
            log_file.flush()

    command = " ".join(["edgefm-vla"] + [shlex.quote(a) for a in sys.argv[1:]])
    try:
        import numpy as np

        from edgefm_ros.datasets.merge import merge_demos  # with the dataset readers (PyAV, pandas)

        parts = []
        for path in args.dataset:
            try:
                parts.append(read_demos(Path(path)))
            except FileNotFoundError as e:
                raise ValueError(f"--dataset: {e}") from None
        n_parts = len(parts)
        demos = merge_demos(parts, names=args.dataset)
        del parts  # the merged copy holds the frames: the parts' would double the images in memory
        if n_parts > 1:
            log(f"train: {n_parts} datasets as one: {len(np.unique(demos.episode_index))} episodes, "
                f"{len(demos.state)} frames, {len(demos.tasks)} task texts")
        result = train(demos, args.out, cfg, arch=None if args.init else (args.arch or "tiny"), init=args.init,
                       log=log, meta={"dataset": args.dataset[0] if len(args.dataset) == 1 else list(args.dataset),
                                            "command": command},
                       tasks=[t for t in (args.tasks or "").split(",") if t] or None,
                       task_weights=args.task_weights)
    finally:
        if log_file:
            log_file.close()
    print(f"checkpoint: {result.out} ({result.steps} steps, {result.seconds / 60:.1f} min, "
          f"loss {result.first_loss:.4f} -> {result.final_loss:.4f})")
    return 0

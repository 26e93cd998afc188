"""``edgefm-vla``: run, benchmark, inspect and tune SmolVLA on the edgefm runtime.

  edgefm-vla predict --checkpoint DIR [--vlm DIR] --inputs F.safetensors --out F.safetensors [--mode exact|fast]
                     [--from-raw [--task T ...]]
  edgefm-vla bench   (same inputs) --warmup N --runs N --json FILE
  edgefm-vla profile (same inputs) [--json FILE]   per op family and stage: ms, GFLOP, rate, fraction of peak
  edgefm-vla plan    --checkpoint DIR [--vlm DIR] [--mode ...] [--table F.yaml ...]
  edgefm-vla make-checkpoint --out DIR [--arch tiny|small|compact128|full] [--seed N] [--cameras N]
                     [--chunk-size N]
  edgefm-vla tune    --checkpoint DIR [--vlm DIR] [--budget-s S] [--dry-run] [--out F.yaml]
  edgefm-vla train   --dataset DIR [--dataset DIR2 ...] --out CKPT [--arch ARCH | --init CKPT] [--tasks T1,T2] [--steps N]
                     [--batch-size B] [--lr LR] [--seed N] [--threads N] [--chunk-size N] [--n-action-steps N]
                     [--log FILE]

Every command that loads a checkpoint takes --vision-position-ids {auto,legacy,fixed} (default auto).

Inputs use the golden names: images.<i>, img_masks.<i>, lang_tokens, lang_masks, state, noise; with
--from-raw: raw.<camera key> [B, 3, H, W] in [0, 1], raw.<camera key>_padding_mask, raw.<state key>, and the
tasks (--task, else "tasks" of a meta.json beside the inputs file).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from edgefm_ros.dispatch.modes import MODES, TUNABLE
from edgefm_ros.dispatch.profile import OpProbe, format_rows, measure_peaks
from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.preprocess import ModelInputs
from edgefm_ros.runtime.safetensors_mmap import load_all
from edgefm_ros.runtime.tune import tune
from edgefm_ros.training.cli import add_train_args, run_train
from edgefm_ros.training.random_checkpoint import CHUNK_SIZE as RANDOM_CHUNK_SIZE
from edgefm_ros.training.random_checkpoint import make_checkpoint
from edgefm_ros.training.recipe import ARCHS


def _engine(args, probe=None):
    return Engine.from_checkpoint(args.checkpoint, vlm_dir=args.vlm, mode=args.mode, tables=args.table,
                                  threads=args.threads, vision_position_ids=args.vision_position_ids, probe=probe)


def _load_inputs(path: str) -> dict[str, torch.Tensor]:
    return load_all(path)  # cloned: aligned, owned memory (see the reference's parity notes)


def model_inputs(engine, g: dict, args):
    """(ModelInputs, noise) from an inputs file, through preprocessing when --from-raw."""
    cfg = engine.model_config
    if args.from_raw:
        frames = {k: g[f"raw.{k}"] for k in cfg.camera_keys if f"raw.{k}" in g}
        masks = {k: g[f"raw.{k}_padding_mask"] for k in cfg.camera_keys if f"raw.{k}_padding_mask" in g}
        tasks = args.task or json.loads((Path(args.inputs).parent / "meta.json").read_text())["tasks"]
        inp = engine.preprocess(frames, g[f"raw.{cfg.state_key}"], tasks, masks)
    else:
        n = len([k for k in g if k.startswith("images.")])
        missing = [k for k in ("lang_tokens", "lang_masks", "state") if k not in g]
        if missing or n == 0:
            raise SystemExit(f"{args.inputs}: missing input tensor(s) {missing or ['images.<i>']}")
        inp = ModelInputs(tuple(g[f"images.{i}"] for i in range(n)), tuple(g[f"img_masks.{i}"].bool() for i in range(n)),
                          g["lang_tokens"], g["lang_masks"].bool(), g["state"])
    return inp, g.get("noise")


def cmd_predict(args) -> int:
    engine = _engine(args)
    inp, noise = model_inputs(engine, _load_inputs(args.inputs), args)
    actions = engine.sample(inp, noise)
    out = {"actions": actions.contiguous()}
    if args.from_raw:
        out["actions_unnormalized"] = engine.preprocess.actions(actions).contiguous()
    save_file(out, args.out)
    t = engine.last_timings
    print(f"wrote {args.out}: actions {list(actions.shape)} (mode {args.mode}, prefill {t.prefill_s * 1e3:.1f} ms, "
          f"decode {t.decode_s * 1e3:.1f} ms)")
    return 0


def _summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def cmd_bench(args) -> int:
    engine = _engine(args)
    inp, noise = model_inputs(engine, _load_inputs(args.inputs), args)
    for _ in range(args.warmup):
        engine.sample(inp, noise)
    chunk, prefill, decode = [], [], []
    for _ in range(args.runs):
        engine.sample(inp, noise)
        t = engine.last_timings
        chunk.append(t.total_s)
        prefill.append(t.prefill_s)
        decode.append(t.decode_s)
    result = {"chunk_s": _summary(chunk), "prefill_s": _summary(prefill), "decode_s": _summary(decode),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
              "threads": torch.get_num_threads(), "mode": args.mode, "hw_profile": engine.hardware.profile,
              "warmup": args.warmup, "runs": args.runs}
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    return 0


def cmd_profile(args) -> int:
    probe = OpProbe(sync_cuda=True)
    engine = _engine(args, probe)
    inp, noise = model_inputs(engine, _load_inputs(args.inputs), args)
    for _ in range(args.warmup):
        engine.sample(inp, noise)
    peaks = measure_peaks()
    best = None  # the fastest of --runs chunks (the least disturbed by the host)
    for _ in range(args.runs):
        probe.reset()
        engine.sample(inp, noise)
        rows = probe.rows(engine.last_timings, peaks)
        if best is None or engine.last_timings.total_s < best[0].total_s:
            best = (engine.last_timings, rows, probe.chunk_gflop())
    t, rows, gflop = best
    bf16 = peaks.get("bf16")
    print(f"# {args.checkpoint}, mode {args.mode}, {torch.get_num_threads()} threads, hw_profile "
          f"{engine.hardware.profile}; fastest of {args.runs} chunks: {t.total_s * 1e3:.0f} ms "
          f"(prefill {t.prefill_s * 1e3:.0f}, decode {t.decode_s * 1e3:.0f}), {gflop:.0f} GFLOP"
          + (f"; bf16 floor {gflop / bf16 * 1e3:.0f} ms, chunk / floor {t.total_s / (gflop / bf16):.2f}" if bf16 else ""))
    print(format_rows(rows, peaks))
    if args.json:
        Path(args.json).write_text(json.dumps({"peaks": peaks, "rows": rows, "chunk_s": t.total_s,
                                               "prefill_s": t.prefill_s, "decode_s": t.decode_s, "gflop": gflop},
                                              indent=2))
    return 0


def cmd_plan(args) -> int:
    engine = _engine(args)
    rows = engine.plan()
    print(f"# hw_profile {engine.hardware.profile}, mode {args.mode}; tables: "
          + ", ".join(str(p) for p in engine.table_files))
    cols = ("op_name", "op_kind", "layer_role", "stage", "shape_sig", "impl_id", "impl_params", "record")
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))
    return 0


def cmd_make_checkpoint(args) -> int:
    out = make_checkpoint(args.out, args.arch, args.seed, args.cameras, chunk_size=args.chunk_size)
    print(f"wrote a RANDOM-WEIGHT {args.arch} SmolVLA checkpoint to {out} (seed {args.seed}, "
          f"{args.chunk_size}-action chunks)")
    return 0


def cmd_tune(args) -> int:
    return tune(checkpoint=args.checkpoint, vlm_dir=args.vlm, out_path=args.out, budget_s=args.budget_s,
                dry_run=args.dry_run, resume=not args.no_resume, mode=args.mode, verbose=args.verbose,
                vision_position_ids=args.vision_position_ids) or 0


def cmd_train(args) -> int:
    return run_train(args)


def vision_position_ids_arg(p: argparse.ArgumentParser) -> None:
    """``--vision-position-ids`` for every command that loads a checkpoint."""
    p.add_argument("--vision-position-ids", default="auto", choices=VISION_POSITION_ID_CHOICES,
                   help="SmolVLM vision position ids the checkpoint was trained with: legacy (LeRobot 0.4.x, "
                        "transformers 4.55.1-4.57), fixed (LeRobot 0.3.x / >= 0.5, SmolVLA pretraining), auto "
                        "(the checkpoint's edgefm_numerics.json or LeRobot record, else fixed with a warning)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgefm-vla", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def engine_args(p, inputs: bool):
        p.add_argument("--checkpoint", required=True, help="LeRobot SmolVLA checkpoint directory")
        p.add_argument("--vlm", default=None, help="backbone dir (config.json + tokenizer); default: HF cache")
        p.add_argument("--mode", default="exact", choices=MODES)
        p.add_argument("--table", action="append", default=[], help="extra dispatch table (repeatable)")
        p.add_argument("--threads", type=int, default=None)
        vision_position_ids_arg(p)
        if inputs:
            p.add_argument("--inputs", required=True)
            p.add_argument("--from-raw", action="store_true")
            p.add_argument("--task", action="append", default=None)

    p = sub.add_parser("predict", help="run one chunk on an inputs file")
    engine_args(p, True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_predict)
    p = sub.add_parser("bench", help="time chunks on an inputs file")
    engine_args(p, True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", default=None)
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("profile", help="time, GFLOP and fraction of peak per op family and stage")
    engine_args(p, True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None)
    p.set_defaults(fn=cmd_profile)
    p = sub.add_parser("plan", help="print the resolved operator table")
    engine_args(p, False)
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("make-checkpoint", help="write a deterministic random-weight checkpoint")
    p.add_argument("--out", required=True)
    p.add_argument("--arch", default="tiny", choices=sorted(ARCHS), help="training's architectures (recipe.ARCHS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cameras", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=RANDOM_CHUNK_SIZE,
                   help=f"actions per chunk (default {RANDOM_CHUNK_SIZE}, SmolVLA's; not the arch's training default)")
    p.set_defaults(fn=cmd_make_checkpoint)
    p = sub.add_parser("tune", help="search kernel implementations, write config/dispatch/<hw>.yaml")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--vlm", default=None)
    p.add_argument("--mode", default="fast", choices=TUNABLE)
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=600.0)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--verbose", action="store_true", help="print every candidate's time and error")
    vision_position_ids_arg(p)
    p.set_defaults(fn=cmd_tune)
    p = sub.add_parser("train", help="train a SmolVLA checkpoint on a demonstration dataset (flow matching)")
    add_train_args(p)
    p.set_defaults(fn=cmd_train)
    return ap


@cli_main("edgefm-vla", subcommands=True)  # bad input, checkpoint or table: one clear line, no traceback
def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

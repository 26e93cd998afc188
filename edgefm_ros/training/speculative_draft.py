"""Train an EAGLE-3 style draft head by distillation on the target's own outputs (CPU, minutes).

Recipe (the defaults; SmolLM2-135M on 2 CPU cores: 4 minutes of data, 4 of training, 8.6 min wall, 6.6 GB RSS):
  1. data: 1152 chat prompts (24 tasks x 48 topics, built in) plus 32 validation prompts (other tasks
     and topics) -> the target's own continuations, 64 tokens, 296 prompts at a time (left padding, one
     prompt width for every batch), computed by the same weights in the engine's "fast" mode (bf16
     GEMMs on AMX / AVX512-BF16 CPUs: 2-3x the fp32 rate; the draft then serves the fp32 target): every
     other prompt greedy, the others sampled at temperature 0.7 (the prefixes sampled decoding sees).
     At every position keep the target's low/mid/high layer outputs (fp16) and its top-8 next-token
     probabilities (soft labels).
  2. draft vocabulary: the 4096 tokens the target ranks first most often (+ end of sequence), filled up
     with the lowest unseen ids (BPE merge order).
  3. training: 3-step training-time test (EAGLE-3): step 1 feeds the target features, steps 2-3 feed
     the draft's own output hidden with the attention mask the tree drafting uses (a query sees the
     step-1 keys up to its row and its own earlier-step keys); loss = soft cross-entropy against the
     target's top-8 probabilities on answer positions, steps weighted 1, 0.8, 0.64; 500 steps of 16
     sequences, AdamW (lr 2e-3), 25 warm-up steps then cosine decay, bf16 autocast where the CPU has
     bf16 units; the head (target embedding rows) frozen, feature dropout 0.1; the weights of the best
     validation loss kept.
  4. measured on the validation prompts and stored in the file: per depth, how often the target's token
     is the draft's rank-r token (``rank_accept``, the tree shape is derived from it).

    nice -n 10 edgefm-llm train-draft --out config/drafts/smollm2-135m-eagle3.safetensors
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from edgefm_ros.dispatch.table import OpResolver
from edgefm_ros.generation.generate import LlmEngine, causal_mask, run_layers
from edgefm_ros.generation.kv_cache import StaticKVCache
from edgefm_ros.dispatch.modes import check_mode
from edgefm_ros.dispatch.resolver import build_resolver
from edgefm_ros.generation.speculative import DraftConfig, build_draft, draft_config_for, init_draft_weights

_TASKS = ("Explain {} in two sentences.", "Write a short poem about {}.", "Give three facts about {}.",
          "What is {}? Answer briefly.", "List the steps to learn about {}.", "Describe {} to a child.",
          "Why does {} matter?", "Write a haiku about {}.", "Compare {} with something familiar.",
          "Write a product description for {}.", "What questions would a scientist ask about {}?",
          "Give me a fun fact about {} and explain it.", "Write the opening line of a novel about {}.",
          "What are the pros and cons of {}?", "How has {} changed over time?", "Teach me one word about {}.",
          "Write a short dialogue between two people about {}.", "Give me some advice related to {}.",
          "Write a tweet about {}.", "What would happen if {} disappeared?", "Explain {} step by step.",
          "Write a limerick about {}.", "Describe {} in one paragraph.", "Plan a lesson about {}.")
_TOPICS = ("the moon", "photosynthesis", "a robot arm", "the ocean", "gravity", "coffee", "the internet",
           "volcanoes", "honey bees", "a red cube on a table", "rain", "the Roman empire", "electricity",
           "music", "chess", "the human heart", "bicycles", "winter", "a kitchen", "trees", "recycling",
           "the stock market", "dinosaurs", "a hospital", "football", "clouds", "bread", "the solar system",
           "a camera", "friendship", "deserts", "a library", "trains", "vaccines", "mountains", "a garden",
           "batteries", "birds", "a city at night", "mathematics", "a green apple", "airplanes", "sleep",
           "rivers", "a drone", "chocolate", "earthquakes", "the alphabet")
# validation prompts (checkpoint choice, rank statistics): tasks and topics of neither other set
_VAL_TASKS = ("Tell me what you know about {}.", "Write two sentences about {}.",
              "What is interesting about {}?", "Explain why people like {}.")
_VAL_TOPICS = ("penguins", "a wooden chair", "lightning", "the violin", "a yellow ball", "snow", "pizza",
               "satellites")
# evaluation prompts (the benchmark's): tasks and topics that occur in neither training nor validation
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


def validation_prompts(n: int) -> list[list[dict]]:
    """``n`` distinct validation prompts, disjoint from training and evaluation prompts."""
    return _prompts(_VAL_TASKS, _VAL_TOPICS, n)


def held_out_prompts(n: int) -> list[list[dict]]:
    """``n`` distinct evaluation prompts, disjoint from the training ones in task and topic."""
    return _prompts(_HELD_TASKS, _HELD_TOPICS, n)


@dataclass
class DistillData:
    tokens: torch.Tensor  # [N, T] i64: left-padded prompt, then the target's continuation from column `start`
    valid: torch.Tensor  # [N, T] bool: real token, up to the first end of sequence
    positions: torch.Tensor  # [N, T] i64 rotary positions
    taps: torch.Tensor  # [N, T, n_taps * H] f16: target outputs of the tap layers
    top_ids: torch.Tensor  # [N, T, K] i64: the target's K most likely next tokens at each position
    top_p: torch.Tensor  # [N, T, K] f32: their probabilities (temperature 1)
    start: int  # first answer column (every row)

    def rows(self, idx: torch.Tensor) -> "DistillData":
        return DistillData(*(getattr(self, f.name)[idx] for f in fields(self) if f.name != "start"), self.start)

    @property
    def argmax(self) -> torch.Tensor:
        """[N, T] the target's greedy choice at each position."""
        return self.top_ids[..., 0]


def _concat(parts: list[DistillData]) -> DistillData:
    return DistillData(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(DistillData)
                         if f.name != "start"), parts[0].start)


@torch.inference_mode()
def collect(engine: LlmEngine, prompts, new_tokens: int, taps, batch: int = 128, temperature: float = 0.7,
            sampled_every: int = 2, top_k: int = 8, seed: int = 0, log=print) -> DistillData:
    """The target's continuations of ``prompts`` (row i sampled when i % sampled_every == 1, else greedy;
    sampled_every 0: all greedy), batched, with tap features and top-k probabilities at every position."""
    lm, pad = engine.lm["prefill"], engine.eos_ids[0] if engine.eos_ids else 0
    rows = [engine.encode(p) for p in prompts]
    width = max(len(r) for r in rows)  # one prompt width for all batches: one prefill GEMM shape
    total = width + new_tokens
    eos = torch.tensor(engine.eos_ids or (pad,))
    gen = torch.Generator().manual_seed(seed)
    t = engine.model_config.text
    parts = []
    for b0 in range(0, len(rows), batch):
        t0 = time.perf_counter()
        chunk = rows[b0:b0 + batch]
        n = len(chunk)
        ids = torch.full((n, width), pad, dtype=torch.long)
        valid = torch.zeros(n, total, dtype=torch.bool)
        for i, r in enumerate(chunk):
            ids[i, width - len(r):] = torch.tensor(r)
            valid[i, width - len(r):] = True
        pos = (valid.long().cumsum(1) - 1).clamp_min(0)
        sampled = (torch.arange(b0, b0 + n) % sampled_every == 1) if sampled_every else torch.zeros(n, dtype=bool)
        cache = StaticKVCache(engine.codec, t.layers, n, t.kv_heads, total, t.head_dim)
        h, tapped = run_layers(lm, lm.embed_tokens(ids), pos[:, :width], causal_mask(0, width, valid), cache, 0,
                               taps)
        feats = torch.zeros(n, total, len(taps) * t.hidden, dtype=torch.float16)
        top_ids = torch.zeros(n, total, top_k, dtype=torch.long)
        top_p = torch.zeros(n, total, top_k)
        tokens = torch.cat([ids, torch.full((n, new_tokens), pad, dtype=torch.long)], 1)
        feats[:, :width] = torch.cat(tapped, -1).half()
        logits = lm.logits(h[:, -1:])[:, 0]
        ended = torch.zeros(n, dtype=torch.bool)
        for s in range(new_tokens):
            col = width + s  # the new token's column
            probs = torch.softmax(logits.float(), -1)
            p, i = torch.topk(probs, top_k, -1)
            top_ids[:, col - 1], top_p[:, col - 1] = i, p
            hot = torch.softmax(logits.float() / temperature, -1)
            nxt = torch.where(sampled, torch.multinomial(hot, 1, generator=gen)[:, 0], i[:, 0])
            tokens[:, col] = nxt
            valid[:, col] = ~ended
            ended |= torch.isin(nxt, eos)
            h, tapped = run_layers(lm, lm.embed_tokens(nxt[:, None]), pos[:, col:col + 1],
                                   causal_mask(col, 1, valid), cache, col, taps)
            feats[:, col] = torch.cat(tapped, -1)[:, 0].half()
            logits = lm.logits(h)[:, 0]
            if bool(ended.all()):
                break
        top_p[:, col], top_ids[:, col] = torch.topk(torch.softmax(logits.float(), -1), top_k, -1)
        # a row stops being training data after its first end-of-sequence token (which itself stays)
        parts.append(DistillData(tokens, valid, pos, feats, top_ids, top_p, width))
        log(f"collect: prompts {b0 + n}/{len(rows)}, {n} x {total} tokens, {int(valid[:, width:].sum())} answer "
            f"tokens, {time.perf_counter() - t0:.1f}s")
    return _concat(parts)


def draft_vocabulary(data: DistillData, size: int, eos_ids, vocab: int) -> torch.Tensor:
    """The ``size`` tokens the target ranks first most often (end-of-sequence ids always in); ties (tokens
    never seen) go to the lower id: BPE ids follow merge order, roughly frequency. [size] i64"""
    counts = torch.bincount(data.argmax[data.valid], minlength=vocab).double()
    counts[list(eos_ids)] = float("inf")
    counts -= torch.arange(vocab, dtype=torch.double) / (2.0 * vocab)  # < 1/2: only orders equal counts
    return torch.topk(counts, min(size, vocab)).indices.sort().values


def _ttt_mask(valid: torch.Tensor, c0: int, steps: int) -> torch.Tensor:
    """Step-``steps`` mask for query rows [c0, t): step-1 keys c <= r (valid ones), then its own key of each
    later step (one diagonal block per step): bool [B, t - c0, t + (steps - 1) * (t - c0)]."""
    b, t = valid.shape
    first = causal_mask(c0, t - c0, valid)
    own = torch.eye(t - c0, dtype=torch.bool)[None].expand(b, -1, -1)
    return torch.cat([first] + [own] * (steps - 1), dim=2)


def draft_losses(draft, embed: torch.Tensor, data: DistillData, t2d: torch.Tensor, steps: int = 3,
                 dropout: float = 0.0, decay: float = 0.8, ranks: int = 0):
    """Training-time test over ``steps`` draft steps on ``data`` rows.

    -> (loss, per-step top-1 accuracy [steps], per-step rank histogram [steps, ranks] when ``ranks``)."""
    tok, val, pos = data.tokens, data.valid, data.positions
    feats = data.taps.float()
    if dropout:
        feats = F.dropout(feats, dropout)
    t = tok.shape[1] - steps
    c0 = max(data.start - steps, 0)  # rows before c0 never carry a loss: no MLP / head there
    layer = draft.layers[0]
    x = draft.inputs(F.embedding(tok[:, 1:t + 1], embed), draft.features([feats[:, :t]]))
    q, k, v = layer.qkv_heads(x, draft.rope_tables(pos[:, :t]))
    g = layer.finish(x[:, c0:], layer.attn(q[:, :, c0:], k, v, causal_mask(c0, t - c0, val[:, :t])))
    keys, values = [k], [v]
    total, accs, hist = 0.0, [], []
    cols = torch.arange(c0, t)
    for s in range(1, steps + 1):
        if s > 1:
            x = draft.inputs(F.embedding(tok[:, c0 + s:t + s], embed), g)
            q, k, v = layer.qkv_heads(x, draft.rope_tables(pos[:, c0:t] + s - 1))
            keys.append(k)
            values.append(v)
            g = layer.finish(x, layer.attn(q, torch.cat(keys, 2), torch.cat(values, 2),
                                           _ttt_mask(val[:, :t], c0, s)))
        logits = draft.logits(g)  # [B, t - c0, Vd]
        d = t2d[data.top_ids[:, c0 + s:t + s]]  # [B, t - c0, K] draft ids of the target's top-k (-1: absent)
        p = data.top_p[:, c0 + s:t + s] * (d >= 0)
        keep = val[:, c0 + s:t + s] & val[:, c0:t] & (cols + s >= data.start)[None]
        logp = torch.log_softmax(logits.float(), -1)
        ce = -(p * logp.gather(-1, d.clamp_min(0))).sum(-1)
        total = total + decay ** (s - 1) * (ce[keep].mean() if keep.any() else ce.sum() * 0)
        lab = d[..., 0]
        ok = keep & (lab >= 0)
        accs.append(float((logits.argmax(-1) == lab)[keep].float().mean()) if keep.any() else 0.0)
        if ranks:
            score = logits.gather(-1, lab.clamp_min(0)[..., None])
            rank = (logits > score).sum(-1)  # rank of the target's token among the draft's logits
            h = torch.bincount(rank[ok].clamp_max(ranks), minlength=ranks + 1)[:ranks].float()
            hist.append(h / max(int(keep.sum()), 1))
    return total, accs, (torch.stack(hist) if ranks else None)


def _draft_ops(engine: LlmEngine) -> OpResolver:
    """Reference kernels: they use the weights as given, so gradients reach the parameters (fused ones copy)."""
    return build_resolver("reference", engine.hardware.profile, "smollm2-draft", lambda role: "prefill")


def train(engine: LlmEngine, data: DistillData, cfg: DraftConfig, d2t: torch.Tensor, steps: int = 500,
          batch: int = 16, lr: float = 2e-3, seed: int = 0, log=print, val: DistillData | None = None,
          ttt_steps: int = 3, freeze_head: bool = True, dropout: float = 0.1, eval_every: int = 50,
          amp: bool | None = None):
    """Draft weights trained on ``data``. -> (tensors to save, validation stats).

    With ``val`` the weights kept are those of the best validation loss (checked every ``eval_every``
    steps) and the stats hold its per-step accuracy and rank histogram. The head starts as the
    target's embedding rows of the draft vocabulary and stays frozen unless ``freeze_head`` is False.
    ``amp`` (default: when the CPU has bf16 matrix units): training steps under bf16 autocast.
    """
    if amp is None:
        amp = "bf16" in engine.hardware.profile or "amx" in engine.hardware.profile
    n_train = data.tokens.shape[0]
    weights = init_draft_weights(cfg, engine.lm["decode"].token_embedding, d2t, seed)
    fixed = ("d2t", "head.weight") if freeze_head else ("d2t",)
    params = {k: nn.Parameter(v) for k, v in weights.items() if k not in fixed}
    draft = build_draft(cfg, {**weights, **params}, _draft_ops(engine))
    t2d = torch.full((cfg.target_vocab,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    opt = torch.optim.AdamW(params.values(), lr=lr, weight_decay=0.01)
    warm = min(25, max(steps // 10, 1))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    gen = torch.Generator().manual_seed(seed)
    embed = engine.lm["decode"].token_embedding.detach().clone()
    best, best_loss, stats = None, float("inf"), {}
    t0 = time.perf_counter()
    for step in range(steps):
        with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            rows = data.rows(torch.randint(0, n_train, (batch,), generator=gen))
            loss, accs, _ = draft_losses(draft, embed, rows, t2d, ttt_steps, dropout)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
            opt.step()
            sched.step()
        last = step == steps - 1
        if (step + 1) % eval_every == 0 or last:
            msg = f"train: step {step + 1}/{steps} loss {loss.item():.3f} acc {' '.join(f'{a:.3f}' for a in accs)}"
            if val is not None:
                with torch.no_grad():
                    vl, vacc, hist = draft_losses(draft, embed, val, t2d, ttt_steps, ranks=4)
                msg += f" | val loss {vl.item():.3f} acc {' '.join(f'{a:.3f}' for a in vacc)}"
                if vl.item() < best_loss:
                    best_loss, best = vl.item(), {k: p.detach().clone() for k, p in params.items()}
                    stats = {"val_loss": round(vl.item(), 4), "val_acc": [round(a, 4) for a in vacc],
                             "rank_accept": [[round(float(x), 4) for x in row] for row in hist],
                             "best_step": step + 1}
            log(f"{msg} ({time.perf_counter() - t0:.0f}s)")
    kept = best if best is not None else {k: p.detach().clone() for k, p in params.items()}
    return {**{k: v for k, v in weights.items() if k in fixed}, **kept}, stats


def _knob(default, text: str):
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class Recipe:
    """The training recipe's knobs (defaults: the documented SmolLM2-135M recipe, <= 10 min on 2 cores);
    each field's ``help`` is what ``edgefm-llm train-draft --help`` shows for it."""
    prompts: int = _knob(1152, "training prompts (built-in task x topic grid)")
    val_prompts: int = _knob(32, "validation prompts")
    new_tokens: int = _knob(64, "target continuation length per prompt")
    collect_batch: int = _knob(296, "prompts per data-collection batch ((1152 + 32) / 4: four equal batches)")
    collect_mode: str = _knob("fast", "engine mode that generates the training data (same weights): exact, fast "
                                      "or reference (fast: bf16 GEMMs where the CPU has them, 2-3x faster)")
    temperature: float = _knob(0.7, "of the sampled continuations")
    sampled_every: int = _knob(2, "every n-th continuation is sampled, the others greedy (0: all greedy)")
    draft_vocab: int = _knob(4096, "draft vocabulary size")
    inner: int = _knob(768, "draft MLP width")
    steps: int = _knob(500, "training steps")
    batch: int = _knob(16, "training batch")
    lr: float = _knob(2e-3, "learning rate")
    ttt_steps: int = _knob(3, "training-time-test draft steps")
    seed: int = _knob(0, "random seed")

    def __post_init__(self) -> None:
        for name in ("prompts", "val_prompts", "new_tokens", "collect_batch", "draft_vocab", "inner", "steps",
                     "batch", "ttt_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        check_mode(self.collect_mode, what="collect_mode")
        if not 0 < self.temperature:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must lie in (0, 1), got {self.lr!r}")


def train_draft(engine: LlmEngine, recipe: Recipe = Recipe(), log=print,
                collect_engine: LlmEngine | None = None):
    """The whole recipe: collect (with ``collect_engine``, default ``engine``: the same weights, maybe
    another mode), choose the draft vocabulary, train. -> (DraftConfig, tensors, stats)."""
    t0 = time.perf_counter()
    cfg = draft_config_for(engine, recipe.draft_vocab, recipe.inner)
    prompts = default_prompts(recipe.prompts) + validation_prompts(recipe.val_prompts)
    data = collect(collect_engine or engine, prompts, recipe.new_tokens, cfg.taps, recipe.collect_batch,
                   recipe.temperature, recipe.sampled_every, seed=recipe.seed, log=log)
    t1 = time.perf_counter()
    n = recipe.prompts
    train_rows, val_rows = data.rows(torch.arange(n)), data.rows(torch.arange(n, n + recipe.val_prompts))
    d2t = draft_vocabulary(train_rows, cfg.draft_vocab, engine.eos_ids, cfg.target_vocab)
    answer = train_rows.valid.clone()
    answer[:, :data.start] = False
    coverage = float(torch.isin(train_rows.argmax[answer], d2t).float().mean())
    log(f"draft vocabulary: {cfg.draft_vocab} tokens cover {coverage:.3f} of the target's answer tokens")
    tensors, vstats = train(engine, train_rows, cfg, d2t, recipe.steps, recipe.batch, recipe.lr, recipe.seed, log,
                            val=val_rows, ttt_steps=recipe.ttt_steps)
    stats = {"recipe": {f.name: getattr(recipe, f.name) for f in fields(recipe)},
             "threads": torch.get_num_threads(),
             "answer_tokens": int(answer.sum()), "vocab_coverage": round(coverage, 4),
             "collect_s": round(t1 - t0, 1), "train_s": round(time.perf_counter() - t1, 1),
             "draft_vocab": cfg.draft_vocab, "inner": cfg.text.inner, "taps": list(cfg.taps), **vstats}
    return cfg, tensors, stats

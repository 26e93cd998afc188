"""Speculative decoding with a draft head: chain or token tree, greedy or sampled.

One step: the draft catches up on the tokens the target committed last step (their target features),
then drafts a static tree (``tree.TreeShape``; a chain is the one-child-per-node tree): each depth is
one draft pass over that depth's nodes with a tree mask over the draft's own cache, children are the
draft's top-ranked tokens (a sampled chain draws them from the draft distribution instead). The target
scores the pending token and every node in ONE pass (tree mask, positions = depth), the walk from the
root accepts children by the rule of ``sampling`` (greedy: the target's argmax; sampled: speculative
sampling, so the output follows the target's sampling distribution), the accepted nodes' keys/values
are moved into place behind the root and the rest is dropped, and the target's token after the last
accepted node becomes the next pending token.

Greedy: every committed token is the target's argmax given the committed prefix, so the output is
token-for-token the plain greedy output (up to argmax ties within fp32 rounding of a wider pass).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from ..generate import (Generation, GenerationError, LlmEngine, SamplingConfig, _Stream, causal_mask, pick,
                        run_layers)
from ..kv_cache import StaticKVCache
from .draft import DraftHead
from .sampling import accept_among, draw, target_dist
from .tree import DEFAULT_RANK_ACCEPT, TreeShape, tree_mask, tree_positions


def rank_accept(draft: DraftHead):
    """The per-depth rank acceptance measured when the draft was trained (``rank_accept`` in its
    metadata), else ``DEFAULT_RANK_ACCEPT``."""
    return draft.meta.get("rank_accept") or DEFAULT_RANK_ACCEPT


def draft_tree(draft: DraftHead, nodes: int, max_depth: int = 6) -> TreeShape:
    """The best static tree of ``nodes`` nodes for this draft, scored with its ``rank_accept``."""
    return TreeShape.best(nodes, rank_accept(draft), max_depth)


class SpeculativeDecoder:
    """``generate`` mirrors ``LlmEngine.generate`` (text prompts); ``tree`` None: a chain of ``k`` tokens."""

    def __init__(self, engine: LlmEngine, draft: DraftHead, k: int = 4, tree: TreeShape | None = None):
        self.tree = tree if tree is not None else TreeShape.chain(k)
        t = draft.cfg.text
        if engine.model_config.text.hidden != t.hidden or max(draft.cfg.taps) >= engine.model_config.text.layers:
            raise ValueError("draft head does not fit this target (hidden size or tap layers)")
        self.engine, self.draft, self.k = engine, draft, self.tree.size
        codec = engine.resolvers["decode"].build("kv", "draft.kv_cache", "draft_kv", f"h{t.kv_heads}xd{t.head_dim}",
                                                 {"kv_heads": t.kv_heads, "head_dim": t.head_dim})
        self.cache = StaticKVCache(codec, 1, 1, t.kv_heads, engine.config.capacity, t.head_dim)
        self.valid_from = 0  # first draft cache slot with an entry (> 0 when a fixed prefix was reused)

    # ---- draft ------------------------------------------------------------------------------------
    def _draft_pass(self, emb: torch.Tensor, hidden: torch.Tensor, start: int, positions: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor:
        """Draft layer over slots [start, start + n) -> its output hidden [1, n, H]."""
        g, _ = run_layers(self.draft, self.draft.inputs(emb, hidden), positions[None], mask, self.cache, start)
        return g

    def _catch_up(self, tokens: Sequence[int], feats: torch.Tensor, start: int) -> torch.Tensor:
        """Draft entries for slots start.. (inputs: tokens[i] and the target feature at start + i); the cache
        then ends at the root's slot P. -> the draft hidden of the last one (predicts depth 1) [1, 1, H]."""
        n = len(tokens)
        mask = causal_mask(start, n) if n > 1 or self.valid_from else None
        if self.valid_from:  # a reused prefix left no draft entries below valid_from
            mask = mask & (torch.arange(start + n) >= self.valid_from)[None, None]
        emb = self.engine.lm["decode"].embed_tokens(torch.tensor([list(tokens)]))
        g = self._draft_pass(emb, feats, start, torch.arange(start, start + n), mask)
        self.cache.length = start + n
        return g[:, -1:]

    def _draft_dist(self, logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
        """Draft logits [Vd] -> its sampling distribution over the target vocabulary [V]."""
        q = target_dist(logits, s)  # sampled decoding only reaches here
        return torch.zeros(self.draft.cfg.target_vocab).index_copy_(0, self.draft.d2t, q)

    def _propose(self, tokens: Sequence[int], feats: torch.Tensor, start: int, s: SamplingConfig,
                 gen: torch.Generator | None):
        """Catch up, then draft the tree. -> (node tokens [m] list, draft distributions [m, V] when the
        nodes were sampled (sampled chain), else None: nodes are the draft's ranked choices)."""
        tree, d2t = self.tree, self.draft.d2t
        g = self._catch_up(tokens, feats, start)
        P = self.cache.length
        sampled = tree.is_chain and not s.greedy
        toks = [0] * (tree.size + 1)
        qs = torch.zeros(tree.size + 1, self.draft.cfg.target_vocab) if sampled else None
        hid = torch.empty(tree.size + 1, g.shape[-1])
        hid[0] = g[0, 0]
        prev, logits = range(0, 1), self.draft.logits(g)[0]  # parents' draft logits [n_prev, Vd]
        prefix_ok = torch.arange(P) >= self.valid_from
        for depth, level in enumerate(tree.levels, start=1):
            if sampled:
                for i in level:
                    qs[i] = self._draft_dist(logits[tree.parents[i] - prev.start], s)
                    toks[i] = int(torch.multinomial(qs[i], 1, generator=gen))
            else:
                top = torch.topk(logits, max(tree.ranks[i] for i in level) + 1, dim=-1).indices
                for i in level:
                    toks[i] = int(d2t[top[tree.parents[i] - prev.start, tree.ranks[i]]])
            if depth == tree.depth:
                break
            ids = list(level)
            first = P + level.start - 1  # node i lives in draft slot P + i - 1
            mask = torch.cat([prefix_ok[None].expand(len(ids), -1), tree.ancestors[ids, 1:level.stop]], 1)[None]
            emb = self.engine.lm["decode"].embed_tokens(torch.tensor([[toks[i] for i in ids]]))
            parents = hid[[tree.parents[i] for i in ids]][None]
            g = self._draft_pass(emb, parents, first, torch.full((len(ids),), P + depth - 1), mask)
            hid[level.start:level.stop] = g[0]
            prev, logits = level, self.draft.logits(g)[0]
        self.cache.length = P  # tree entries are scratch
        return toks[1:], (qs[1:] if sampled else None)

    # ---- target -----------------------------------------------------------------------------------
    def _verify(self, root: int, nodes: Sequence[int], taps: Sequence[int]):
        """The root and all nodes in one target pass. -> (logits [m + 1, V], taps [1, m + 1, H] each);
        the target cache keeps its length (the root's slot P): ``_commit_path`` settles it."""
        e = self.engine
        P = e.cache.length
        logits, tapped = e.forward_decode([root] + list(nodes), taps, tree_positions(self.tree, P),
                                          tree_mask(self.tree, P))
        e.cache.length = P
        return logits, tapped

    def _walk(self, root: int, nodes: Sequence[int], qs: torch.Tensor | None, logits: torch.Tensor,
              s: SamplingConfig, gen: torch.Generator | None):
        """Accept nodes from the root down. -> (accepted node ids, root to leaf order; the token after them)."""
        tree, toks = self.tree, [root] + list(nodes)
        node, path = 0, []
        while True:
            kids = tree.children[node]
            if not kids:
                return path, pick(logits[node], s, gen)
            p = target_dist(logits[node], s)[None]
            x = torch.tensor([[toks[c] for c in kids]])
            q = None if qs is None else qs[[c - 1 for c in kids]][None]
            u = torch.zeros(1, len(kids)) if s.greedy else torch.rand(1, len(kids), generator=gen)
            idx, rest = accept_among(p, x, q, u)
            if int(idx) < 0:
                return path, draw(rest[0], s.greedy, gen)
            node = kids[int(idx)]
            path.append(node)

    def _commit_path(self, P: int, path: Sequence[int]) -> None:
        """Keep the root and the accepted nodes' keys/values in slots P, P + 1, ...; drop the rest."""
        e = self.engine
        if list(path) != list(range(1, len(path) + 1)):
            e.cache.move([P + i for i in path], P + 1)
        e.cache.length = P + 1 + len(path)

    # ---- generation -------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompt, sampling: SamplingConfig = SamplingConfig(),
                 on_token: Callable[[int, str], None] | None = None) -> Generation:
        e, taps = self.engine, self.draft.cfg.taps
        t0 = time.perf_counter()
        ids, start, _ = e.begin(e.encode(prompt), None)
        if len(ids) + sampling.max_new_tokens + self.tree.size + 1 > e.config.capacity:
            raise GenerationError(f"prompt of {len(ids)} tokens + max_new_tokens {sampling.max_new_tokens} + "
                                  f"{self.tree.size} draft nodes exceeds the KV capacity {e.config.capacity}")
        gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        logits, tapped = e.prefill(ids[start:], start, taps=taps)
        nxt = pick(logits, sampling, gen)  # the first token as plain decoding picks it
        seq = list(ids)  # committed tokens in the target cache, then `nxt` pending
        feats, fstart = self.draft.features(tapped), start  # target features not yet in the draft cache
        stops, stream = e.stop_ids(sampling), _Stream(e.tokenizer, sampling.stop_strings, on_token)
        out, accepted = [], []
        t1, ttft, reason = t0, 0.0, "length"
        self.cache.length = self.valid_from = start
        while True:
            if not out:
                t1 = time.perf_counter()
                ttft = t1 - t0
            done = self._commit(nxt, out, stops, stream, sampling.max_new_tokens)
            if done:
                reason = done
                break
            nodes, qs = self._propose(seq[fstart + 1:] + [nxt], feats, fstart, sampling, gen)
            P = e.cache.length
            v_logits, v_taps = self._verify(nxt, nodes, taps)
            path, after = self._walk(nxt, nodes, qs, v_logits, sampling, gen)
            self._commit_path(P, path)
            accepted.append(len(path) + 1)
            new = [nodes[i - 1] for i in path]
            seq += [nxt] + new
            feats, fstart = self.draft.features([t[:, [0] + list(path)] for t in v_taps]), P
            for tok in new:
                done = self._commit(tok, out, stops, stream, sampling.max_new_tokens)
                if done:
                    break
            if done:
                reason = done
                break
            nxt = after
        return Generation(out, stream.text, reason, len(ids), len(ids) - start, ttft, time.perf_counter() - t1,
                          accepted)

    @staticmethod
    def _commit(tok: int, out: list, stops, stream: _Stream, limit: int) -> str | None:
        """Append one token; the stop reason when generation ends with it."""
        if tok in stops:
            stream.emit(tok, True)
            return "eos"
        out.append(tok)
        if stream.push(out):
            stream.emit(tok, True)
            return "stop_string"
        if len(out) >= limit:
            stream.emit(tok, True)
            return "length"
        stream.emit(tok, False)
        return None

"""Token-tree speculation: the tree pass equals running each root-to-node path on its own, the KV cache
after a tree step equals plain decoding of the committed tokens, greedy tree output equals plain greedy."""
import pytest
import torch

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.generation.kv_cache import StaticKVCache
from edgefm_ros.generation.speculative import (SpeculativeDecoder, TreeShape, build_draft, draft_config_for,
                                            init_draft_weights, tree_mask, tree_positions)

WIDE = TreeShape(((0,), (1,), (2,), (0, 0), (1, 0), (1, 1), (2, 0), (1, 1, 0), (1, 1, 1), (1, 1, 1, 0)))


@pytest.fixture(scope="module")
def head(engine):
    cfg = draft_config_for(engine, 256, inner=64)
    d2t = torch.randperm(cfg.target_vocab)[:256]
    return build_draft(cfg, init_draft_weights(cfg, engine.lm["decode"].token_embedding, d2t,
                                               seed=int(torch.randint(0, 1000, ()))), engine.resolvers["decode"])


def random_tree(n: int) -> TreeShape:
    """n nodes, each the next free rank under a random earlier node (or the root)."""
    paths = []
    for _ in range(n):
        parent = () if not paths or torch.rand(()) < 0.3 else paths[int(torch.randint(0, len(paths), ()))]
        rank = sum(1 for p in paths if p[:-1] == parent)
        paths.append(parent + (rank,))
    return TreeShape(tuple(paths))


class ScriptedTree(SpeculativeDecoder):
    """Puts the greedy continuation on the nodes of ``true_path`` (ranks from the root), wrong tokens elsewhere."""

    def __init__(self, engine, draft, tree, script, true_path):
        super().__init__(engine, draft, tree=tree)
        self.script = script
        self.true = {tuple(true_path[:d]) for d in range(1, len(true_path) + 1)}

    def _propose(self, tokens, feats, start, s, gen):
        super()._propose(tokens, feats, start, s, gen)
        done = self.engine.cache.length - self.prompt_len
        out = []
        for p in self.tree.paths:
            i = done + len(p)
            right = self.script[i] if i < len(self.script) else 3
            out.append(right if p in self.true else (right + 1 + p[-1]) % 49000)
        return out, None

    def generate(self, prompt, sampling=SamplingConfig(), on_token=None):
        self.prompt_len = len(self.engine.encode(prompt))
        return super().generate(prompt, sampling, on_token)


def test_tree_shape_structure_and_errors():
    t = random_tree(int(torch.randint(4, 14, ())))
    assert all(t.parents[i] < i and t.depths[i] == t.depths[t.parents[i]] + 1 for i in range(1, t.size + 1))
    assert sorted(i for lv in t.levels for i in lv) == list(range(1, t.size + 1))
    for i in range(1, t.size + 1):
        assert t.ancestors[i].nonzero().flatten().tolist() == [0] + t.path_to(i)
    best = TreeShape.best(10, (0.5, 0.2, 0.1), max_depth=4)
    assert best.size == 10 and best.depth <= 4 and (0,) in best.paths
    assert TreeShape.best(11, (0.5, 0.2, 0.1)).expected_length((0.5, 0.2, 0.1)) > best.expected_length((0.5, 0.2, 0.1))
    assert TreeShape.chain(3).is_chain and not WIDE.is_chain
    for bad in ((), ((0, 1),), ((0,), (0,)), ((-1,),)):
        with pytest.raises(ValueError):
            TreeShape(bad)


def test_tree_pass_equals_each_path_alone(engine):
    """Logits and tap features of every node equal a causal pass over the prompt + its root-to-node path."""
    tree = random_tree(int(torch.randint(5, 12, ())))
    ids = torch.randint(3, 49000, (int(torch.randint(6, 20, ())),)).tolist()
    toks = torch.randint(3, 49000, (tree.size + 1,)).tolist()  # root + nodes
    taps = (0, 2)
    engine.use_prefix(None)
    engine.prefill(ids, 0)
    P = engine.cache.length
    logits, tapped = engine.forward_decode(toks, taps, tree_positions(tree, P), tree_mask(tree, P))
    for i in range(tree.size + 1):
        engine.cache.length = P
        ref, ref_taps = engine.forward_decode([toks[j] for j in [0] + tree.path_to(i)], taps)
        scale = float(ref[-1].abs().max())
        assert torch.allclose(logits[i], ref[-1], rtol=1e-4, atol=1e-5 * scale), i
        for a, b in zip(tapped, ref_taps):
            assert torch.allclose(a[0, i], b[0, -1], rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_kv_after_a_tree_step_equals_plain_decoding(tied_llama, head):
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    e = LlmEngine.from_dir(tied_llama[0], LlmEngineConfig(capacity=96))
    ref = LlmEngine.from_dir(tied_llama[0], LlmEngineConfig(capacity=96))
    ids = torch.randint(3, 49000, (9,)).tolist()
    greedy = ref.generate(ids, SamplingConfig(max_new_tokens=6, stop_ids=())).tokens
    dec = SpeculativeDecoder(e, head, tree=WIDE)
    logits, _ = e.prefill(ids, 0)
    root = int(torch.argmax(logits))
    assert root == greedy[0]
    P = e.cache.length
    want = (1, 1, 1, 0)  # the greedy continuation sits on rank-1 branches: accepted nodes must be moved
    nodes = [greedy[len(p)] if p == want[:len(p)] else (greedy[len(p)] + 7) % 49000 for p in WIDE.paths]
    v_logits, _ = dec._verify(root, nodes, ())
    path, after = dec._walk(root, nodes, None, v_logits, SamplingConfig(), None)
    assert [WIDE.paths[i - 1] for i in path] == [want[:d] for d in range(1, 5)] and after == greedy[5]
    dec._commit_path(P, path)
    assert e.cache.length == P + 5
    ref.prefill(ids, 0)
    for t in greedy[:5]:
        ref.forward_decode([t])
    for layer in range(e.model_config.text.layers):
        (k, v), (rk, rv) = e.cache.read(layer, P + 5), ref.cache.read(layer, P + 5)
        assert torch.allclose(k, rk, rtol=1e-4, atol=1e-4) and torch.allclose(v, rv, rtol=1e-4, atol=1e-4)
    # decoding on from the compacted cache gives plain decoding's next logits
    nxt, _ = e.forward_decode([after])
    more, _ = ref.forward_decode([after])
    assert torch.allclose(nxt, more, rtol=1e-4, atol=1e-4 * float(more.abs().max()))


def test_tree_commit_moves_int8_entries_exactly(tied_llama, head):
    """With the int8 codec the accepted nodes' stored bytes and scales land behind the root unchanged."""
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    e = LlmEngine.from_dir(tied_llama[0], LlmEngineConfig(capacity=96, kv_codec="int8"))
    dec = SpeculativeDecoder(e, head, tree=WIDE)
    ids = torch.randint(3, 49000, (9,)).tolist()
    e.prefill(ids, 0)
    P = e.cache.length
    dec._verify(5, torch.randint(3, 49000, (WIDE.size,)).tolist(), ())
    before = [{k: t.clone() for k, t in store.items()} for store in e.cache.stores]
    path = WIDE.path_to(WIDE.paths.index((1, 1, 1, 0)) + 1)  # (1,), (1, 1), (1, 1, 1), (1, 1, 1, 0)
    assert path == [2, 6, 9, 10]
    dec._commit_path(P, path)
    assert e.cache.length == P + 5
    for store, old in zip(e.cache.stores, before):
        for name in ("k", "v", "k_scale", "v_scale"):
            assert torch.equal(store[name][:, :, :P + 1], old[name][:, :, :P + 1])
            assert torch.equal(store[name][:, :, P + 1:P + 5], old[name][:, :, [P + i for i in path]])


def test_kv_move_is_exact_for_any_codec(engine):
    from edgefm_kernels.kv import Int8KV, PlainKV

    for codec in (PlainKV(), Int8KV()):
        c = StaticKVCache(codec, 2, 1, 2, 32, 8)
        for layer in range(2):
            c.write(layer, torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8), 0)
        before = [tuple(t.clone() for t in c.read(layer, 32)) for layer in range(2)]
        src = [12, 15, 19]
        c.move(src, 11)  # overlapping ranges: sources are gathered first
        for layer in range(2):
            k, v = c.read(layer, 32)
            assert torch.equal(k[:, :, 11:14], before[layer][0][:, :, src])
            assert torch.equal(v[:, :, 11:14], before[layer][1][:, :, src])
            assert torch.equal(k[:, :, :11], before[layer][0][:, :, :11])
        with pytest.raises(ValueError, match="capacity"):
            c.move([31], 32)


@pytest.mark.parametrize("tree", [TreeShape.best(6), WIDE, "random"], ids=["best6", "wide", "random"])
def test_greedy_tree_identical_to_plain_greedy(engine, head, tree):
    tree = random_tree(9) if tree == "random" else tree
    ids = torch.randint(3, 49000, (10,)).tolist()
    s = SamplingConfig(max_new_tokens=18, stop_ids=())
    engine.use_prefix(None)
    plain = engine.generate(ids, s)
    out = SpeculativeDecoder(engine, head, tree=tree).generate(ids, s)
    assert out.tokens == plain.tokens and out.text == plain.text
    assert all(1 <= a <= tree.depth + 1 for a in out.accepted)


def test_tree_oracle_accepts_whole_branches_and_stops(engine, head):
    ids = torch.randint(3, 49000, (10,)).tolist()
    s = SamplingConfig(max_new_tokens=22, stop_ids=())
    plain = engine.generate(ids, s)
    want = (1, 1, 1, 0)
    out = ScriptedTree(engine, head, WIDE, plain.tokens, want).generate(ids, s)
    assert out.tokens == plain.tokens
    assert out.accepted[:-1] == [len(want) + 1] * (len(out.accepted) - 1)
    stop = SamplingConfig(max_new_tokens=22, stop_ids=(plain.tokens[8],))
    ref = engine.generate(ids, stop)
    got = ScriptedTree(engine, head, WIDE, plain.tokens, want).generate(ids, stop)
    assert got.tokens == ref.tokens and got.stop_reason == ref.stop_reason == "eos"
    # one-hot sampling (top_k=1): the point-mass rule walks the same branches
    one_hot = SamplingConfig(max_new_tokens=22, temperature=0.9, top_k=1, seed=int(torch.randint(0, 99, ())),
                             stop_ids=())
    assert ScriptedTree(engine, head, WIDE, plain.tokens, want).generate(ids, one_hot).tokens == plain.tokens

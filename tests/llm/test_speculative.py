"""EAGLE-3 style speculative decoding (chain): greedy output identical to plain greedy, whatever the draft
proposes; the sampled path reduces to greedy when the distributions are one-hot."""
import pytest
import torch

from edgefm_ros.generation.generate import GenerationError, SamplingConfig
from edgefm_ros.generation.speculative import (SpeculativeDecoder, TreeShape, build_draft, draft_config_for,
                                            init_draft_weights, load_draft, save_draft)


@pytest.fixture(scope="module")
def draft(engine):
    cfg = draft_config_for(engine, 256, inner=64)
    d2t = torch.randperm(cfg.target_vocab)[:256]
    tensors = init_draft_weights(cfg, engine.lm["decode"].token_embedding, d2t, seed=int(torch.randint(0, 1000, ())))
    return cfg, tensors, build_draft(cfg, tensors, engine.resolvers["decode"])


class Scripted(SpeculativeDecoder):
    """A chain draft that proposes a given continuation (an oracle when it is the greedy answer)."""

    def __init__(self, engine, draft, k, script, wrong=False):
        super().__init__(engine, draft, k)
        self.script, self.wrong = script, wrong

    def _propose(self, tokens, feats, start, s, gen):
        super()._propose(tokens, feats, start, s, gen)  # keep the draft cache bookkeeping exercised
        done = self.engine.cache.length - self.prompt_len  # committed answer tokens, the pending one excluded
        nxt = self.script[done + 1:done + 1 + self.k]
        nxt += [3] * (self.k - len(nxt))
        return [(t + 1) % 49000 if self.wrong else t for t in nxt], None

    def generate(self, prompt, sampling=SamplingConfig(), on_token=None):
        self.prompt_len = len(self.engine.encode(prompt))
        return super().generate(prompt, sampling, on_token)


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_identical_with_any_draft(engine, draft, k):
    _, _, head = draft
    ids = torch.randint(3, 49000, (10,)).tolist()
    s = SamplingConfig(max_new_tokens=20, stop_ids=())
    plain = engine.generate(ids, s)
    spec = SpeculativeDecoder(engine, head, k).generate(ids, s)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert len(spec.tokens) <= 1 + sum(spec.accepted) and all(1 <= a <= k + 1 for a in spec.accepted)
    oracle = Scripted(engine, head, k, plain.tokens).generate(ids, s)
    assert oracle.tokens == plain.tokens
    assert oracle.accepted[:-1] == [k + 1] * (len(oracle.accepted) - 1)  # every draft token accepted
    wrong = Scripted(engine, head, k, plain.tokens, wrong=True).generate(ids, s)
    assert wrong.tokens == plain.tokens and set(wrong.accepted) == {1}


def test_sampled_chain_with_one_hot_distributions_is_greedy(engine, draft):
    """top_k=1 makes target and draft distributions one-hot: the sampling rule must then commit exactly the
    greedy tokens, for any seed (acceptance by min(1, p/q), residual draws, the bonus token)."""
    _, _, head = draft
    ids = torch.randint(3, 49000, (12,)).tolist()
    plain = engine.generate(ids, SamplingConfig(max_new_tokens=16, stop_ids=()))
    seed = int(torch.randint(0, 1 << 30, ()))
    s = SamplingConfig(max_new_tokens=16, temperature=0.8, top_k=1, seed=seed, stop_ids=())
    assert SpeculativeDecoder(engine, head, 3).generate(ids, s).tokens == plain.tokens
    oracle = Scripted(engine, head, 3, plain.tokens).generate(ids, s)  # point-mass chain, all accepted
    assert oracle.tokens == plain.tokens and oracle.accepted[:-1] == [4] * (len(oracle.accepted) - 1)


def test_sampled_chain_is_seeded_and_stays_in_the_support(engine, draft):
    _, _, head = draft
    ids = torch.randint(3, 49000, (12,)).tolist()
    dec = SpeculativeDecoder(engine, head, 3)
    s = SamplingConfig(max_new_tokens=16, temperature=0.7, top_k=5, seed=int(torch.randint(0, 1 << 30, ())),
                       stop_ids=())
    a, b = dec.generate(ids, s), dec.generate(ids, s)
    assert a.tokens == b.tokens and len(a.tokens) == 16
    # every committed token is among the target's top 5 given the committed prefix (teacher-forced check)
    last, _ = engine.prefill(ids, 0)
    steps = [last] + [engine.forward_decode([t])[0][-1] for t in a.tokens[:-1]]
    for tok, lg in zip(a.tokens, steps):
        assert tok in torch.topk(lg, 5).indices.tolist()


def test_speculative_stops_like_plain(engine, draft):
    _, _, head = draft
    ids = torch.randint(3, 49000, (10,)).tolist()
    free = engine.generate(ids, SamplingConfig(max_new_tokens=20, stop_ids=()))
    s = SamplingConfig(max_new_tokens=20, stop_ids=(free.tokens[7],))
    plain = engine.generate(ids, s)
    oracle = Scripted(engine, head, 4, free.tokens).generate(ids, s)  # the stop id arrives inside an accepted run
    assert oracle.tokens == plain.tokens and oracle.stop_reason == plain.stop_reason == "eos"
    streamed = []
    out = SpeculativeDecoder(engine, head, 3).generate(ids, SamplingConfig(max_new_tokens=13, stop_ids=()),
                                                       on_token=lambda t, d: streamed.append(d))
    assert len(out.tokens) == 13 and "".join(streamed) == out.text
    with pytest.raises(ValueError, match="k"):
        SpeculativeDecoder(engine, head, 0)
    with pytest.raises(GenerationError, match="capacity"):
        SpeculativeDecoder(engine, head, tree=TreeShape.best(8)).generate(ids, SamplingConfig(max_new_tokens=240))


def test_draft_file_roundtrip_and_refusal(engine, draft, tmp_path, tied_llama, llama_factory, seed,
                                          tiny_tokenizer_dir):
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    cfg, tensors, head = draft
    path = save_draft(tmp_path / "d.safetensors", cfg, tensors, engine.weights_fp, {"note": "test"})
    loaded = load_draft(path, engine)
    x = torch.randn(1, 5, cfg.text.hidden)
    assert torch.equal(loaded.logits(x), head.logits(x)) and torch.equal(loaded.d2t, head.d2t)
    assert loaded.meta == {"note": "test"}
    # compact form: head rebuilt from the target's embedding rows, fp16 matrices
    small = save_draft(tmp_path / "s.safetensors", cfg, tensors, engine.weights_fp, head_from_target=True, half=True)
    assert small.stat().st_size < 0.6 * path.stat().st_size
    compact = load_draft(small, engine)
    assert torch.equal(compact.d2t, head.d2t)
    assert torch.allclose(compact.logits(x), head.logits(x), rtol=2e-3, atol=2e-3 * float(head.logits(x).abs().max()))
    llama_factory(tmp_path / "other", seed + 3, True, tiny_tokenizer_dir, layers=4)
    other = LlmEngine.from_dir(tmp_path / "other", LlmEngineConfig(capacity=64))
    with pytest.raises(ValueError, match="other target weights"):
        load_draft(path, other)


def test_speculative_with_a_reused_prefix(engine, draft):
    _, _, head = draft
    ids = torch.randint(3, 49000, (24,)).tolist()
    s = SamplingConfig(max_new_tokens=12, stop_ids=())
    engine.use_prefix(None)
    plain = engine.generate(ids, s)
    engine.use_prefix(engine.build_prefix(ids[:16]))
    try:
        for dec in (SpeculativeDecoder(engine, head, 3), SpeculativeDecoder(engine, head, tree=TreeShape.best(6))):
            out = dec.generate(ids, s)
            assert out.prefilled_tokens == 8 and dec.valid_from == 16
            assert out.tokens == plain.tokens
    finally:
        engine.use_prefix(None)

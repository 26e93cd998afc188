"""EAGLE-3 style speculative decoding: greedy output identical to plain greedy, whatever the draft proposes."""
import pytest
import torch

from edgefm_ros.runtime.generate import GenerationError, SamplingConfig
from edgefm_ros.runtime.speculative import (SpeculativeDecoder, build_draft, draft_config_for, init_draft_weights,
                                            load_draft, save_draft)


@pytest.fixture(scope="module")
def draft(engine):
    cfg = draft_config_for(engine, 256, inner=64)
    d2t = torch.randperm(cfg.target_vocab)[:256]
    tensors = init_draft_weights(cfg, engine.lm["decode"].embed, d2t, seed=int(torch.randint(0, 1000, ())))
    return cfg, tensors, build_draft(cfg, tensors, engine.resolvers["decode"])


class Scripted(SpeculativeDecoder):
    """A draft that proposes a given continuation (an oracle when it is the greedy answer)."""

    def __init__(self, engine, draft, k, script, wrong=False):
        super().__init__(engine, draft, k)
        self.script, self.wrong, self.pos = script, wrong, 0

    def _propose(self, tokens, feats, start, k):
        super()._propose(tokens, feats, start, k)  # keep the draft cache bookkeeping exercised
        done = self.engine.cache.length - self.prompt_len  # committed answer tokens, the pending one excluded
        nxt = self.script[done + 1:done + 1 + k]
        nxt += [3] * (k - len(nxt))
        return [(t + 1) % 49000 if self.wrong else t for t in nxt]

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
    with pytest.raises(GenerationError, match="greedy"):
        SpeculativeDecoder(engine, head, 3).generate(ids, SamplingConfig(temperature=0.7))
    with pytest.raises(ValueError, match="k"):
        SpeculativeDecoder(engine, head, 0)


def test_draft_file_roundtrip_and_refusal(engine, draft, tmp_path, tied_llama, llama_factory, seed,
                                          tiny_tokenizer_dir):
    from edgefm_ros.runtime.generate import LlmEngine, LlmEngineConfig

    cfg, tensors, head = draft
    path = save_draft(tmp_path / "d.safetensors", cfg, tensors, engine.weights_fp, {"note": "test"})
    loaded = load_draft(path, engine)
    x = torch.randn(1, 5, cfg.text.hidden)
    assert torch.equal(loaded.logits(x), head.logits(x)) and torch.equal(loaded.d2t, head.d2t)
    llama_factory(tmp_path / "other", seed + 3, True, tiny_tokenizer_dir, layers=4)
    other = LlmEngine.from_dir(tmp_path / "other", LlmEngineConfig(capacity=64))
    with pytest.raises(ValueError, match="other target weights"):
        load_draft(path, other)


def test_training_improves_the_draft(engine):
    from edgefm_ros.tools.train_draft import collect, default_prompts, draft_losses, draft_vocabulary, train

    cfg = draft_config_for(engine, 512, inner=64)
    data = collect(engine, default_prompts(6), 8, cfg.taps, batch=6, log=lambda s: None)
    assert data.tokens.shape[0] == 6 and data.taps.shape[-1] == len(cfg.taps) * cfg.text.hidden
    # the collected continuation is the target's own greedy answer
    row = data.tokens[0][data.valid[0]].tolist()
    prompt = engine.encode(default_prompts(6)[0])
    assert row[:len(prompt)] == prompt
    answer = engine.generate(prompt, SamplingConfig(max_new_tokens=8, stop_ids=())).tokens
    assert row[len(prompt):] == answer[:len(row) - len(prompt)]
    d2t = draft_vocabulary(data, cfg.draft_vocab, engine.eos_ids, cfg.target_vocab)
    t2d = torch.full((cfg.target_vocab,), -100, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    before = build_draft(cfg, init_draft_weights(cfg, engine.lm["decode"].embed, d2t), engine.resolvers["decode"])
    after = build_draft(cfg, train(engine, data, cfg, d2t, steps=20, batch=3, lr=3e-3, log=lambda s: None),
                        engine.resolvers["decode"])
    clone = type(data)(*(x.clone() for x in (data.tokens, data.valid, data.positions, data.taps, data.argmax)))
    with torch.no_grad():
        l0 = draft_losses(before, engine.lm["decode"].embed, clone, torch.arange(6), t2d)[0]
        l1 = draft_losses(after, engine.lm["decode"].embed, clone, torch.arange(6), t2d)[0]
    assert l1 < 0.7 * l0


def test_speculative_with_a_reused_prefix(engine, draft):
    _, _, head = draft
    ids = torch.randint(3, 49000, (24,)).tolist()
    s = SamplingConfig(max_new_tokens=12, stop_ids=())
    engine.use_prefix(None)
    plain = engine.generate(ids, s)
    engine.use_prefix(engine.build_prefix(ids[:16]))
    try:
        spec = SpeculativeDecoder(engine, head, 3)
        out = spec.generate(ids, s)
        assert out.prefilled_tokens == 8 and spec.valid_from == 16
        assert out.tokens == plain.tokens
    finally:
        engine.use_prefix(None)

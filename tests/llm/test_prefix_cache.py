"""Fixed-prefix KV reuse: stored with a fingerprint, reused in constant time, refused when mismatched."""
import json

import pytest
import torch

from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig, SamplingConfig
from edgefm_ros.generation.kv_cache import PrefixMismatch

SYSTEM = [{"role": "system", "content": "You are a careful robot. Answer about the scene in one short sentence."}]


def test_prefix_reuse_gives_the_same_generation(engine, tmp_path):
    prefix_text = engine.tokenizer.render(SYSTEM, add_generation_prompt=False)
    question = SYSTEM + [{"role": "user", "content": "where is the red cube?"}]
    engine.use_prefix(None)
    plain = engine.generate(question, SamplingConfig(max_new_tokens=16, stop_ids=()))
    path = engine.save_prefix(engine.build_prefix(prefix_text), tmp_path / "p.safetensors")
    loaded = engine.load_prefix(path, expect=prefix_text)
    try:
        assert loaded.length == len(engine.encode(prefix_text))
        for _ in range(2):  # the second request reuses the slots the first left in place
            out = engine.generate(question, SamplingConfig(max_new_tokens=16, stop_ids=()))
            assert out.tokens == plain.tokens
            assert out.prefilled_tokens == plain.prompt_tokens - loaded.length
        other = engine.generate("no prefix here", SamplingConfig(max_new_tokens=4, stop_ids=()))
        assert other.prefilled_tokens == other.prompt_tokens  # not starting with the prefix: full prefill
        again = engine.generate(question, SamplingConfig(max_new_tokens=16, stop_ids=()))
        assert again.tokens == plain.tokens  # prefix slots restored after being overwritten
    finally:
        engine.use_prefix(None)


def test_prefix_logits_match_full_prefill(engine):
    ids = torch.randint(3, 49000, (40,)).tolist()
    engine.use_prefix(None)
    full, _ = engine.prefill(ids, 0)
    engine.use_prefix(engine.build_prefix(ids[:30]))
    try:
        _, start, _ = engine.begin(ids, None)
        assert start == 30
        reused, _ = engine.prefill(ids[30:], start)
        assert (reused - full).abs().max() <= 1e-4
    finally:
        engine.use_prefix(None)


def test_mismatched_prefix_is_refused(engine, tmp_path, seed, tiny_tokenizer_dir, llama_factory):
    prefix = engine.build_prefix("You are a robot.")
    path = engine.save_prefix(prefix, tmp_path / "p.safetensors")
    with pytest.raises(PrefixMismatch, match="another prefix"):
        engine.load_prefix(path, expect="You are a cat.")
    other_dir = tmp_path / "other"
    llama_factory(other_dir, seed + 7, True, tiny_tokenizer_dir, layers=4)
    other = LlmEngine.from_dir(other_dir, LlmEngineConfig(capacity=64))
    with pytest.raises(PrefixMismatch, match="other weights"):
        other.load_prefix(path)
    with pytest.raises(ValueError, match="other weights"):
        other.use_prefix(prefix)
    # a tampered token list no longer matches the stored fingerprint
    from safetensors.torch import load_file, save_file

    from edgefm_ros.runtime.safetensors_mmap import MappedSafetensors

    meta = dict(MappedSafetensors(path).metadata)
    meta["tokens"] = json.dumps(json.loads(meta["tokens"])[:-1] + [7])
    save_file(load_file(str(path)), str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(PrefixMismatch, match="fingerprint"):
        engine.load_prefix(tmp_path / "bad.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(PrefixMismatch, match="cannot read"):
        engine.load_prefix(tmp_path / "junk.safetensors")

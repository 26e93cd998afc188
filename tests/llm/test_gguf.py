"""GGUF loading: llama.cpp's Q/K row permutation, and the real SmolLM2-135M-Instruct against transformers."""
import numpy as np
import pytest
import torch

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.generation.gguf_loader import GgufError, read_gguf, unpermute_rows


def test_unpermute_inverts_llama_cpp_permutation():
    heads, half, cols = 3, 4, 5
    w = np.random.default_rng().standard_normal((heads * 2 * half, cols)).astype(np.float32)
    permuted = w.reshape(heads, 2, half, cols).swapaxes(1, 2).reshape(w.shape)  # what llama.cpp's converter stores
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute_rows(permuted, heads), w)


def test_not_a_gguf_file_is_refused(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF but not really" * 4)
    with pytest.raises(GgufError, match="x.gguf"):
        read_gguf(bad)


@pytest.fixture(scope="module")
def real(smollm2_gguf):
    """(our engine, transformers LlamaForCausalLM via transformers' own GGUF reader, its tokenizer)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.modeling_utils import no_init_weights

    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    engine = LlmEngine.from_gguf(smollm2_gguf, LlmEngineConfig(capacity=256))
    meta = load_gguf_checkpoint(str(smollm2_gguf))["config"]
    cfg = LlamaConfig(**{k: v for k, v in meta.items() if k not in ("model_type", "_model_name_or_path")})
    with no_init_weights():
        hf = LlamaForCausalLM(cfg)
    sd = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=True, model_to_load=hf)["tensors"]
    hf.load_state_dict(sd, strict=False)
    hf.tie_weights()
    tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    return engine, hf.eval(), tok


def test_real_smollm2_matches_transformers(real):
    engine, hf, tok = real
    assert engine.model_config.rope_theta == 100000.0 and engine.model_config.tie_embeddings and engine.model_config.text.layers == 30
    msgs = [{"role": "user", "content": "Name two planets and the number 2024."}]
    assert engine.tokenizer.render(msgs) == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = engine.encode(msgs)
    assert ids == tok.apply_chat_template(msgs, add_generation_prompt=True)
    out = engine.generate(msgs, SamplingConfig(max_new_tokens=24))
    assert len(out.tokens) >= 5 and out.text.strip()
    # one transformers pass over prompt + our answer: its logits at the prompt equal ours, and its argmax
    # at every position reproduces our next token (= identical greedy decoding)
    full = torch.tensor([ids + out.tokens])
    with torch.no_grad():
        ref = hf(full).logits[0]
    first, _ = engine.prefill(ids, 0)
    assert (first - ref[len(ids) - 1]).abs().max() <= 1e-4
    steps = [engine.forward_decode([t])[0][-1] for t in out.tokens[:-1]]
    assert (torch.stack(steps) - ref[len(ids):-1]).abs().max() <= 1e-4
    assert ref[len(ids) - 1:-1].argmax(-1).tolist() == out.tokens
    if out.stop_reason == "eos":
        assert int(ref[-1].argmax()) in engine.eos_ids
    assert tok.decode(out.tokens) == out.text

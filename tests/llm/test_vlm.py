"""SmolVLM2 (SigLIP tower + connector + all text layers + lm_head) against transformers on a tiny config."""
import numpy as np
import pytest
import torch

from edgefm_ros.generation.generate import GenerationError, SamplingConfig, causal_mask, run_layers

ATOL = 1e-4


def test_vlm_logits_and_greedy_match_transformers(tiny_vlm):
    path, hf, engine = tiny_vlm
    assert engine.vlm is not None and engine.vlm_config.vlm.image_tokens == 16
    tok = engine.tokenizer
    prompt = engine.tokenizer.render([{"role": "user", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "what is on the table?"}]}])
    assert prompt.startswith("<|im_start|>User:<image>") and prompt.endswith("<end_of_utterance>\nAssistant:")
    image = np.random.default_rng().integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    ids, _, pixels = engine.begin(engine.encode(prompt), [image])
    assert ids.count(tok.token_id("<image>")) == 16 and pixels.shape == (1, 3, 64, 64)
    assert float(pixels.min()) >= -1 and float(pixels.max()) <= 1
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = hf(input_ids=x, pixel_values=pixels[None]).logits[0]
        emb = engine.vlm.embed_inputs(x, pixels)
        h, _ = run_layers(engine.lm["prefill"], emb, torch.arange(len(ids))[None], causal_mask(0, len(ids)),
                          engine.cache, 0)
        ours = engine.lm["prefill"].logits(h)[0]
    assert (ours - ref).abs().max() <= ATOL
    out = engine.generate(prompt, SamplingConfig(max_new_tokens=12, stop_ids=()), images=[image])
    with torch.no_grad():
        gen = hf.generate(input_ids=x, attention_mask=torch.ones_like(x), pixel_values=pixels[None],
                          max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.tokens == gen[0, len(ids):].tolist()
    assert out.prompt_tokens == len(ids)


def test_vlm_bad_image_inputs(tiny_vlm):
    _, _, engine = tiny_vlm
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    with pytest.raises(GenerationError, match="marker"):
        engine.generate("User:<image><image>hi", images=[img])
    with pytest.raises(GenerationError, match="no images"):
        engine.generate("User:<image>hi")
    with pytest.raises(ValueError, match="image 0"):
        engine.generate("User:<image>hi", images=[np.zeros((32, 32), dtype=np.uint8)])

"""Fixtures for the autoregressive path: tiny random Llama / SmolVLM checkpoints saved by transformers.

Weights are drawn fresh every session (seeded from the clock, printed on failure through the fixture
value), so the parity tests compare implementations, not stored numbers.
"""
import json
import random
import shutil

import pytest
import torch

SMOLLM_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                   "{{ '<|im_start|>system\\nYou are a helpful robot assistant.<|im_end|>\\n' }}{% endif %}"
                   "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="session")
def seed() -> int:
    return random.randrange(1 << 30)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(shared_reference):
    return shared_reference / "vlm" / "smolvlm-tiny"


def _save_tokenizer(src, dst, template):
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    cfg = {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "pad_token": "<|im_end|>"}
    if template:
        cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))


def make_llama(path, seed: int, tie: bool, tokenizer_dir, layers: int = 3, init: float = 0.3):
    """A random transformers LlamaForCausalLM (vocab of the tiny tokenizer) saved to ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=49280, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=100000.0,
                      tie_word_embeddings=tie, initializer_range=init, eos_token_id=2, bos_token_id=1,
                      max_position_embeddings=1024, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(cfg).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    _save_tokenizer(tokenizer_dir, path, SMOLLM_TEMPLATE)
    return model


@pytest.fixture(scope="session", params=[True, False], ids=["tied", "untied"])
def tiny_llama(request, tmp_path_factory, seed, tiny_tokenizer_dir):
    """(directory, transformers model) of a random 3-layer Llama."""
    path = tmp_path_factory.mktemp("llama_tied" if request.param else "llama")
    return path, make_llama(path, seed + request.param, request.param, tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tied_llama(tmp_path_factory, seed, tiny_tokenizer_dir):
    path = tmp_path_factory.mktemp("llama_main")
    return path, make_llama(path, seed, True, tiny_tokenizer_dir, layers=4)


@pytest.fixture(scope="session")
def engine(tied_llama):
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    return LlmEngine.from_dir(tied_llama[0], LlmEngineConfig(capacity=256))


@pytest.fixture(scope="session")
def smollm2_gguf():
    from edgefm_ros.generation.gguf_loader import smollm2_gguf_path

    from skips import require_material

    try:
        return smollm2_gguf_path()
    except FileNotFoundError as e:
        require_material(False, f"real SmolLM2-135M weights unavailable: {e}")


@pytest.fixture(scope="session")
def llama_factory():
    """make_llama(path, seed, tie, tokenizer_dir, layers=3): save another random Llama."""
    return make_llama


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory, seed, tiny_tokenizer_dir):
    """(directory, transformers SmolVLMForConditionalGeneration, our engine) of a random tiny SmolVLM2."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    cfg = json.loads((tiny_tokenizer_dir / "config.json").read_text())
    cfg["text_config"].update(initializer_range=0.2, torch_dtype="float32")
    torch.manual_seed(seed)
    model = SmolVLMForConditionalGeneration(SmolVLMConfig.from_dict(cfg)).float().eval()
    path = tmp_path_factory.mktemp("smolvlm")
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tiny_tokenizer_dir / name, path / name)
    from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig

    return path, model, LlmEngine.from_dir(path, LlmEngineConfig(capacity=128))

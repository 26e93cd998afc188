"""The autoregressive engine: SmolLM2 / SmolVLM2 generation over a static KV cache.

    engine = LlmEngine.from_gguf(smollm2_gguf_path())                  # or from_dir(hf_dir)
    out = engine.generate([{"role": "user", "content": "Hi"}], SamplingConfig(max_new_tokens=32),
                          on_token=lambda tok, delta: print(delta, end=""))

prefill: the prompt (or only its suffix after a fixed prefix already in the cache) in one pass;
decode: one token per step. Each phase is its own artifact: the modules are built through the dispatch
tables the Engine uses too (built-ins, the mode's skills, the tuned table: ``resolver.build_resolver``), once
per stage when a record names a stage (otherwise both phases resolve alike and share one build). The KV
cache is allocated once (``capacity`` positions) and stored through the codec the table picks for op_kind
``kv``.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer

from edgefm_ros.dispatch.hardware import detect
from edgefm_ros.dispatch.modes import Mode, check_mode
from edgefm_ros.dispatch.resolver import build_resolver
from edgefm_ros.dispatch.table import STAGES, Record
from edgefm_ros.models.llm import CausalLM, LlmConfig, SmolVLM, SmolVlmConfig
from edgefm_ros.runtime.checkpoint import WeightSource
from edgefm_ros.runtime.preprocess import image_to_chw01, resize_with_pad

from .gguf_loader import TensorSource, gguf_tokenizer, read_gguf
from .kv_cache import PrefixKV, StaticKVCache, load_prefix, prefix_fingerprint, save_prefix, weights_fingerprint

# SmolVLM2's chat format, used when a VLM tokenizer ships no template
SMOLVLM_TEMPLATE = ("<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:{% if m['content'] is string %}"
                    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>"
                    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
                    "{% if add_generation_prompt %}Assistant:{% endif %}")


class GenerationError(ValueError):
    """Bad generation input; the message names the bad value."""


# ---- tokenizer and chat template ------------------------------------------------------------------
class ChatTokenizer:
    """A ``tokenizers.Tokenizer`` plus the checkpoint's chat template (jinja, rendered like transformers)."""

    def __init__(self, tok, chat_template: str | None, bos: str | None = None, eos: str | None = None):
        self.tok, self.chat_template, self.bos, self.eos = tok, chat_template, bos, eos
        self.eos_id = tok.token_to_id(eos) if eos else None

    @classmethod
    def from_dir(cls, d: str | Path, default_template: str | None = None) -> "ChatTokenizer":
        d = Path(d)
        if not (d / "tokenizer.json").is_file():
            raise GenerationError(f"{d}: no tokenizer.json")
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        template = cfg.get("chat_template")
        if template is None and (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text()

        def name(v):
            return v.get("content") if isinstance(v, dict) else v

        return cls(Tokenizer.from_file(str(d / "tokenizer.json")), template or default_template,
                   name(cfg.get("bos_token")), name(cfg.get("eos_token")))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise GenerationError("this tokenizer has no chat template: pass the prompt as text or token ids")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise GenerationError(f"message {i} must be a mapping with 'role' and 'content', got {m!r}")
        # jinja2 is not a dependency of the pip install (transformers brings it): only a chat template needs it
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(messages=list(messages), bos_token=self.bos or "",
                                                          eos_token=self.eos or "",
                                                          add_generation_prompt=add_generation_prompt)


# ---- sampling -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] | None = None  # None: the model's end-of-sequence ids

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if any(not s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_probs(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """logits [..., V] -> what ``pick`` samples from after temperature / top-k / top-p: [..., V] f32, rows
    proportional to the probabilities (not renormalised after top-p). Temperature must be > 0."""
    x = logits.float() / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        kth = torch.topk(x, s.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if s.top_p < 1.0:
        p, idx = torch.sort(probs, dim=-1, descending=True)
        drop = torch.cumsum(p, -1) - p >= s.top_p  # keep the smallest head whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(-1, idx, p.masked_fill(drop, 0.0))
    return probs


def pick(logits: torch.Tensor, s: SamplingConfig, gen: torch.Generator | None) -> int:
    """logits [V] -> next token id: argmax, or a sample after temperature / top-k / top-p."""
    if s.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(sampling_probs(logits, s), 1, generator=gen))


# ---- one pass over the layers ---------------------------------------------------------------------
def causal_mask(start: int, n: int, key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Queries at positions [start, start + n) see keys [0, start + q]: bool [B, n, start + n]."""
    end = start + n
    mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]  # [n, end]
    mask = mask[None]
    return mask if key_valid is None else mask & key_valid[:, None, :end]


def run_layers(lm: CausalLM, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
               cache: StaticKVCache, start: int, taps: Sequence[int] = (), kv_out: list | None = None):
    """x [B, n, H] at cache slots [start, start + n) -> (last hidden [B, n, H], hidden after each tap layer).

    Writes every layer's keys/values into ``cache`` (and appends them to ``kv_out`` when given).
    """
    rope = lm.rope_tables(positions)
    end = start + x.shape[1]
    tapped = []
    for i, layer in enumerate(lm.layers):
        q, k, v = layer.qkv_heads(x, rope)
        cache.write(i, k, v, start)
        if kv_out is not None:
            kv_out.append((k, v))
        kk, vv = cache.read(i, end)
        x = layer.finish(x, layer.attn(q, kk, vv, mask))
        if i in taps:
            tapped.append(x)
    return x, tapped


# ---- the engine -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlmEngineConfig:
    mode: Mode = "exact"
    tables: tuple[str, ...] = ()  # user dispatch tables, loaded after the built-in ones, skills and tuned table
    use_tuned: bool = True  # load config/dispatch/<hw_profile>.yaml in fast mode when present
    kv_codec: str | None = None  # forces an op_kind kv impl (e.g. "int8"); None: the tables decide
    capacity: int = 2048  # KV positions allocated once
    threads: int | None = None

    def __post_init__(self) -> None:
        check_mode(self.mode, what="LlmEngineConfig.mode")
        if not isinstance(self.capacity, int) or self.capacity < 2:
            raise ValueError(f"capacity must be an integer >= 2, got {self.capacity!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        for t in self.tables:
            if not Path(t).is_file():
                raise ValueError(f"dispatch table {t} does not exist")


@dataclass
class Generation:
    tokens: list  # generated ids (a stop id is not included)
    text: str
    stop_reason: str  # "eos" | "stop_string" | "length"
    prompt_tokens: int
    prefilled_tokens: int  # prompt tokens actually computed (fewer when a prefix was reused)
    ttft_s: float  # call -> first token chosen
    decode_s: float  # first token -> last token
    accepted: list | None = None  # speculative decoding: tokens committed per target pass

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


class _Stream:
    """Incremental detokenisation for streaming; holds back text a stop string may still claim."""

    def __init__(self, tokenizer: ChatTokenizer, stops: Sequence[str], callback):
        self.tok, self.stops, self.callback = tokenizer, tuple(stops), callback
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.sent = 0
        self.text = ""

    def push(self, ids: list) -> bool:
        """Decode ``ids``; True when a stop string appeared (text is cut before it)."""
        self.text = self.tok.decode(ids)
        cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            return True
        return False

    def emit(self, token: int, final: bool) -> None:
        if self.callback is None:
            return
        upto = len(self.text) if final else len(self.text) - self.hold
        if not final and self.text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its bytes
            upto = min(upto, len(self.text) - 1)
        delta = self.text[self.sent:upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        self.callback(token, delta)


class LlmEngine:
    """Prefill/decode of a causal LM (optionally with SmolVLM2's vision prefill) over a static KV cache."""

    def __init__(self, cfg: LlmConfig, weights, tokenizer: ChatTokenizer, config: LlmEngineConfig,
                 model_name: str, vlm: SmolVlmConfig | None = None, fingerprint_file: Path | None = None):
        self.model_config, self.tokenizer, self.config, self.vlm_config = cfg, tokenizer, config, vlm  # model vs engine configs
        self.weights, self._fp_file, self._weights_fp = weights, fingerprint_file, None
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.hardware = detect("cpu")
        forced = [Record(impl_id=config.kv_codec, op_kind="kv", source="kv_codec option")] if config.kv_codec else []
        base = build_resolver(config.mode, self.hardware.profile, model_name, lambda role: "prefill", config.tables,
                              config.use_tuned, forced)
        self.resolvers = {s: base.restaged(lambda role, s=s: s) for s in STAGES}
        # one artifact per phase; when no record names a stage both would be the same: build it once
        split = any(r.stage not in ("", "*") for r in base.table.records)
        root = weights.scoped("")
        with torch.no_grad():
            if vlm is not None:
                self.vlm = SmolVLM(vlm, self.resolvers["prefill"], root).eval()
                decode = CausalLM(cfg, self.resolvers["decode"], root.scoped("model.text_model."), root).eval() \
                    if split else self.vlm.lm
                self.lm = {"prefill": self.vlm.lm, "decode": decode}
            else:
                self.vlm = None
                decode = CausalLM(cfg, self.resolvers["decode"], root.scoped("model."), root).eval()
                prefill = CausalLM(cfg, self.resolvers["prefill"], root.scoped("model."), root).eval() \
                    if split else decode
                self.lm = {"prefill": prefill, "decode": decode}
        weights.check_all_used()
        t = cfg.text
        self.codec = self.resolvers["decode"].build("kv", "llm.kv_cache", "llm_kv", f"h{t.kv_heads}xd{t.head_dim}",
                                                    {"kv_heads": t.kv_heads, "head_dim": t.head_dim})
        self.cache = StaticKVCache(self.codec, t.layers, 1, t.kv_heads, config.capacity, t.head_dim)
        self.prefix: PrefixKV | None = None
        self._prefix_live = False  # the prefix's keys/values are in cache slots [0, P)
        eos = set(cfg.eos_ids)
        for name in (tokenizer.eos, "<|im_end|>", "<end_of_utterance>"):
            i = tokenizer.token_id(name) if name else None
            if i is not None:
                eos.add(i)
        self.eos_ids = tuple(sorted(eos))

    # ---- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str | Path, config: LlmEngineConfig = LlmEngineConfig()) -> "LlmEngine":
        m = read_gguf(path)
        eos = m.tokens[m.eos_id] if m.eos_id is not None else None
        bos = m.tokens[m.bos_id] if m.bos_id is not None else None
        tok = ChatTokenizer(gguf_tokenizer(m), m.chat_template, bos, eos)
        return cls(m.config, TensorSource(m.tensors, str(path)), tok, config, "smollm2",
                   fingerprint_file=Path(path))

    @classmethod
    def from_dir(cls, d: str | Path, config: LlmEngineConfig = LlmEngineConfig()) -> "LlmEngine":
        """A transformers directory: config.json, model.safetensors, tokenizer files (SmolLM2 or SmolVLM2)."""
        d = Path(d)
        raw = json.loads((d / "config.json").read_text())
        weights = WeightSource(d / "model.safetensors")
        if raw.get("model_type") in ("smolvlm", "idefics3"):
            vlm = SmolVlmConfig.from_dict(raw, str(d / "config.json"))
            tok = ChatTokenizer.from_dir(d, SMOLVLM_TEMPLATE)
            return cls(vlm.llm, weights, tok, config, "smolvlm2", vlm, d / "model.safetensors")
        cfg = LlmConfig.from_dict(raw, str(d / "config.json"))
        return cls(cfg, weights, ChatTokenizer.from_dir(d), config, "smollm2", fingerprint_file=d / "model.safetensors")

    # ---- fingerprints and the fixed prefix ------------------------------------------------------
    @property
    def weights_fp(self) -> str:
        if self._weights_fp is None:
            if self._fp_file is not None:
                h = hashlib.sha256()
                with open(self._fp_file, "rb") as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        h.update(block)
                self._weights_fp = h.hexdigest()
            else:
                self._weights_fp = weights_fingerprint(self.weights.named())
        return self._weights_fp

    @property
    def model_sig(self) -> str:
        return repr((self.model_config, self.vlm_config is not None))

    @torch.inference_mode()
    def build_prefix(self, prefix: str | Sequence[int]) -> PrefixKV:
        """Prefill a fixed prefix (text or ids) from position 0 and return its keys/values."""
        ids = self.encode(prefix)
        kv: list = []
        x = self.lm["prefill"].embed_tokens(torch.tensor([ids]))
        run_layers(self.lm["prefill"], x, torch.arange(len(ids))[None], causal_mask(0, len(ids)), self.cache, 0,
                   kv_out=kv)
        self.cache.length = 0
        self._prefix_live = False
        kv = [(k.clone(), v.clone()) for k, v in kv]
        return PrefixKV(tuple(ids), kv, prefix_fingerprint(self.weights_fp, ids, self.model_sig), self.weights_fp)

    def use_prefix(self, prefix: PrefixKV | None) -> None:
        """Keep ``prefix`` in cache slots [0, P): later prompts that start with it prefill only the rest."""
        if prefix is not None:
            if prefix.weights_fp != self.weights_fp or prefix.fingerprint != prefix_fingerprint(
                    self.weights_fp, prefix.token_ids, self.model_sig):
                raise ValueError("prefix cache was built for other weights or another model: rebuild it")
            if prefix.length + 1 >= self.config.capacity:
                raise ValueError(f"prefix of {prefix.length} tokens does not fit the KV capacity "
                                 f"{self.config.capacity}")
        self.prefix, self._prefix_live = prefix, False

    def save_prefix(self, prefix: PrefixKV, path: str | Path) -> Path:
        return save_prefix(path, prefix)

    def load_prefix(self, path: str | Path, expect: str | Sequence[int] | None = None) -> PrefixKV:
        """Read a stored prefix, refuse it unless made for these weights (and ``expect``), then use it."""
        ids = None if expect is None else self.encode(expect)
        prefix = load_prefix(path, self.weights_fp, self.model_sig, ids)
        self.use_prefix(prefix)
        return prefix

    def _restore_prefix(self) -> None:
        for i, (k, v) in enumerate(self.prefix.kv):
            self.cache.write(i, k, v, 0)
        self._prefix_live = True

    # ---- prompts ---------------------------------------------------------------------------------
    def encode(self, prompt) -> list[int]:
        """Text, chat messages (list of {role, content}) or token ids -> ids."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, Mapping) for m in prompt):
            ids = self.tokenizer.encode(self.tokenizer.render(prompt))
        elif isinstance(prompt, (Sequence, np.ndarray, torch.Tensor)):
            ids = [int(i) for i in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
            bad = [i for i in ids if not 0 <= i < self.model_config.text.vocab]
            if bad:
                raise GenerationError(f"token id(s) {bad[:5]} outside the vocabulary [0, {self.model_config.text.vocab})")
        else:
            raise GenerationError(f"prompt must be text, chat messages or token ids, got {type(prompt).__name__}")
        if not ids:
            raise GenerationError(f"prompt {prompt!r} is empty after tokenisation")
        return ids

    def expand_images(self, ids: list[int], n_images: int) -> list[int]:
        """Each ``<image>`` id -> SmolVLM2's block: <fake_token_around_image><global-img><image>*T<fake...>."""
        tid = self.vlm_config.image_token_id
        if ids.count(tid) != n_images:
            raise GenerationError(f"prompt holds {ids.count(tid)} <image> marker(s) for {n_images} image(s)")
        fake, glob = self.tokenizer.token_id("<fake_token_around_image>"), self.tokenizer.token_id("<global-img>")
        block = [fake, glob] + [tid] * self.vlm_config.vlm.image_tokens + [fake]
        if None in block:
            raise GenerationError("tokenizer lacks <fake_token_around_image> / <global-img>")
        out = []
        for i in ids:
            out.extend(block if i == tid else [i])
        return out

    def pixels(self, images: Sequence) -> torch.Tensor:
        """uint8 HxWx3 RGB / float32 3xHxW [0, 1] images -> [N, 3, S, S] in [-1, 1] (aspect kept, padded)."""
        s = self.vlm_config.vlm.vision.image_size
        out = [resize_with_pad(image_to_chw01(f"image {i}", img)[None], s, s) for i, img in enumerate(images)]
        return torch.cat(out) * 2.0 - 1.0

    # ---- phases ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], start: int, pixels: torch.Tensor | None = None,
                taps: Sequence[int] = ()):
        """Prompt ids at slots [start, ...) -> (logits of the last position [V], taps [1, n, H] each)."""
        n = len(ids)
        t = torch.tensor([list(ids)])
        lm = self.lm["prefill"]
        x = self.vlm.embed_inputs(t, pixels) if self.vlm is not None else lm.embed_tokens(t)
        h, tapped = run_layers(lm, x, torch.arange(start, start + n)[None], causal_mask(start, n), self.cache,
                               start, taps)
        self.cache.length = start + n
        return lm.logits(h[:, -1:])[0, -1], tapped

    @torch.inference_mode()
    def forward_decode(self, ids: Sequence[int], taps: Sequence[int] = (), positions: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None):
        """Tokens at the next slots (decode artifact) -> (logits [n, V], taps); advances ``cache.length``.

        ``positions`` [n] i64 (rotary positions; default: the slots) and ``mask`` bool [1, n, start + n]
        (default: causal) let a token tree be verified in one pass (see ``speculative.tree``)."""
        n, start = len(ids), self.cache.length
        lm = self.lm["decode"]
        x = lm.embed_tokens(torch.tensor([list(ids)]))
        if mask is None and n > 1:
            mask = causal_mask(start, n)
        pos = torch.arange(start, start + n) if positions is None else positions
        h, tapped = run_layers(lm, x, pos[None], mask, self.cache, start, taps)
        self.cache.length = start + n
        return lm.logits(h)[0], tapped

    def begin(self, ids: list[int], images: Sequence | None):
        """Place the prompt: reuse the fixed prefix when the prompt starts with it; -> (ids, start, pixels)."""
        pixels = None
        if images:
            if self.vlm is None:
                raise GenerationError("images given to a text-only model")
            ids = self.expand_images(ids, len(images))
            pixels = self.pixels(images)
        elif self.vlm is not None and self.vlm_config.image_token_id in ids:
            raise GenerationError("prompt holds <image> markers but no images were given")
        start = 0
        p = self.prefix
        if p is not None and pixels is None and len(ids) > p.length and tuple(ids[:p.length]) == p.token_ids:
            if not self._prefix_live:
                self._restore_prefix()
            start = p.length
        else:
            self._prefix_live = False  # slots [0, P) are about to be overwritten
        return ids, start, pixels

    def stop_ids(self, s: SamplingConfig) -> tuple[int, ...]:
        return self.eos_ids if s.stop_ids is None else tuple(s.stop_ids)

    @torch.inference_mode()
    def generate(self, prompt, sampling: SamplingConfig = SamplingConfig(),
                 on_token: Callable[[int, str], None] | None = None, images: Sequence | None = None) -> Generation:
        """Generate from text / chat messages / ids (with ``<image>`` markers and ``images`` for SmolVLM2).

        ``on_token(token_id, text_delta)`` is called for every generated token (streaming)."""
        t0 = time.perf_counter()
        ids, start, pixels = self.begin(self.encode(prompt), images)
        if len(ids) + sampling.max_new_tokens > self.config.capacity:
            raise GenerationError(f"prompt of {len(ids)} tokens + max_new_tokens {sampling.max_new_tokens} exceeds "
                                  f"the KV capacity {self.config.capacity}")
        gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        logits, _ = self.prefill(ids[start:], start, pixels)
        stops, stream = self.stop_ids(sampling), _Stream(self.tokenizer, sampling.stop_strings, on_token)
        out: list[int] = []
        ttft, t1, reason = 0.0, t0, "length"
        while True:
            tok = pick(logits, sampling, gen)
            if not out:
                t1 = time.perf_counter()
                ttft = t1 - t0
            if tok in stops:
                reason = "eos"
                stream.emit(tok, True)
                break
            out.append(tok)
            if stream.push(out):
                reason = "stop_string"
                stream.emit(tok, True)
                break
            if len(out) >= sampling.max_new_tokens:
                stream.emit(tok, True)
                break
            stream.emit(tok, False)
            logits = self.forward_decode([tok])[0][-1]
        return Generation(out, stream.text, reason, len(ids), len(ids) - start, ttft, time.perf_counter() - t1)

    def plan(self) -> list[dict]:
        return [r for s in STAGES for r in self.resolvers[s].plan_rows()]

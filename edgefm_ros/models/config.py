"""Inference configs: SmolVLA (from a LeRobot config.json) and its VLM backbone (from config.json).

Only what inference needs is kept; training settings in LeRobot's file are ignored. Every value is
checked at construction and a bad one raises ValueError naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


# SmolVLM vision position-id conventions (models/siglip.patch_position_ids) and what a user may ask for
# ("auto": the checkpoint's record, runtime/checkpoint.resolve_vision_position_ids). Kept here, free of torch,
# for the parameter and settings modules that validate the choice.
VISION_POSITION_IDS = ("legacy", "fixed")
VISION_POSITION_ID_CHOICES = ("auto",) + VISION_POSITION_IDS


def _need(d: Mapping[str, Any], key: str, where: str):
    if key not in d:
        raise ValueError(f"{where}: missing key {key!r}")
    return d[key]


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class VisionConfig:
    hidden: int
    inner: int
    layers: int
    heads: int
    image_size: int
    patch: int
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for k in ("hidden", "inner", "layers", "heads", "image_size", "patch"):
            _positive(f"vision_config.{k}", getattr(self, k))
        if self.hidden % self.heads:
            raise ValueError(f"vision hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.image_size % self.patch:
            raise ValueError(f"vision image_size {self.image_size} is not a multiple of patch {self.patch}")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch


@dataclass(frozen=True)
class TextConfig:
    hidden: int
    inner: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for k in ("hidden", "inner", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            _positive(f"text_config.{k}", getattr(self, k))
        if self.heads % self.kv_heads:
            raise ValueError(f"text heads {self.heads} not a multiple of kv_heads {self.kv_heads}")


@dataclass(frozen=True)
class VlmConfig:
    vision: VisionConfig
    text: TextConfig
    scale_factor: int  # pixel-shuffle factor of the connector

    def __post_init__(self) -> None:
        _positive("scale_factor", self.scale_factor)
        if self.vision.grid % self.scale_factor:
            raise ValueError(f"vision grid {self.vision.grid} not divisible by scale_factor {self.scale_factor}")

    @property
    def image_tokens(self) -> int:
        return (self.vision.grid // self.scale_factor) ** 2

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config.json") -> "VlmConfig":
        if d.get("model_type") not in ("smolvlm", "idefics3"):
            raise ValueError(f"{where}: unknown backbone model_type {d.get('model_type')!r}; "
                             "SmolVLA needs a SmolVLM/Idefics3 config")
        v, t = _need(d, "vision_config", where), _need(d, "text_config", where)
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"{where}: vision hidden_act {act!r} unsupported (need gelu_pytorch_tanh)")
        vision = VisionConfig(hidden=v.get("hidden_size", 768), inner=v.get("intermediate_size", 3072),
                              layers=v.get("num_hidden_layers", 12), heads=v.get("num_attention_heads", 12),
                              image_size=v.get("image_size", 224), patch=v.get("patch_size", 32),
                              eps=float(v.get("layer_norm_eps", 1e-6)))
        hidden, heads = _need(t, "hidden_size", where), _need(t, "num_attention_heads", where)
        text = TextConfig(hidden=hidden, inner=_need(t, "intermediate_size", where),
                          layers=_need(t, "num_hidden_layers", where), heads=heads,
                          kv_heads=t.get("num_key_value_heads", heads), head_dim=t.get("head_dim", hidden // heads),
                          vocab=t.get("vocab_size", d.get("vocab_size", 0)), eps=float(t.get("rms_norm_eps", 1e-5)))
        if t.get("attention_bias") or t.get("mlp_bias"):
            raise ValueError(f"{where}: text attention/MLP biases are not supported")
        return cls(vision, text, int(d.get("scale_factor", 2)))


def expert_inner(hidden: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """LeRobot's action-expert MLP width for an expert of width ``hidden``."""
    h = int(multiplier * int(2 * hidden / 3))
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class SmolVLAConfig:
    """The inference-relevant part of LeRobot's SmolVLAConfig."""

    camera_keys: tuple[str, ...]
    image_shapes: tuple[tuple[int, int, int], ...]  # raw (3, H, W) per camera, from input_features
    state_key: str
    state_dim: int
    action_dim: int
    chunk_size: int
    num_steps: int
    max_state_dim: int
    max_action_dim: int
    resize: tuple[int, int]  # (H, W) of resize_imgs_with_padding
    tokenizer_max_length: int
    num_vlm_layers: int
    expert_width_multiplier: float
    self_attn_every_n_layers: int
    min_period: float
    max_period: float
    vlm_model_name: str
    pad_language_to: str = "longest"
    empty_cameras: int = 0

    def __post_init__(self) -> None:
        for k in ("state_dim", "action_dim", "chunk_size", "num_steps", "max_state_dim", "max_action_dim",
                  "tokenizer_max_length", "num_vlm_layers", "self_attn_every_n_layers"):
            _positive(k, getattr(self, k))
        if not self.camera_keys:
            raise ValueError("config.json input_features has no VISUAL feature (no camera)")
        if self.state_dim > self.max_state_dim:
            raise ValueError(f"state_dim {self.state_dim} exceeds max_state_dim {self.max_state_dim}")
        if self.action_dim > self.max_action_dim:
            raise ValueError(f"action_dim {self.action_dim} exceeds max_action_dim {self.max_action_dim}")
        if self.pad_language_to not in ("longest", "max_length"):
            raise ValueError(f"pad_language_to {self.pad_language_to!r} unsupported")
        if not 0 < self.min_period < self.max_period:
            raise ValueError(f"need 0 < min_period < max_period, got {self.min_period}, {self.max_period}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config.json") -> "SmolVLAConfig":
        if d.get("type") != "smolvla":
            raise ValueError(f"{where}: policy type {d.get('type')!r} is not 'smolvla'")
        feats = _need(d, "input_features", where)
        cams = [(k, f) for k, f in feats.items() if f.get("type") == "VISUAL"]
        states = [(k, f) for k, f in feats.items() if f.get("type") == "STATE"]
        if len(states) != 1:
            raise ValueError(f"{where}: expected one STATE input feature, found {[k for k, _ in states]}")
        out = _need(d, "output_features", where)
        acts = [f for f in out.values() if f.get("type") == "ACTION"]
        if len(acts) != 1:
            raise ValueError(f"{where}: expected one ACTION output feature, found {list(out)}")
        mode = d.get("attention_mode", "cross_attn")
        if mode != "cross_attn":
            raise ValueError(f"{where}: attention_mode {mode!r} unsupported (need 'cross_attn')")
        n_expert = d.get("num_expert_layers", -1)
        n_vlm = _need(d, "num_vlm_layers", where)
        if n_expert not in (-1, n_vlm):
            raise ValueError(f"{where}: num_expert_layers {n_expert} != num_vlm_layers {n_vlm} is unsupported")
        if d.get("add_image_special_tokens"):
            raise ValueError(f"{where}: add_image_special_tokens=true is unsupported")
        if d.get("prefix_length", -1) not in (-1, None):
            raise ValueError(f"{where}: prefix_length {d.get('prefix_length')} is unsupported (need -1)")
        resize = d.get("resize_imgs_with_padding")
        if not resize or len(resize) != 2:
            raise ValueError(f"{where}: resize_imgs_with_padding must be [H, W], got {resize!r}")
        return cls(
            camera_keys=tuple(k for k, _ in cams),
            image_shapes=tuple(tuple(f.get("shape", (3, 0, 0))) for _, f in cams),
            state_key=states[0][0], state_dim=int(states[0][1]["shape"][0]), action_dim=int(acts[0]["shape"][0]),
            chunk_size=_need(d, "chunk_size", where), num_steps=_need(d, "num_steps", where),
            max_state_dim=d.get("max_state_dim", 32), max_action_dim=d.get("max_action_dim", 32),
            resize=tuple(resize), tokenizer_max_length=d.get("tokenizer_max_length", 48),
            num_vlm_layers=n_vlm, expert_width_multiplier=float(d.get("expert_width_multiplier", 0.75)),
            self_attn_every_n_layers=d.get("self_attn_every_n_layers", 2),
            min_period=float(d.get("min_period", 4e-3)), max_period=float(d.get("max_period", 4.0)),
            vlm_model_name=_need(d, "vlm_model_name", where), pad_language_to=d.get("pad_language_to", "longest"),
            empty_cameras=int(d.get("empty_cameras", 0)))

    def is_cross_layer(self, i: int) -> bool:
        """Expert layer i cross-attends to the VLM cache (else it self-attends over prefix + actions)."""
        return i % self.self_attn_every_n_layers != 0

"""Deterministic random-weight SmolVLA checkpoints in LeRobot's layout (``edgefm-vla make-checkpoint``: the
demo's embedded model, the tests' models), and the layout writers training's export uses too.

The weights are RANDOM (seeded): the model runs the real SmolVLA computation but its actions mean
nothing. Every file written says so (config ``tags``, ``README.md``). The backbone directory (config,
a small byte-level BPE tokenizer trained here on a fixed corpus) is written next to it and named in
``config.json``'s ``vlm_model_name`` by path, so the checkpoint is self-contained.

The architectures are training's (recipe.ARCHS). Their ``chunk_size`` is training's default; a random
checkpoint takes its chunk size from the caller instead, SmolVLA's 50 unless told (the demo checkpoint and
the tests' random-weight checkpoints were always made with 50).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from edgefm_ros.models.config import SmolVLAConfig, VlmConfig, expert_inner
from edgefm_ros.runtime.checkpoint import write_numerics

from .recipe import ARCHS

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Pick up the red cube and place it in the blue bowl.", "Open the drawer.", "Close the drawer.",
    "Push the green block to the left.", "Stack the yellow cube on the red cube.", "Put the cup on the plate.",
    "Move the arm to the home position.", "Grasp the bottle and lift it 10 cm.", "Wipe the table.",
    "Pour the water into the glass.", "Hand me the screwdriver.", "Sort the blocks by color.",
] * 4

# SmolVLA's action chunk: a random-weight checkpoint's, unless its caller asks for another (recipe.ARCHS'
# chunk_size is training's default, 16 for the tiny)
CHUNK_SIZE = 50


def write_tokenizer(out: Path, extra_corpus: Sequence[str] = ()) -> int:
    """A byte-level BPE trained on CORPUS (+ ``extra_corpus``, e.g. a dataset's instructions, so they
    become few tokens). Returns the vocabulary size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS + list(extra_corpus) * 4, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|im_end|>", "bos_token": "<|im_start|>",
         "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "truncation_side": "left"}, indent=2))
    return tok.get_vocab_size()


def write_vlm_dir(vdir: Path, arch: dict, extra_corpus: Sequence[str] = ()) -> dict:
    """The backbone directory of ``arch``: config.json + tokenizer files. Returns the config dict."""
    vdir.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(vdir, extra_corpus)
    vlm_dict = {"model_type": "smolvlm", "scale_factor": arch["scale_factor"], "vocab_size": vocab,
                "vision_config": {**arch["vision"], "model_type": "smolvlm_vision"},
                "text_config": {**arch["text"], "model_type": "llama", "vocab_size": vocab, "rms_norm_eps": 1e-5}}
    (vdir / "config.json").write_text(json.dumps(vlm_dict, indent=2))
    return vlm_dict


def write_processors(out: Path, stats: dict[str, dict[str, torch.Tensor]], eps: float = 1e-8,
                     policy: dict | None = None) -> None:
    """policy_{pre,post}processor.json + their stats files, LeRobot's layout (MEAN_STD state/action).

    ``stats``: feature key -> {"mean", "std", ... (min/max kept when given)} float32 tensors.
    ``policy``: the checkpoint's config.json dict; given, the files hold LeRobot's whole SmolVLA pipeline
    (rename, batch, newline, tokenizer, device, normalizer with its features) so LeRobot's
    ``PolicyProcessorPipeline.from_pretrained`` loads them too; else only the (un)normalizer steps."""
    stats = {k: {n: v.float().contiguous() for n, v in s.items()} for k, s in stats.items()}
    flat = {f"{k}.{n}": v for k, s in stats.items() for n, v in s.items()}
    norm = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    pre_steps, norm_cfg, post_cfg = [], {"eps": eps, "norm_map": norm}, {"eps": eps, "norm_map": norm}
    if policy is not None:
        pre_steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                     {"registry_name": "to_batch_processor", "config": {}},
                     {"registry_name": "smolvla_new_line_processor", "config": {}},
                     {"registry_name": "tokenizer_processor", "config": {
                         "max_length": policy["tokenizer_max_length"], "task_key": "task", "padding_side": "right",
                         "padding": policy.get("pad_language_to", "longest"), "truncation": True,
                         "tokenizer_name": policy["vlm_model_name"]}},
                     {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]
        norm_cfg = {"eps": eps, "features": {**policy["input_features"], **policy["output_features"]}, "norm_map": norm}
        post_cfg = {"eps": eps, "features": dict(policy["output_features"]), "norm_map": norm}
    pre_file = f"policy_preprocessor_step_{len(pre_steps)}_normalizer_processor.safetensors"
    post_file = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    save_file(flat, str(out / pre_file))
    save_file({k: v for k, v in flat.items() if k.startswith("action.")}, str(out / post_file))
    post_steps = [{"registry_name": "unnormalizer_processor", "config": post_cfg, "state_file": post_file}]
    if policy is not None:
        post_steps.append({"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}})
    (out / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": pre_steps + [
        {"registry_name": "normalizer_processor", "config": norm_cfg, "state_file": pre_file}]}, indent=2))
    (out / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": post_steps},
                                                              indent=2))


def policy_config(arch: dict, vlm_name: str, cameras: list[str], raw_hw: tuple[int, int], dim: int,
                  chunk_size: int) -> dict:
    """config.json of ``arch`` with ``chunk_size`` actions per chunk (all executed: n_action_steps)."""
    feats = {c: {"type": "VISUAL", "shape": [3, *raw_hw]} for c in cameras}
    feats["observation.state"] = {"type": "STATE", "shape": [dim]}
    return {"type": "smolvla", "n_obs_steps": 1, "input_features": feats,
            "output_features": {"action": {"type": "ACTION", "shape": [dim]}}, "device": "cpu",
            "tags": ["random-weights", "edgefm-demo"], "chunk_size": chunk_size,
            "n_action_steps": chunk_size,
            "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
            "max_state_dim": 32, "max_action_dim": 32, "resize_imgs_with_padding": arch["resize"], "empty_cameras": 0,
            "tokenizer_max_length": 48, "num_steps": arch["num_steps"], "use_cache": True,
            "vlm_model_name": vlm_name, "load_vlm_weights": False, "add_image_special_tokens": False,
            "attention_mode": "cross_attn", "prefix_length": -1, "pad_language_to": "longest",
            "num_expert_layers": -1, "num_vlm_layers": arch["num_vlm_layers"], "self_attn_every_n_layers": 2,
            "expert_width_multiplier": 0.75, "min_period": 0.004, "max_period": 4.0}


def random_weights(cfg: SmolVLAConfig, vlm: VlmConfig, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    v, t = vlm.vision, vlm.text
    he = int(t.hidden * cfg.expert_width_multiplier)
    shapes: dict[str, tuple[int, ...]] = {}
    vp = "model.vlm_with_expert.vlm.model.vision_model."
    shapes[vp + "embeddings.patch_embedding.weight"] = (v.hidden, 3, v.patch, v.patch)
    shapes[vp + "embeddings.patch_embedding.bias"] = (v.hidden,)
    shapes[vp + "embeddings.position_embedding.weight"] = (v.grid * v.grid, v.hidden)
    for i in range(v.layers):
        p = f"{vp}encoder.layers.{i}."
        for n in ("q", "k", "v", "out"):
            shapes[f"{p}self_attn.{n}_proj.weight"], shapes[f"{p}self_attn.{n}_proj.bias"] = (v.hidden, v.hidden), (v.hidden,)
        for n in ("layer_norm1", "layer_norm2"):
            shapes[f"{p}{n}.weight"], shapes[f"{p}{n}.bias"] = (v.hidden,), (v.hidden,)
        shapes[f"{p}mlp.fc1.weight"], shapes[f"{p}mlp.fc1.bias"] = (v.inner, v.hidden), (v.inner,)
        shapes[f"{p}mlp.fc2.weight"], shapes[f"{p}mlp.fc2.bias"] = (v.hidden, v.inner), (v.hidden,)
    shapes[vp + "post_layernorm.weight"] = shapes[vp + "post_layernorm.bias"] = (v.hidden,)
    shapes["model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight"] = (
        t.hidden, v.hidden * vlm.scale_factor ** 2)
    tp = "model.vlm_with_expert.vlm.model.text_model."
    shapes[tp + "embed_tokens.weight"] = (t.vocab, t.hidden)
    shapes[tp + "norm.weight"] = (t.hidden,)

    def llama(prefix, hidden, inner, kv_in):
        shapes[prefix + "self_attn.q_proj.weight"] = (t.heads * t.head_dim, hidden)
        shapes[prefix + "self_attn.k_proj.weight"] = (t.kv_heads * t.head_dim, kv_in)
        shapes[prefix + "self_attn.v_proj.weight"] = (t.kv_heads * t.head_dim, kv_in)
        shapes[prefix + "self_attn.o_proj.weight"] = (hidden, t.heads * t.head_dim)
        shapes[prefix + "mlp.gate_proj.weight"] = shapes[prefix + "mlp.up_proj.weight"] = (inner, hidden)
        shapes[prefix + "mlp.down_proj.weight"] = (hidden, inner)
        shapes[prefix + "input_layernorm.weight"] = shapes[prefix + "post_attention_layernorm.weight"] = (hidden,)

    for i in range(cfg.num_vlm_layers):
        llama(f"{tp}layers.{i}.", t.hidden, t.inner, t.hidden)
        cross = cfg.is_cross_layer(i)
        llama(f"model.vlm_with_expert.lm_expert.layers.{i}.", he, expert_inner(he),
              t.kv_heads * t.head_dim if cross else he)
    shapes["model.vlm_with_expert.lm_expert.norm.weight"] = (he,)
    for name, (o, i) in {"state_proj": (t.hidden, cfg.max_state_dim), "action_in_proj": (he, cfg.max_action_dim),
                         "action_out_proj": (cfg.max_action_dim, he), "action_time_mlp_in": (he, 2 * he),
                         "action_time_mlp_out": (he, he)}.items():
        shapes[f"model.{name}.weight"], shapes[f"model.{name}.bias"] = (o, i), (o,)
    out = {}
    for key in sorted(shapes):
        shape = shapes[key]
        if key.endswith("norm.weight") or "layernorm.weight" in key or "layer_norm" in key and key.endswith("weight"):
            out[key] = 1.0 + 0.05 * torch.randn(shape, generator=g)
        elif key.endswith("bias"):
            out[key] = 0.02 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[1] if len(shape) == 2 else int(torch.tensor(shape[1:]).prod())
            out[key] = torch.randn(shape, generator=g) / fan_in ** 0.5
    return out


def make_checkpoint(out: str | Path, arch: str = "tiny", seed: int = 0, cameras: int = 2,
                    raw_hw: tuple[int, int] = (480, 640), dim: int = 6, chunk_size: int = CHUNK_SIZE) -> Path:
    """Write ``out/`` (the checkpoint) and ``out/vlm/`` (its backbone files). Returns ``out``. ``arch``: a
    name of recipe.ARCHS; ``chunk_size``: actions per chunk (not the arch's training default)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    if not 1 <= cameras <= 8:
        raise ValueError(f"cameras must be in 1..8, got {cameras}")
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    a = ARCHS[arch]
    out = Path(out)
    vlm_dict = write_vlm_dir(out / "vlm", a)
    cams = [f"observation.images.camera{i + 1}" for i in range(cameras)]
    pcfg = policy_config(a, "vlm", cams, raw_hw, dim, chunk_size)  # relative: resolved next to the checkpoint
    (out / "config.json").write_text(json.dumps(pcfg, indent=2))
    cfg, vlm = SmolVLAConfig.from_dict(pcfg), VlmConfig.from_dict(vlm_dict)
    save_file(random_weights(cfg, vlm, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    mean = torch.linspace(-0.5, 0.5, dim)
    std = torch.linspace(0.5, 1.5, dim)
    write_processors(out, {"observation.state": {"mean": mean + 0.1, "std": std.clone()},
                           "action": {"mean": mean - 0.1, "std": std}})
    (out / "README.md").write_text(
        f"# edgefm_ros demo checkpoint ({arch}, seed {seed})\n\nRANDOM WEIGHTS: generated by `edgefm-vla "
        f"make-checkpoint`; it runs SmolVLA's computation but its actions are meaningless. For real control, "
        f"pass a trained LeRobot SmolVLA checkpoint.\n")
    # untrained: no convention is "right"; record today's LeRobot one so loading it needs no guess
    write_numerics(out, "fixed", written_by="edgefm-vla make-checkpoint")
    return out

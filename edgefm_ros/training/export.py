"""Checkpoints in LeRobot's layout (``pretrained_model/``), as the Engine and LeRobot 0.4.4 load them.

out/config.json              SmolVLAConfig (LeRobot's keys), vlm_model_name "vlm" (the folder next to it)
out/model.safetensors        every weight under LeRobot's names, float32 (lm_head included: LeRobot
                             loads strictly, the Engine never reads it)
out/policy_{pre,post}processor*.json/.safetensors   the dataset's MEAN_STD stats
out/vlm/                     backbone config.json + tokenizer + processor files (what
                             SmolVLMWithExpertModel reads through AutoConfig/AutoProcessor)
out/edgefm_train.json        the recipe, dataset and progress of the run that wrote the weights
out/edgefm_numerics.json     the vision position-id convention trained with (runtime/checkpoint.write_numerics)
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer

from edgefm_ros.models.config import SmolVLAConfig, VlmConfig

from .random_checkpoint import policy_config, random_weights, write_processors, write_vlm_dir

TRAIN_RECORD = "edgefm_train.json"
LM_HEAD_KEY = "model.vlm_with_expert.vlm.lm_head.weight"
# the SmolVLM processor's special tokens (transformers' SmolVLMProcessor looks them up on the tokenizer);
# appended after the trained vocabulary, so ordinary text keeps its ids
PROCESSOR_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                    "end_of_utterance_token": "<end_of_utterance>", "global_image_token": "<global-img>"}


def write_backbone(vdir: Path, arch: dict, instructions: Sequence[str] = ()) -> dict:
    """``vdir``: config.json + tokenizer (random_checkpoint's, plus the processor's special tokens) +
    processor configs, so both the Engine and LeRobot (AutoConfig/AutoProcessor) read it. Returns
    the config dict."""
    vlm_dict = write_vlm_dir(vdir, arch, instructions)  # the tokenizer learns the instructions' words
    tok = Tokenizer.from_file(str(vdir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PROCESSOR_TOKENS.values()])
    tok.save(str(vdir / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    image_token_id = tok.token_to_id(PROCESSOR_TOKENS["image_token"])
    tcfg = json.loads((vdir / "tokenizer_config.json").read_text())
    tcfg.update({**PROCESSOR_TOKENS, "extra_special_tokens": dict(PROCESSOR_TOKENS),
                 "processor_class": "SmolVLMProcessor",
                 "additional_special_tokens": [PROCESSOR_TOKENS[k] for k in ("fake_image_token", "image_token",
                                                                              "end_of_utterance_token")],
                 "model_max_length": 8192, "clean_up_tokenization_spaces": False})
    (vdir / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    vlm_dict.update({"vocab_size": vocab, "image_token_id": image_token_id, "tie_word_embeddings": False,
                     "architectures": ["SmolVLMForConditionalGeneration"], "torch_dtype": "float32"})
    vlm_dict["text_config"].update({"vocab_size": vocab, "torch_dtype": "float32", "max_position_embeddings": 8192})
    side = arch["vision"]["image_size"]
    vlm_dict["vision_config"]["max_image_size"] = {"longest_edge": side}
    (vdir / "config.json").write_text(json.dumps(vlm_dict, indent=2))
    grid = side // arch["vision"]["patch_size"]
    (vdir / "processor_config.json").write_text(json.dumps(
        {"image_seq_len": (grid // arch["scale_factor"]) ** 2, "processor_class": "SmolVLMProcessor"}, indent=2))
    image_proc = {"image_processor_type": "SmolVLMImageProcessor", "processor_class": "SmolVLMProcessor",
                  "do_convert_rgb": True, "do_image_splitting": False, "do_normalize": True, "do_pad": True,
                  "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                  "max_image_size": {"longest_edge": side}, "resample": 1, "rescale_factor": 1 / 255,
                  "size": {"longest_edge": side}}
    (vdir / "preprocessor_config.json").write_text(json.dumps(image_proc, indent=2))
    return vlm_dict


def initial_weights(cfg: SmolVLAConfig, vlm: VlmConfig, seed: int) -> dict[str, torch.Tensor]:
    """From-scratch initialisation: random_checkpoint's seeded shapes and 1/sqrt(fan_in) matrices, norm
    scales 1 and biases 0; lm_head (never trained, kept for LeRobot's strict load) zero."""
    w = random_weights(cfg, vlm, seed)
    for k, t in w.items():
        if k.endswith("bias"):
            w[k] = torch.zeros_like(t)
        elif t.ndim == 1:  # RMSNorm / LayerNorm scales
            w[k] = torch.ones_like(t)
    w[LM_HEAD_KEY] = torch.zeros(vlm.text.vocab, vlm.text.hidden)
    return w


def new_policy_config(arch: dict, cameras: Mapping[str, tuple[int, int]], state_dim: int, action_dim: int,
                      chunk_size: int, n_action_steps: int) -> dict:
    hw = {tuple(v) for v in cameras.values()}
    if len(hw) != 1:
        raise ValueError(f"cameras must share one image size, got {dict(cameras)}")
    d = policy_config(arch, "vlm", list(cameras), hw.pop(), action_dim, chunk_size)
    d["input_features"]["observation.state"]["shape"] = [state_dim]
    d.update({"tags": ["edgefm-trained"], "n_action_steps": n_action_steps, "chunk_size": chunk_size,
              "freeze_vision_encoder": False, "train_expert_only": False, "train_state_proj": True})
    return d


def stats_tensors(stats: Mapping[str, Mapping[str, np.ndarray]], keys=("observation.state", "action")
                  ) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for k in keys:
        if k not in stats:
            raise ValueError(f"dataset stats have no {k!r} (have {sorted(stats)})")
        out[k] = {n: torch.as_tensor(np.asarray(stats[k][n], dtype=np.float32)).reshape(-1)
                  for n in ("mean", "std", "min", "max") if n in stats[k]}
        for n in ("mean", "std"):
            if n not in out[k]:
                raise ValueError(f"dataset stats {k!r} have no {n!r}")
    return out


def write_config(out: Path, config: dict, vlm_src: Path, stats: dict[str, dict[str, torch.Tensor]]) -> None:
    """Everything but the weights: config.json, processors, vlm/ (copied from ``vlm_src`` if elsewhere)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_processors(out, stats, policy=config)  # LeRobot's whole pipeline: its from_pretrained loads it
    if vlm_src.resolve() != (out / "vlm").resolve():
        shutil.copytree(vlm_src, out / "vlm", dirs_exist_ok=True)


def save_weights(out: Path, weights: Mapping[str, torch.Tensor], train_meta: Mapping[str, object]) -> None:
    """model.safetensors (written to a temporary name, then renamed: a reader never sees half a file)
    and edgefm_train.json (not LeRobot's train_config.json, whose fields the runtime reads as a version hint)."""
    tmp = out / "model.safetensors.tmp"
    save_file({k: v.float().contiguous() for k, v in weights.items()}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / TRAIN_RECORD).write_text(json.dumps(train_meta, indent=2, default=str))


def write_readme(out: Path, meta: Mapping[str, object]) -> None:
    """README.md of a trained checkpoint: what it is and how it was made (the run's record)."""
    r = dict(meta.get("recipe", {}))
    origin = meta.get("arch") or f"fine-tuned from {meta.get('init')}"
    lines = [f"# SmolVLA trained by edgefm-vla train ({origin})",
             "", "Trained from demonstrations with LeRobot SmolVLA's flow-matching objective on the edgefm runtime's",
             "own modules (edgefm_ros/training). LeRobot layout: the Engine and LeRobot 0.4.4 load it as is",
             "(vision position ids: see edgefm_numerics.json).", "",
             f"- command: `{meta.get('command', '(library call)')}`",
             f"- dataset: {meta.get('dataset', '?')} ({meta.get('frames')} frames, {meta.get('episodes')} episodes)",
             f"- tasks: {', '.join(map(str, meta.get('tasks', [])))}",
             f"- parameters: {meta.get('parameters')}",
             f"- steps: {meta.get('step')} x batch {r.get('batch_size')}, AdamW lr {r.get('lr')} "
             f"(betas {r.get('betas')}, "
             f"weight decay {r.get('weight_decay')}), warm-up {int(r.get('steps', 0) * r.get('warmup_fraction', 0))} "
             f"steps then cosine to {r.get('decay_lr')}, grad clip {r.get('grad_clip_norm')}, seed {r.get('seed')}, "
             f"{r.get('threads')} threads",
             f"- training time: {float(meta.get('train_seconds', 0)) / 60:.1f} min; final loss {meta.get('loss')}", ""]
    (out / "README.md").write_text("\n".join(lines))

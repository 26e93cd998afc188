"""LeRobot's SmolVLA pre/post-processing, exactly: images, task tokens, state and action (un)normalisation.

Raw observation -> model inputs:
  images   float32 [B, 3, H, W] in [0, 1] -> resize_with_pad (keep aspect, bilinear, pad left/top with 0)
           -> x * 2 - 1; a camera marked missing keeps its slot with mask False
  task     + "\n" (SmolVLA's newline convention) -> token ids, right-padded with the pad token
  state    (x - mean) / (std + eps), zero-padded to max_state_dim
Model output -> actions: crop to action_dim, x * std + mean.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as _Tok

from .checkpoint import NormStats
from edgefm_ros.models.config import SmolVLAConfig


class InputError(ValueError):
    """Bad observation input; the message names the bad value."""


def resize_with_pad(img: torch.Tensor, width: int, height: int, pad_value: float = 0.0) -> torch.Tensor:
    """img [B, C, h, w] -> [B, C, height, width]: aspect-preserving bilinear resize, pad on left/top."""
    h, w = img.shape[2:]
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    out = F.interpolate(img, size=(rh, rw), mode="bilinear", align_corners=False)
    return F.pad(out, (max(0, width - rw), 0, max(0, height - rh), 0), value=pad_value)


def image_to_chw01(key: str, img) -> torch.Tensor:
    """uint8 (H, W, 3) RGB or float32 (3, H, W) in [0, 1] -> float32 tensor (3, H, W) in [0, 1]."""
    a = img if isinstance(img, torch.Tensor) else np.asarray(img)
    if a.dtype in (np.uint8, torch.uint8):
        if a.ndim != 3 or a.shape[2] != 3:
            raise InputError(f"camera {key!r}: uint8 image must be (H, W, 3) RGB, got shape {tuple(a.shape)}")
        t = torch.as_tensor(a).permute(2, 0, 1).float().div_(255.0)
    elif a.dtype in (np.float32, torch.float32):
        if a.ndim != 3 or a.shape[0] != 3:
            raise InputError(f"camera {key!r}: float32 image must be (3, H, W) in [0, 1], got shape {tuple(a.shape)}")
        t = torch.as_tensor(a)
        if not torch.isfinite(t).all():
            raise InputError(f"camera {key!r}: image holds non-finite values")
        lo, hi = float(t.min()), float(t.max())
        if lo < 0.0 or hi > 1.0:
            raise InputError(f"camera {key!r}: float32 image values must lie in [0, 1], got range [{lo:.4g}, {hi:.4g}]")
    else:
        raise InputError(f"camera {key!r}: image dtype {a.dtype} unsupported (uint8 HWC or float32 CHW)")
    if min(t.shape[1:]) < 2:
        raise InputError(f"camera {key!r}: image of size {tuple(t.shape[1:])} is too small")
    return t


class Tokenizer:
    """The backbone's tokenizer.json through the `tokenizers` library, with LeRobot's task convention."""

    def __init__(self, path: Path, max_length: int):
        self.tok = _Tok.from_file(str(path))
        cfg_path = path.parent / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        pad = cfg.get("pad_token") or "<|im_end|>"
        pad = pad["content"] if isinstance(pad, dict) else pad
        self.pad_id = self.tok.token_to_id(pad)
        if self.pad_id is None:
            raise ValueError(f"{path}: pad token {pad!r} is not in the vocabulary")
        self.max_length = max_length

    def __call__(self, tasks: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """tasks -> (ids [B, L] i64, mask [B, L] bool), L = longest; refuses empty or too-long tasks."""
        rows = []
        for task in tasks:
            if not isinstance(task, str) or not task.strip():
                raise InputError(f"task must be a non-empty string, got {task!r}")
            text = task if task.endswith("\n") else task + "\n"
            ids = self.tok.encode(text).ids
            if len(ids) > self.max_length:
                raise InputError(f"task is {len(ids)} tokens, over tokenizer_max_length {self.max_length}: {task[:80]!r}")
            rows.append(ids)
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = True
        return ids, mask


@dataclass(frozen=True)
class ModelInputs:
    """Exactly what SmolVLA's sample_actions receives."""

    images: tuple[torch.Tensor, ...]  # per camera [B, 3, S, S] in [-1, 1]
    img_masks: tuple[torch.Tensor, ...]  # per camera [B] bool
    lang_tokens: torch.Tensor  # [B, L] i64
    lang_masks: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, max_state_dim] f32, normalised

    @property
    def batch(self) -> int:
        return self.state.shape[0]

    def to(self, device: torch.device) -> "ModelInputs":
        if self.state.device == device:
            return self
        mv = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
        return ModelInputs(mv(self.images), mv(self.img_masks), self.lang_tokens.to(device),
                           self.lang_masks.to(device), self.state.to(device))


class Preprocessor:
    def __init__(self, cfg: SmolVLAConfig, stats: NormStats, tokenizer: Tokenizer):
        self.cfg, self.stats, self.tokenizer = cfg, stats, tokenizer

    def images(self, frames: Mapping[str, torch.Tensor | None], padding_masks: Mapping[str, torch.Tensor] | None = None
               ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """frames: camera key -> [B, 3, H, W] in [0, 1], or None for a missing camera;
        padding_masks: camera key -> [B] bool (False = that sample's frame is not valid), LeRobot's
        ``<key>_padding_mask``."""
        padding_masks = padding_masks or {}
        unknown = sorted(set(frames) - set(self.cfg.camera_keys))
        if unknown:
            raise InputError(f"unknown camera(s) {unknown}; the model's cameras are {list(self.cfg.camera_keys)}")
        w, h = self.cfg.resize
        present = [f for f in frames.values() if f is not None]
        if not present:
            raise InputError("no camera image given: at least one camera is required")
        b = present[0].shape[0]
        images, masks = [], []
        for key in self.cfg.camera_keys:
            frame = frames.get(key)
            if frame is None:
                images.append(torch.full((b, 3, h, w), -1.0))
                masks.append(torch.zeros(b, dtype=torch.bool))
                continue
            images.append(resize_with_pad(frame, w, h, pad_value=0.0) * 2.0 - 1.0)
            masks.append(padding_masks[key].bool() if key in padding_masks else torch.ones(b, dtype=torch.bool))
        for _ in range(self.cfg.empty_cameras):
            images.append(torch.full((b, 3, h, w), -1.0))
            masks.append(torch.zeros(b, dtype=torch.bool))
        return tuple(images), tuple(masks)

    def state(self, raw: torch.Tensor) -> torch.Tensor:
        """raw [B, state_dim] -> normalised, zero-padded [B, max_state_dim]."""
        if raw.ndim != 2 or raw.shape[1] != self.cfg.state_dim:
            raise InputError(f"state must have {self.cfg.state_dim} values, got shape {tuple(raw.shape)}")
        if not torch.isfinite(raw).all():
            raise InputError(f"state holds non-finite values: {raw.tolist()}")
        s = self.stats
        x = (raw.float() - s.state_mean) / (s.state_std + s.eps)
        return F.pad(x, (0, self.cfg.max_state_dim - self.cfg.state_dim))

    def actions(self, normalised: torch.Tensor) -> torch.Tensor:
        """[B, C, max_action_dim] model output -> [B, C, action_dim] raw units."""
        s = self.stats
        return normalised[..., : self.cfg.action_dim] * s.action_std + s.action_mean

    def normalise_actions(self, raw: torch.Tensor) -> torch.Tensor:
        """[..., action_dim] raw units -> the model's normalised space (the inverse of ``actions``)."""
        s = self.stats
        std = torch.where(s.action_std > 0, s.action_std, torch.ones_like(s.action_std))
        return (raw.float() - s.action_mean) / std

    def __call__(self, frames, raw_state: torch.Tensor, tasks: Sequence[str], padding_masks=None) -> ModelInputs:
        images, masks = self.images(frames, padding_masks)
        ids, lmask = self.tokenizer(tasks)
        return ModelInputs(images, masks, ids, lmask, self.state(raw_state))

"""LeRobot SmolVLA checkpoint loading: config, memory-mapped weights, normalisation stats, tokenizer.

A checkpoint directory is what ``lerobot-train`` saves as ``pretrained_model/``: ``config.json``,
``model.safetensors``, ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their
``*_normalizer_processor.safetensors`` stats. The backbone (VLM) config and tokenizer come from the
hub id in ``config.json`` (``vlm_model_name``), found in the Hugging Face cache or given explicitly.

What LeRobot's files cannot say (which vision position-id convention the weights were trained with) lives
in our sidecar ``edgefm_numerics.json`` beside them: LeRobot parses config.json strictly, so nothing is
ever added there. See ``write_numerics`` / ``resolve_vision_position_ids``.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES, VISION_POSITION_IDS, SmolVLAConfig, VlmConfig
from .safetensors_mmap import MappedSafetensors, SafetensorsError, load_all

log = logging.getLogger(__name__)

PREFIX = "model."
VLM_PREFIX = "model.vlm_with_expert.vlm."
IGNORED_KEYS = ("model.vlm_with_expert.vlm.lm_head.weight",)  # unused at inference: never loaded


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and key."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"missing file {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None


def hf_cache_dirs() -> list[Path]:
    """Hugging Face hub cache roots, in the order transformers looks at them."""
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    return roots


def resolve_vlm_dir(hub_id: str, explicit: str | Path | None = None, base: Path | None = None) -> Path:
    """Directory holding the backbone's config.json and tokenizer for ``hub_id``: the explicit
    directory, a path (relative to the checkpoint ``base`` or absolute), or the Hugging Face cache."""
    if explicit is not None:
        d = Path(explicit)
        if not (d / "config.json").is_file():
            raise CheckpointError(f"VLM directory {d} has no config.json")
        return d
    for cand in ([base / hub_id] if base is not None else []) + [Path(hub_id)]:
        if (cand / "config.json").is_file():
            return cand
    searched = []
    for root in hf_cache_dirs():
        repo = root / ("models--" + hub_id.replace("/", "--"))
        searched.append(str(repo))
        snaps = repo / "snapshots"
        if not snaps.is_dir():
            continue
        ref = repo / "refs" / "main"
        order = [snaps / ref.read_text().strip()] if ref.is_file() else []
        order += sorted(p for p in snaps.iterdir() if p.is_dir())
        for snap in order:
            if (snap / "config.json").is_file():
                return snap
    raise CheckpointError(f"backbone {hub_id!r} (config.json vlm_model_name) not found in the Hugging Face cache "
                          f"(looked in {searched}); pass its local directory explicitly (--vlm DIR)")


@dataclass(frozen=True)
class NormStats:
    """MEAN_STD statistics: normalise ``(x - mean) / (std + eps)``, unnormalise ``x * std + mean``."""

    state_mean: torch.Tensor  # [state_dim] f32
    state_std: torch.Tensor
    action_mean: torch.Tensor  # [action_dim] f32
    action_std: torch.Tensor
    eps: float = 1e-8


def _processor_state(ckpt: Path, name: str, step_name: str) -> tuple[dict[str, torch.Tensor], float]:
    path = ckpt / f"{name}.json"
    cfg = _read_json(path)
    for step in cfg.get("steps", []):
        if step.get("registry_name") == step_name:
            if "state_file" not in step:
                raise CheckpointError(f"{path}: step {step_name!r} has no state_file")
            mapping = step.get("config", {}).get("norm_map", {})
            for kind in ("STATE", "ACTION"):
                if mapping.get(kind, "MEAN_STD") != "MEAN_STD":
                    raise CheckpointError(f"{path}: {kind} normalisation {mapping[kind]!r} unsupported (MEAN_STD)")
            try:
                return load_all(ckpt / step["state_file"]), float(step.get("config", {}).get("eps", 1e-8))
            except SafetensorsError as e:
                raise CheckpointError(str(e)) from None
    raise CheckpointError(f"{path}: no {step_name!r} step (normalisation stats)")


def load_stats(ckpt: Path, cfg: SmolVLAConfig) -> NormStats:
    pre, eps = _processor_state(ckpt, "policy_preprocessor", "normalizer_processor")
    post, _ = _processor_state(ckpt, "policy_postprocessor", "unnormalizer_processor")

    def get(d, key, n, file):
        if key not in d:
            raise CheckpointError(f"{ckpt / file}: missing stats key {key!r}")
        t = d[key].float()
        if t.shape != (n,):
            raise CheckpointError(f"{ckpt / file}: stats {key!r} has shape {list(t.shape)}, expected [{n}]")
        return t

    return NormStats(get(pre, f"{cfg.state_key}.mean", cfg.state_dim, "policy_preprocessor"),
                     get(pre, f"{cfg.state_key}.std", cfg.state_dim, "policy_preprocessor"),
                     get(post, "action.mean", cfg.action_dim, "policy_postprocessor"),
                     get(post, "action.std", cfg.action_dim, "policy_postprocessor"), eps)


class WeightSource:
    """Hands out checkpoint tensors by name, checking shapes, and tracks what was used."""

    RELEASE_EVERY_BYTES = 256 << 20

    def __init__(self, path: Path, device: torch.device | None = None):
        self.device = device if device is not None else torch.device("cpu")
        try:
            self.file = MappedSafetensors(path)
        except SafetensorsError as e:
            raise CheckpointError(str(e)) from None
        self.path = path
        self.used: set[str] = set()
        self._taken_bytes = 0  # since the last release of resident pages

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if key not in self.file.entries:
            raise CheckpointError(f"{self.path}: missing weight {key!r} (expected shape {list(shape)})")
        got = self.file.shape(key)
        if tuple(got) != tuple(shape):
            raise CheckpointError(f"{self.path}: weight {key!r} has shape {list(got)}, expected {list(shape)}")
        self.used.add(key)
        self._taken_bytes += self.file.entries[key][3]
        if self._taken_bytes > self.RELEASE_EVERY_BYTES:
            # kernels that convert weights (bf16, int8, fused copies) touched the originals: drop those
            # pages so loading never holds both forms of every layer (views re-read on next use)
            self.file.release()
            self._taken_bytes = 0
        t = self.file.get(key)
        return t.to(device=self.device, dtype=dtype)  # no copy on CPU for fp32: stays a view of the mapping

    def scoped(self, prefix: str) -> "Scoped":
        return Scoped(self, prefix)

    def check_all_used(self) -> None:
        extra = sorted(set(self.file.keys()) - self.used - set(IGNORED_KEYS))
        if extra:
            raise CheckpointError(f"{self.path}: unexpected weight(s) not used by the model: {extra[:10]}"
                                  + (f" and {len(extra) - 10} more" if len(extra) > 10 else ""))


@dataclass(frozen=True)
class Scoped:
    src: WeightSource
    prefix: str

    def __call__(self, key: str, *shape: int) -> torch.Tensor:
        return self.src.take(self.prefix + key, shape)

    def scoped(self, prefix: str) -> "Scoped":
        return Scoped(self.src, self.prefix + prefix)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: SmolVLAConfig
    vlm: VlmConfig
    vlm_dir: Path
    stats: NormStats
    weights_path: Path

    @property
    def tokenizer_path(self) -> Path:
        p = self.vlm_dir / "tokenizer.json"
        if not p.is_file():
            raise CheckpointError(f"tokenizer missing: {p} (the backbone directory must hold tokenizer.json)")
        return p

    def weights(self, device: torch.device | None = None) -> WeightSource:
        return WeightSource(self.weights_path, device)


def load_checkpoint(path: str | Path, vlm_dir: str | Path | None = None) -> Checkpoint:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    try:
        cfg = SmolVLAConfig.from_dict(_read_json(path / "config.json"), str(path / "config.json"))
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    vdir = resolve_vlm_dir(cfg.vlm_model_name, vlm_dir, path)
    try:
        vlm = VlmConfig.from_dict(_read_json(vdir / "config.json"), str(vdir / "config.json"))
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if cfg.num_vlm_layers > vlm.text.layers:
        raise CheckpointError(f"{path / 'config.json'}: num_vlm_layers {cfg.num_vlm_layers} exceeds the backbone's "
                              f"{vlm.text.layers} layers")
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"missing file {weights}")
    return Checkpoint(path, cfg, vlm, vdir, load_stats(path, cfg), weights)


# ---- vision position-id convention --------------------------------------------------------------------
NUMERICS_FILE = "edgefm_numerics.json"  # our sidecar in the checkpoint directory
NUMERICS_FORMAT = 1
DEFAULT_VISION_POSITION_IDS = "fixed"  # SmolVLA's pretraining and LeRobot >= 0.5 (see README)
# the longest action prefix a checkpoint was trained to be given (training-time RTC, `edgefm-vla train
# --rtc-prefix-max`); RTC then conditions on the prefix instead of guiding toward it (runtime/rtc_guidance.py)
RTC_PREFIX_KEY = "rtc_prefix_max"
_CARD_VERSION = re.compile(r"\|\s*LeRobot version\s*\|\s*v?(\d+)\.(\d+)[^|]*\|")


def write_numerics(ckpt_dir: str | Path, vision_position_ids: str, **extra) -> Path:
    """Record the numeric conventions a checkpoint was trained with in ``<ckpt_dir>/edgefm_numerics.json``:
    ``{"format": 1, "vision_position_ids": "legacy"|"fixed", ...extra}``. Returns the file's path."""
    if vision_position_ids not in VISION_POSITION_IDS:
        raise ValueError(f"vision_position_ids must be one of {VISION_POSITION_IDS}, got {vision_position_ids!r}")
    clash = set(extra) & {"format", "vision_position_ids"}
    if clash:
        raise ValueError(f"extra keys {sorted(clash)} are reserved")
    path = Path(ckpt_dir) / NUMERICS_FILE
    path.write_text(json.dumps({"format": NUMERICS_FORMAT, "vision_position_ids": vision_position_ids, **extra},
                               indent=2) + "\n")
    return path


def read_numerics(ckpt_dir: str | Path) -> dict | None:
    """The sidecar's content (validated), or None when the checkpoint has none."""
    path = Path(ckpt_dir) / NUMERICS_FILE
    if not path.is_file():
        return None
    d = _read_json(path)
    if not isinstance(d, dict) or d.get("format") != NUMERICS_FORMAT:
        raise CheckpointError(f"{path}: format {d.get('format') if isinstance(d, dict) else d!r} unsupported "
                              f"(expected {NUMERICS_FORMAT})")
    if d.get("vision_position_ids") not in VISION_POSITION_IDS:
        raise CheckpointError(f"{path}: vision_position_ids {d.get('vision_position_ids')!r} is not one of "
                              f"{VISION_POSITION_IDS}")
    return d


def rtc_prefix_max(ckpt_dir: str | Path) -> int:
    """The longest action prefix the checkpoint was trained to be given (RTC_PREFIX_KEY), 0 when none."""
    numerics = read_numerics(ckpt_dir) or {}
    n = numerics.get(RTC_PREFIX_KEY, 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CheckpointError(f"{Path(ckpt_dir) / NUMERICS_FILE}: {RTC_PREFIX_KEY} must be an integer >= 0, "
                              f"got {n!r}")
    return n


def convention_of_lerobot(major: int, minor: int) -> str:
    """The convention LeRobot ``major.minor`` trained with: 0.4.x required transformers 4.53-4.x (in practice
    4.55.1-4.57: legacy); 0.3.x pinned transformers < 4.52 and 0.5+ transformers 5 (fixed)."""
    return "legacy" if (major, minor) == (0, 4) else "fixed"


def detect_vision_position_ids(ckpt_dir: str | Path) -> tuple[str | None, str]:
    """(convention, why) from what a checkpoint directory records, or (None, why) when nothing tells."""
    d = Path(ckpt_dir)
    numerics = read_numerics(d)
    if numerics is not None:
        return numerics["vision_position_ids"], f"{d / NUMERICS_FILE}"
    card = d / "README.md"  # LeRobot >= 0.5's model card has a "| LeRobot version | x.y.z |" row
    if card.is_file():
        m = _CARD_VERSION.search(card.read_text(errors="replace"))
        if m:
            major, minor = int(m.group(1)), int(m.group(2))
            return convention_of_lerobot(major, minor), f"{card}: LeRobot {major}.{minor}"
    train = d / "train_config.json"  # lerobot-train's; its fields changed between releases
    if train.is_file():
        t = _read_json(train)
        if isinstance(t, dict) and "cudnn_deterministic" in t:
            return "fixed", f"{train}: LeRobot >= 0.5 (has cudnn_deterministic)"
        if isinstance(t, dict) and "rename_map" in t:
            return "legacy", f"{train}: LeRobot 0.4.x (has rename_map, no cudnn_deterministic)"
    cfg = d / "config.json"
    if cfg.is_file() and "pretrained_revision" in _read_json(cfg):
        return "fixed", f"{cfg}: LeRobot >= 0.6 (has pretrained_revision)"
    return None, "no edgefm_numerics.json, LeRobot model card, train_config.json or version-specific config key"


def resolve_vision_position_ids(ckpt_dir: str | Path, requested: str = "auto") -> tuple[str, str]:
    """(convention, source) for ``requested`` in VISION_POSITION_ID_CHOICES. An explicit choice wins; "auto"
    reads the checkpoint's record (detect_vision_position_ids) and otherwise falls back, with a warning,
    to DEFAULT_VISION_POSITION_IDS."""
    if requested not in VISION_POSITION_ID_CHOICES:
        raise ValueError(f"vision_position_ids must be one of {VISION_POSITION_ID_CHOICES}, got {requested!r}")
    if requested != "auto":
        return requested, "requested"
    found, why = detect_vision_position_ids(ckpt_dir)
    if found is not None:
        return found, why
    log.warning("%s: cannot tell which vision position ids the checkpoint was trained with (%s); using %r "
                "(LeRobot >= 0.5, SmolVLA pretraining). For a LeRobot 0.4.x fine-tune pass vision_position_ids "
                "'legacy' or write %s", ckpt_dir, why, DEFAULT_VISION_POSITION_IDS, NUMERICS_FILE)
    return DEFAULT_VISION_POSITION_IDS, "default"

"""Training settings (never part of an inference config) and the from-scratch architectures.

``TrainConfig`` follows LeRobot's SmolVLA training defaults (AdamW betas (0.9, 0.95), eps 1e-8,
weight decay 1e-10, gradient clip 10, linear warm-up then cosine decay to ``decay_lr``; LeRobot scales
its 1000 warm-up / 30000 decay steps down to the run's length, and so do we: ``warmup_steps`` is
``warmup_fraction`` of the run). The learning rate is higher than LeRobot's 1e-4 fine-tuning default
because a small model trained from scratch for a few thousand steps needs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from edgefm_ros.models.config import VISION_POSITION_IDS

AUGMENTATIONS = ("none", "conditions")  # TrainConfig.augment (training/augment.py implements them)

# The SmolVLA architectures (same wiring as SmolVLA-450M), for training from scratch and for random-weight
# checkpoints (random_checkpoint.py, ``edgefm-vla make-checkpoint``). ``chunk_size`` is training's default
# (``--chunk-size`` overrides it); a random-weight checkpoint takes its chunk size from its caller
# (random_checkpoint.CHUNK_SIZE, SmolVLA's 50, unless told).
ARCHS = {
    # ~1.3 M parameters: 64x64 images, patch 8 -> 64 patches, pixel shuffle 2 -> 16 tokens per camera
    "tiny": dict(vision=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                             image_size=64, patch_size=8),
                 text=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16),
                 scale_factor=2, num_vlm_layers=4, resize=[64, 64], chunk_size=16, num_steps=10),
    # wider vision and text (hidden 128): ~4 M parameters
    "small": dict(vision=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                              image_size=64, patch_size=8),
                  text=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32),
                  scale_factor=2, num_vlm_layers=4, resize=[64, 64], chunk_size=16, num_steps=10),
    # the simulator's cloud-tier model: hidden 96 at 128x128 (patch 16 -> 64 patches, pixel shuffle 2 -> 16 tokens
    # per camera: the tiny's token count, each token from 4x the pixels), 3 vision layers, SmolVLA's 50-action
    # chunk; ~1.4 M parameters (a training step costs ~2x the tiny's on a CPU core)
    "compact128": dict(vision=dict(hidden_size=96, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                                   image_size=128, patch_size=16),
                       text=dict(hidden_size=96, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=24),
                       scale_factor=2, num_vlm_layers=4, resize=[128, 128], chunk_size=50, num_steps=10),
    # SmolVLA-450M's architecture on SmolVLM2-500M (random weights: 1.8 GB)
    "full": dict(vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                             image_size=512, patch_size=16),
                 text=dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                           num_key_value_heads=5, head_dim=64),
                 scale_factor=4, num_vlm_layers=16, resize=[512, 512], chunk_size=50, num_steps=10),
}


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 4000
    batch_size: int = 32
    lr: float = 5e-4  # peak
    decay_lr: float = 2.5e-6  # LeRobot's scheduler_decay_lr
    warmup_fraction: float = 1000 / 30000  # LeRobot's warm-up share of its decay horizon
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 1e-10
    grad_clip_norm: float = 10.0
    seed: int = 0
    threads: int = 2
    log_every: int = 50  # steps between progress lines
    save_every: int = 1000  # steps between periodic checkpoints (0: final only)
    chunk_size: int | None = None  # None: the architecture's (or --init checkpoint's)
    n_action_steps: int | None = None  # None: half the chunk
    vision_position_ids: str = "legacy"  # patch position-id convention the checkpoint records
    augment: str = "none"  # "conditions": each sample under a random camera condition (training/augment.py)
    start_frames: int = 0  # each episode's first start_frames frames are drawn start_weight times as often
    start_weight: float = 1.0
    freeze_vision: bool = False  # keep the vision tower's weights as initialised (LeRobot's freeze_vision_encoder)
    # training-time real-time chunking: each sample's first d ~ U{0..rtc_prefix_max} actions are given, clean
    # (flow time 0) and out of the loss, so the model learns to continue a prefix that executes while it computes
    rtc_prefix_max: int = 0

    def __post_init__(self) -> None:
        for k in ("steps", "batch_size", "threads", "log_every"):
            v = getattr(self, k)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{k} must be a positive integer, got {v!r}")
        if not isinstance(self.save_every, int) or self.save_every < 0:
            raise ValueError(f"save_every must be an integer >= 0, got {self.save_every!r}")
        for k in ("lr", "eps"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{k} must be a finite number > 0, got {v!r}")
        if not (math.isfinite(self.decay_lr) and 0 <= self.decay_lr <= self.lr):
            raise ValueError(f"decay_lr must lie in [0, lr={self.lr}], got {self.decay_lr!r}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must lie in [0, 1), got {self.warmup_fraction!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not self.grad_clip_norm > 0:
            raise ValueError(f"grad_clip_norm must be > 0, got {self.grad_clip_norm!r}")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size <= 0):
            raise ValueError(f"chunk_size must be a positive integer, got {self.chunk_size!r}")
        if self.n_action_steps is not None:
            if not isinstance(self.n_action_steps, int) or self.n_action_steps <= 0:
                raise ValueError(f"n_action_steps must be a positive integer, got {self.n_action_steps!r}")
            if self.chunk_size is not None and self.n_action_steps > self.chunk_size:
                raise ValueError(f"n_action_steps {self.n_action_steps} exceeds chunk_size {self.chunk_size}")
        if not isinstance(self.start_frames, int) or self.start_frames < 0:
            raise ValueError(f"start_frames must be an integer >= 0, got {self.start_frames!r}")
        if not (isinstance(self.start_weight, (int, float)) and math.isfinite(self.start_weight)
                and self.start_weight > 0):
            raise ValueError(f"start_weight must be a finite number > 0, got {self.start_weight!r}")
        if not isinstance(self.rtc_prefix_max, int) or isinstance(self.rtc_prefix_max, bool) \
                or self.rtc_prefix_max < 0:
            raise ValueError(f"rtc_prefix_max must be an integer >= 0, got {self.rtc_prefix_max!r}")
        if self.chunk_size is not None and self.rtc_prefix_max >= self.chunk_size:
            raise ValueError(f"rtc_prefix_max {self.rtc_prefix_max} must be below chunk_size {self.chunk_size}")
        if not isinstance(self.freeze_vision, bool):
            raise ValueError(f"freeze_vision must be a bool, got {self.freeze_vision!r}")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {self.augment!r}")
        if self.vision_position_ids not in VISION_POSITION_IDS:
            raise ValueError(f"vision_position_ids must be one of {VISION_POSITION_IDS}, "
                             f"got {self.vision_position_ids!r}")

    @property
    def warmup_steps(self) -> int:
        return int(self.steps * self.warmup_fraction)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr at ``step`` (LeRobot's CosineDecayWithWarmup, scaled to the run)."""
    warm, total = cfg.warmup_steps, cfg.steps
    if step < warm:
        start = 1.0 / (warm + 1)
        return start + (1.0 - start) * step / warm
    alpha = cfg.decay_lr / cfg.lr
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
    return (1.0 - alpha) * cosine + alpha

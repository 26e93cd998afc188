"""SigLIP vision tower (as in SmolVLM/Idefics3) and the pixel-shuffle connector."""
from __future__ import annotations

import torch
from torch import nn

from .config import VISION_POSITION_IDS, VisionConfig, VlmConfig


class SiglipLayer(nn.Module):
    def __init__(self, cfg: VisionConfig, ops, w, name: str):
        super().__init__()
        h, i = cfg.hidden, cfg.inner
        self.heads, self.head_dim = cfg.heads, h // cfg.heads
        self.norm1 = ops.layer_norm(f"{name}.layer_norm1", "vision_norm", w("layer_norm1.weight", h),
                                    w("layer_norm1.bias", h), cfg.eps)
        self.qkv = ops.linear(f"{name}.self_attn.qkv", "vision_qkv",
                              [(w(f"self_attn.{p}_proj.weight", h, h), w(f"self_attn.{p}_proj.bias", h)) for p in "qkv"])
        self.attn = ops.attention(f"{name}.self_attn", "vision_attn", cfg.heads, cfg.heads, self.head_dim)
        self.out = ops.linear(f"{name}.self_attn.out_proj", "vision_o",
                              [(w("self_attn.out_proj.weight", h, h), w("self_attn.out_proj.bias", h))])
        self.norm2 = ops.layer_norm(f"{name}.layer_norm2", "vision_norm", w("layer_norm2.weight", h),
                                    w("layer_norm2.bias", h), cfg.eps)
        self.mlp = ops.mlp(f"{name}.mlp", "vision_mlp", {"fc1": (w("mlp.fc1.weight", i, h), w("mlp.fc1.bias", i)),
                                                          "fc2": (w("mlp.fc2.weight", h, i), w("mlp.fc2.bias", h))},
                           "gelu_tanh", h, i)

    def forward(self, x):  # x [B, N, H] -> [B, N, H]
        b, n, h = x.shape
        q, k, v = (t.view(b, n, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(self.norm1(x)))
        a = self.attn(q, k, v, None).transpose(1, 2).reshape(b, n, h)
        x = self.out(a, residual=x)
        return self.mlp(self.norm2(x), residual=x)


def patch_position_ids(grid_h: int, grid_w: int, side: int, convention: str) -> torch.Tensor:
    """Position-embedding ids of a grid_h x grid_w patch grid, bucketed into ``side`` bins per axis. [N] i64

    Both conventions bucket a float32 fractional coordinate against the boundaries k/side (right-closed):
    - ``legacy`` (transformers 4.55.1-4.57, LeRobot 0.4.x): ``i / n * (1 - 1e-6)``; a coordinate on a
      boundary drops into the bin below, so a full power-of-two grid gives [0, 0, 1, ..., n-2] per axis;
    - ``fixed`` (transformers 5.x, LeRobot >= 0.5): ``min(i * (1 / n), 1 - 1e-6)``, which gives
      [0, 1, ..., n-1] on a full grid. transformers <= 4.54 (LeRobot 0.3.x, SmolVLA's pretraining) reached
      the same ids on power-of-two grids (SmolVLA's 32) by another rule that differs on some other n.
    """
    if convention not in VISION_POSITION_IDS:
        raise ValueError(f"vision position-id convention must be one of {VISION_POSITION_IDS}, got {convention!r}")
    bounds = torch.arange(1 / side, 1.0, 1 / side)  # [side - 1] f32

    def coords(n: int) -> torch.Tensor:  # [n] f32
        i = torch.arange(n, dtype=torch.float32)
        if convention == "legacy":
            return i / torch.tensor(n) * (1 - 1e-6)
        return torch.clamp(i * (1.0 / torch.tensor(n)), max=1.0 - 1e-6)

    rows = torch.bucketize(coords(grid_h), bounds, right=True)
    cols = torch.bucketize(coords(grid_w), bounds, right=True)
    return (rows[:, None] * side + cols).flatten()


class VisionEncoder(nn.Module):
    """The SigLIP vision tower: pixels [B, 3, S, S] in [-1, 1] -> patch features [B, N, vision_hidden]
    (N = (S / patch)^2, after the post-layernorm). The connector (``Connector``) maps them to text tokens.

    ``position_ids`` is the convention of ``patch_position_ids``: the position table is gathered with it once.
    """

    def __init__(self, cfg: VlmConfig, ops, w, position_ids: str):
        super().__init__()
        v = cfg.vision
        self.patch = ops.build("patch_embed", "vision.patch_embedding", "vision_patch", f"p{v.patch}x{v.hidden}",
                               weight=w("embeddings.patch_embedding.weight", v.hidden, 3, v.patch, v.patch),
                               bias=w("embeddings.patch_embedding.bias", v.hidden))
        pos = w("embeddings.position_embedding.weight", v.grid * v.grid, v.hidden)
        # positions are static for a fixed input size: gather the table once, in the chosen convention
        ids = patch_position_ids(v.grid, v.grid, v.grid, position_ids)
        self.register_buffer("pos", pos[ids].clone(), persistent=False)  # [N, H]
        self.layers = nn.ModuleList(SiglipLayer(v, ops, w.scoped(f"encoder.layers.{i}."), f"vision.layers.{i}")
                                    for i in range(v.layers))
        self.post_norm = ops.layer_norm("vision.post_layernorm", "vision_norm", w("post_layernorm.weight", v.hidden),
                                        w("post_layernorm.bias", v.hidden), v.eps)

    def forward(self, pixels):
        x = self.patch(pixels)
        x = x + self.pos.to(x.dtype)  # a bf16 vision stage stays bf16
        for layer in self.layers:
            x = layer(x)
        return self.post_norm(x)


class Connector(nn.Module):
    def __init__(self, cfg: VlmConfig, ops, w):
        super().__init__()
        s = cfg.scale_factor
        self.shuffle = ops.build("pixel_shuffle", "connector.pixel_shuffle", "connector_shuffle", f"s{s}", scale=s)
        d_in = cfg.vision.hidden * s * s
        self.proj = ops.linear("connector.proj", "connector_proj",
                               [(w("modality_projection.proj.weight", cfg.text.hidden, d_in), None)])

    def forward(self, x):  # [B, N, Hv] -> [B, N/s^2, Ht]
        return self.proj(self.shuffle(x))

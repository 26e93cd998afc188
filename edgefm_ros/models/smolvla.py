"""SmolVLA: vision-language prefix + flow-matching action expert (LeRobot 0.4.4 / 0.6.x semantics)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import SmolVLAConfig, VlmConfig, expert_inner
from .expert import ExpertLayer
from .siglip import Connector, VisionEncoder
from .smollm import SmolLM


def sinusoidal_time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """t [B] f32 -> [B, dim] f32; computed in float64 then cast, as LeRobot does."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    scale = 1.0 / period * 2 * math.pi
    angle = scale[None, :] * t[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(torch.float32)


class SmolVLA(nn.Module):
    """``vision_position_ids``: "legacy" or "fixed" (siglip.patch_position_ids), fixed for the model's life."""

    def __init__(self, cfg: SmolVLAConfig, vlm: VlmConfig, ops, weights, vision_position_ids: str):
        super().__init__()
        self.cfg, self.vlm_cfg = cfg, vlm
        text = vlm.text
        self.hidden = text.hidden
        self.expert_hidden = int(text.hidden * cfg.expert_width_multiplier)
        inner = expert_inner(self.expert_hidden)
        root = weights.scoped("model.")
        vw = root.scoped("vlm_with_expert.vlm.model.")
        self.vision = VisionEncoder(vlm, ops, vw.scoped("vision_model."), vision_position_ids)
        self.connector = Connector(vlm, ops, vw.scoped("connector."))
        self.text = SmolLM(text, cfg.num_vlm_layers, ops, vw.scoped("text_model."))
        ew = root.scoped("vlm_with_expert.lm_expert.")
        self.expert = nn.ModuleList(
            ExpertLayer(text, self.expert_hidden, inner, cfg.is_cross_layer(i), ops, ew.scoped(f"layers.{i}."),
                        f"expert.layers.{i}") for i in range(cfg.num_vlm_layers))
        self.expert_norm = ops.rms_norm("expert.norm", "expert_norm", ew("norm.weight", self.expert_hidden), text.eps)
        he = self.expert_hidden

        def proj(name, role, d_out, d_in):
            return ops.linear(name, role, [(root(f"{name}.weight", d_out, d_in), root(f"{name}.bias", d_out))])

        self.state_proj = proj("state_proj", "state_proj", text.hidden, cfg.max_state_dim)
        self.action_in = proj("action_in_proj", "action_in_proj", he, cfg.max_action_dim)
        w_in, b_in = root("action_time_mlp_in.weight", he, 2 * he), root("action_time_mlp_in.bias", he)
        # cat([a, t]) @ W^T + b == a @ W_a^T + (t @ W_t^T + b): the time half is constant per step
        self.action_time_in = ops.linear("action_time_mlp_in.action", "action_time_mlp", [(w_in[:, :he], None)])
        self.time_in_weight, self.time_in_bias = w_in[:, he:], b_in
        self.action_time_out = proj("action_time_mlp_out", "action_time_mlp", he, he)
        self.action_out = proj("action_out_proj", "action_out_proj", cfg.max_action_dim, he)

    # ---- prefix -------------------------------------------------------------------------------------
    def embed_images(self, pixels):
        """pixels [N, 3, S, S] in [-1, 1] -> [N, T, H] image tokens scaled by sqrt(H)."""
        x = self.connector(self.vision(pixels))
        return x * torch.tensor(x.shape[-1] ** 0.5, dtype=x.dtype, device=x.device)

    def embed_language(self, tokens):
        """tokens [B, L] i64 -> [B, L, H] scaled by sqrt(H)."""
        x = F.embedding(tokens, self.text.token_embedding)
        return x * math.sqrt(x.shape[-1])

    def embed_state(self, state):
        """state [B, max_state_dim] normalised -> [B, 1, H]."""
        return self.state_proj(state)[:, None, :]

    # ---- suffix -------------------------------------------------------------------------------------
    def time_terms(self, t: torch.Tensor) -> torch.Tensor:
        """t [S] f32 timesteps -> [S, He]: the time half of action_time_mlp_in, bias included."""
        emb = sinusoidal_time_embedding(t, self.expert_hidden, self.cfg.min_period, self.cfg.max_period)
        return F.linear(emb, self.time_in_weight, self.time_in_bias)

    def velocity(self, x_t, time_term, contexts, rope_self, rope_cross, mask_self, mask_cross):
        """x_t [B, C, A] -> v_t [B, C, A].

        time_term [He] (one step's constant); contexts: per expert layer (k, v) [B, Hkv, P, D];
        rope_*: rotary tables of the action tokens' positions; mask_self bool [B, C, P + C],
        mask_cross bool [B, C, P].
        """
        h = F.silu(self.action_time_in(self.action_in(x_t)) + time_term)
        h = self.action_time_out(h)
        for layer, (k, v) in zip(self.expert, contexts):
            if layer.cross:
                h = layer(h, rope_cross, k, v, mask_cross)
            else:
                h = layer(h, rope_self, k, v, mask_self)
        return self.action_out(self.expert_norm(h))

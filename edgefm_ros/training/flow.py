"""LeRobot SmolVLA's flow-matching objective.

Time t ~ Beta(alpha=1.5, beta=1.0) * 0.999 + 0.001 (mass towards t = 1, the noise end; never exactly
0), Gaussian noise, the straight path x_t = t * noise + (1 - t) * actions and its velocity target
u_t = noise - actions. Inference integrates dx/dt = v from t = 1 to 0 with Euler steps dt = -1/N.
The loss is the squared error over the real action dimensions (the zero padding up to max_action_dim
is cropped) and the in-episode chunk steps (``action_is_pad`` masks the steps past an episode's end),
averaged over the valid entries (LeRobot's current ``forward``; 0.4.4 read the mask under a misspelt
key and so averaged over every step and all max_action_dim dimensions).
"""
from __future__ import annotations

import torch

BETA_ALPHA = 1.5  # torch.distributions.Beta(concentration1=1.5, concentration0=1.0), as LeRobot
TIME_SCALE, TIME_OFFSET = 0.999, 0.001


def sample_time(batch: int, generator: torch.Generator) -> torch.Tensor:
    """[batch] f32 in [0.001, 1]: Beta(1.5, 1) * 0.999 + 0.001.

    Beta(a, 1) has CDF x^a, so x = U^(1/a) draws it exactly from one uniform (seeded by ``generator``)."""
    u = torch.rand(batch, generator=generator, dtype=torch.float64)
    beta = u.pow(1.0 / BETA_ALPHA)  # inverse CDF of Beta(BETA_ALPHA, 1)
    return (beta * TIME_SCALE + TIME_OFFSET).to(torch.float32)


def sample_noise(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def noisy_actions(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """actions, noise [B, C, A], t [B] (one time per sample) or [B, C] (per action) -> (x_t, u_t) [B, C, A]."""
    te = t[:, None, None] if t.ndim == 1 else t[..., None]
    return te * noise + (1 - te) * actions, noise - actions


def sample_prefix(batch: int, max_rows: int, generator: torch.Generator) -> torch.Tensor:
    """[batch] i64 uniform in {0..max_rows}: how many of each chunk's first actions are given (training-time
    real-time chunking: the rows that execute while the next chunk is computed)."""
    return torch.randint(0, max_rows + 1, (batch,), generator=generator)


def prefix_time(t: torch.Tensor, given: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t [B] flow times, given [B] prefix lengths -> (per-action times [B, C]: 0 on the given prefix, clean,
    t after it; bool [B, C], True on the prefix, which the loss leaves out)."""
    mask = torch.arange(chunk)[None, :] < given[:, None]
    return torch.where(mask, torch.zeros((), dtype=t.dtype), t[:, None].expand(-1, chunk)), mask


def flow_loss(v_t: torch.Tensor, u_t: torch.Tensor, is_pad: torch.Tensor, action_dim: int) -> torch.Tensor:
    """Mean squared velocity error over valid (step, real action dim) entries. v_t, u_t [B, C, A],
    is_pad bool [B, C] -> scalar."""
    err = (v_t[..., :action_dim] - u_t[..., :action_dim]).pow(2)  # [B, C, D]
    valid = (~is_pad).to(err.dtype)[..., None]
    n = (valid.sum() * action_dim).clamp_min(1.0)
    return (err * valid).sum() / n

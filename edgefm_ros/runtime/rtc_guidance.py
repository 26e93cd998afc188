"""Real-time chunking (RTC): flow-matching decode guided toward the previous chunk's actions.

    rtc = RtcConfig(schedule="LINEAR", execution_horizon=10)             # once, at engine build
    inputs = rtc_inputs(prev_norm, delay=3, config=rtc, chunk=50, width=32)  # per chunk, static shapes
    x = engine.decode(prefix, noise, inputs)

Per Euler step k (t = 1 + k * dt runs from 1 to 0, tau = 1 - t), with v = v_t(x):
    x1 = x - t * v                       the step's estimate of the clean chunk
    e  = (A_prev - x1) * W               W [C]: 1 on the delay, a ramp to the horizon, 0 after it
    w  = min((1 - tau) / tau * ((1 - tau)^2 + tau^2) / (1 - tau)^2, beta)     (beta at tau = 0)
    v' = v - w * g,  g = e ("constant": v treated as independent of x, LeRobot's form)
                     g = (d x1 / d x)^T e ("vjp": the RTC paper's form, one backward pass through the expert)
    x <- x + dt * v'
A_prev and W always have the chunk's full shape (zero padded), so a captured decode graph replays for
any delay and prefix length. Algorithm facts from LeRobot 0.4.4's RTCProcessor (policies/rtc/).

A checkpoint trained to be given its first actions (`edgefm-vla train --rtc-prefix-max`, training-time RTC)
takes the "prefix" form instead: W is 1 on the d = delay rows that execute while the chunk is computed and 0
after them; every step sets those rows to A_prev, clean, with their flow time 0 (the time embedding is per
action), and integrates the others as usual; no guidance weight, no backward pass. "auto", the default, is
"prefix" for such a checkpoint (its edgefm_numerics.json records rtc_prefix_max) and "constant" otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

SCHEDULES = ("ZEROS", "ONES", "LINEAR", "EXP")
GUIDANCE_FORMS = ("auto", "constant", "vjp", "prefix")


@dataclass(frozen=True)
class RtcConfig:
    schedule: str = "LINEAR"  # prefix weights over the chunk: ZEROS | ONES | LINEAR | EXP
    max_guidance_weight: float = 10.0  # beta, the cap of the per-step guidance weight
    execution_horizon: int = 10  # H: positions at and after H get weight 0
    # auto (prefix where the checkpoint was trained for it, else constant) | constant (g = e, no backward) |
    # vjp (paper: g = J^T e) | prefix (the delay's rows given, clean: training-time RTC)
    guidance: str = "auto"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"RtcConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.guidance not in GUIDANCE_FORMS:
            raise ValueError(f"RtcConfig.guidance must be one of {GUIDANCE_FORMS}, got {self.guidance!r}")
        if not (isinstance(self.max_guidance_weight, (int, float)) and math.isfinite(self.max_guidance_weight)
                and self.max_guidance_weight > 0):
            raise ValueError(f"RtcConfig.max_guidance_weight must be a finite number > 0, "
                             f"got {self.max_guidance_weight!r}")
        if not isinstance(self.execution_horizon, int) or isinstance(self.execution_horizon, bool) \
                or self.execution_horizon < 1:
            raise ValueError(f"RtcConfig.execution_horizon must be an integer >= 1, got {self.execution_horizon!r}")


@dataclass
class RtcInputs:
    """What a guided decode reads; fixed shapes whatever the delay and prefix length."""

    prev: torch.Tensor  # f32 [B, C, max_action_dim]: A_prev, normalised, zero padded
    weights: torch.Tensor  # f32 [B, C, 1]: W


def prefix_weights(schedule: str, delay: int, horizon: int, total: int) -> np.ndarray:
    """W [total] f32: 1 on [0, d), the schedule's values on [d, H), 0 on [H, total); d = min(delay, H)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if delay < 0 or horizon < 0 or total < 1:
        raise ValueError(f"need delay >= 0, horizon >= 0, total >= 1; got {delay}, {horizon}, {total}")
    h = min(horizon, total)
    d = min(delay, h)
    w = np.zeros(total, dtype=np.float64)
    if schedule == "ONES":
        w[:h] = 1.0
        return w.astype(np.float32)
    w[:d] = 1.0
    if schedule == "ZEROS" or h <= d:
        return w.astype(np.float32)
    n = h - d  # interior points of a ramp from 1 (at d - 1) to 0 (at h)
    ramp = np.linspace(1.0, 0.0, n + 2, dtype=np.float64)[1:-1]
    if schedule == "EXP":
        ramp = ramp * np.expm1(ramp) / (math.e - 1.0)
    w[d:h] = ramp
    return w.astype(np.float32)


def guidance_weight(t: float, max_weight: float) -> float:
    """w(t) = min(c * r, beta) with tau = 1 - t, c = (1 - tau) / tau, r = ((1 - tau)^2 + tau^2) / (1 - tau)^2."""
    tau = 1.0 - t
    if tau <= 0.0:
        return float(max_weight)
    if tau >= 1.0:  # t = 0: c = 0 (never reached by the Euler loop, which stops before t = 0)
        return 0.0
    c = (1.0 - tau) / tau
    r = ((1.0 - tau) ** 2 + tau ** 2) / (1.0 - tau) ** 2
    return float(min(c * r, max_weight))


def rtc_inputs(prev: torch.Tensor | np.ndarray, delay: int, config: RtcConfig, chunk: int, width: int) -> RtcInputs:
    """prev [n, a] or [B, n, a] normalised actions (n <= chunk, a <= width) -> padded RtcInputs.

    As LeRobot does, the horizon is cut to the prefix's length n (beyond it there is nothing to follow). The
    "prefix" form gives exactly the first min(delay, n) rows: W is 1 on them and 0 after."""
    p = torch.as_tensor(np.asarray(prev, dtype=np.float32) if not isinstance(prev, torch.Tensor) else prev).float()
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3:
        raise ValueError(f"rtc prefix must have shape [n, a] or [B, n, a], got {tuple(p.shape)}")
    b, n, a = p.shape
    if n < 1 or n > chunk or a < 1 or a > width:
        raise ValueError(f"rtc prefix shape {tuple(p.shape)}: need 1 <= n <= {chunk} actions of "
                         f"1 <= a <= {width} values")
    if not torch.isfinite(p).all():
        raise ValueError("rtc prefix holds non-finite values")
    if not isinstance(delay, (int, np.integer)) or delay < 0:
        raise ValueError(f"rtc delay must be an integer >= 0 (control ticks), got {delay!r}")
    padded = torch.zeros(b, chunk, width, dtype=torch.float32)
    padded[:, :n, :a] = p
    w = (prefix_weights("ZEROS", int(delay), n, chunk) if config.guidance == "prefix"
         else prefix_weights(config.schedule, int(delay), min(config.execution_horizon, n), chunk))
    return RtcInputs(padded, torch.from_numpy(w)[None, :, None].expand(b, chunk, 1).contiguous())


def guided_velocity(x: torch.Tensor, v: torch.Tensor, t: float, w: float | torch.Tensor, inp: RtcInputs,
                    vjp=None) -> torch.Tensor:
    """v' = v - w * g for one Euler step. x, v f32 [B, C, A]. ``vjp(e)``: (d x1 / d x)^T e for the paper's
    form (None: LeRobot's g = e)."""
    e = (inp.prev - (x - t * v)) * inp.weights
    g = e if vjp is None else vjp(e)
    return v - w * g

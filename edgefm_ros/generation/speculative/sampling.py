"""Speculative sampling: accept or replace drafted tokens so the output follows the target's distribution.

One candidate x drawn from the draft distribution q, target distribution p: accept x with probability
min(1, p(x) / q(x)); on rejection draw from normalize(max(p - q, 0)). Then P(out = y) = min(p(y), q(y))
+ (1 - sum_z min(p(z), q(z))) * max(p(y) - q(y), 0) / sum_z max(p(z) - q(z), 0) = p(y).

Several candidates at one tree node (``accept_among``) are tried in turn, each against the residual
left by the rejections before it (recursive rejection sampling, SpecInfer / EAGLE). A candidate chosen
deterministically (the draft's top-k) is a draw from the point mass on it: q = one_hot(x), accepted
with probability p(x), and its rejection leaves p with x removed, renormalised. If none is accepted,
the token is drawn from the final residual; if one is, the walk continues at that node with the
target's distribution there.

Greedy decoding is the temperature-0 case: p = one_hot(argmax), the uniform draw is replaced by 0, so
a candidate is accepted iff it is the target's argmax and the residual's draw is that argmax.
"""
from __future__ import annotations

import torch

from ..generate import SamplingConfig, sampling_probs


def target_dist(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """logits [..., V] -> the distribution plain decoding samples from [..., V] f32 (one-hot when greedy)."""
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    p = sampling_probs(logits, s)
    return p / p.sum(-1, keepdim=True)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(p - q, 0)) row-wise [..., V]; rows with no mass left keep p (rejection was impossible)."""
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)


def accept_among(p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor):
    """Recursive rejection sampling of one node's candidates, for N independent rows.

    p [N, V] target distribution, x [N, m] i64 candidates in the order tried, q [N, m, V] the draft
    distribution each was drawn from (None: each is a deterministic choice, q = one_hot(x)), u [N, m]
    uniform draws in [0, 1) (zeros: greedy). -> (index [N] i64 of the accepted candidate or -1,
    residual [N, V] to draw the token from where none was accepted).
    """
    n, m = x.shape
    idx = torch.full((n,), -1, dtype=torch.long)
    for i in range(m):
        live = idx < 0
        xi = x[:, i:i + 1]
        px = p.gather(1, xi)[:, 0]
        if q is None:
            qi, qx = None, torch.ones_like(px)
        else:
            qi = q[:, i]
            qx = qi.gather(1, xi)[:, 0]
        ok = live & (u[:, i] * qx < px)  # probability min(1, px / qx)
        idx = torch.where(ok, torch.full_like(idx, i), idx)
        rej = live & ~ok
        if bool(rej.any()):
            if qi is None:
                qi = torch.zeros_like(p).scatter_(1, xi, 1.0)
            p = torch.where(rej[:, None], residual(p, qi), p)
    return idx, p


def draw(p: torch.Tensor, greedy: bool, gen: torch.Generator | None) -> int:
    """One token from p [V]: its argmax when greedy, else a sample."""
    if greedy:
        return int(torch.argmax(p))
    return int(torch.multinomial(p, 1, generator=gen))

"""Speculative sampling keeps the target distribution: the accept / resample step on small explicit p / q
(fresh each run), many draws, a 5-sigma bound per token; wrong rules are shown to break the same bound."""
import math

import torch

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.generation.speculative import accept_among, residual, target_dist

N = 300_000
Z = 5.0  # per-token bound in binomial standard deviations (false alarm < 1e-5 per test)


def z_max(tokens: torch.Tensor, p: torch.Tensor) -> float:
    f = torch.bincount(tokens, minlength=p.numel()).double() / tokens.numel()
    sd = (p.double() * (1 - p.double()) / tokens.numel()).sqrt().clamp_min(1.0 / tokens.numel())
    return float(((f - p.double()).abs() / sd).max())


def expected_z(w: torch.Tensor, p: torch.Tensor) -> float:
    """How many standard deviations a rule producing distribution w sits from p after N draws."""
    sd = (p * (1 - p) / N).sqrt().clamp_min(1.0 / N)
    return float(((w - p).abs() / sd).max())


def fresh_pq(v: int, wrong_dist, min_z: float = 25.0):
    """Random p, q (Dirichlet) for which the wrong rule's distribution is clearly off (the test has power)."""
    d = torch.distributions.Dirichlet(torch.full((v,), 0.8))
    while True:
        p, q = d.sample(), d.sample()
        if float(p.min()) > 1e-3 and float(q.min()) > 1e-3 and expected_z(wrong_dist(p, q), p) > min_z:
            return p, q


def finish(x: torch.Tensor, idx: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """The emitted token: the accepted candidate, else a draw from the residual."""
    drawn = torch.multinomial(rest, 1)[:, 0]
    return torch.where(idx >= 0, x.gather(1, idx.clamp_min(0)[:, None])[:, 0], drawn)


def test_single_candidate_rule_preserves_p():
    v = int(torch.randint(4, 9, ()))
    # a common bug: resampling from p itself after a rejection gives min(p, q) + (1 - sum min) p
    wrong = lambda p, q: torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * p  # noqa: E731
    p, q = fresh_pq(v, wrong)
    x = torch.multinomial(q, N, replacement=True)[:, None]
    u = torch.rand(N, 1)
    idx, rest = accept_among(p.expand(N, v), x, q.expand(N, 1, v), u)
    out = finish(x, idx, rest)
    assert z_max(out, p) < Z, (p, q)
    acc = float((idx >= 0).double().mean())
    assert abs(acc - float(torch.minimum(p, q).sum())) < Z * (0.25 / N) ** 0.5  # acceptance = 1 - TV(p, q)
    bad = torch.where(idx >= 0, x[:, 0], torch.multinomial(p, N, replacement=True))
    assert z_max(bad, p) > Z  # the bound catches the wrong rule
    assert z_max(x[:, 0], p) > Z  # and accepting every draft token


def test_deterministic_candidates_preserve_p():
    """A tree node's top-k children (point masses) tried in turn, each against the residual before it."""
    v = int(torch.randint(5, 9, ()))
    m = int(torch.randint(2, 4, ()))

    def wrong(p, q):  # rejections that do not remove the rejected candidate from p
        cand = torch.topk(q, m).indices
        w, left = torch.zeros_like(p), 1.0
        for c in cand:
            w[c] += left * p[c]
            left *= 1 - p[c]
        return w + left * p

    p, q = fresh_pq(v, wrong)
    cand = torch.topk(q, m).indices  # the draft's ranked choices
    x = cand.expand(N, m)
    idx, rest = accept_among(p.expand(N, v), x, None, torch.rand(N, m))
    assert z_max(finish(x, idx, rest), p) < Z
    assert abs(float((idx >= 0).double().mean()) - float(p[cand].sum())) < Z * (0.25 / N) ** 0.5
    # the wrong rule, simulated: accept candidate i with p(x_i), else fall back to p
    u = torch.rand(N, m)
    hit = u < p[cand]
    first = torch.where(hit.any(1), hit.float().argmax(1), torch.full((N,), -1))
    bad = torch.where(first >= 0, cand[first.clamp_min(0)], torch.multinomial(p, N, replacement=True))
    assert z_max(bad, p) > Z


def test_iid_draft_candidates_preserve_p():
    """Recursive rejection sampling with m candidates drawn independently from q."""
    v, m = int(torch.randint(4, 8, ())), 3
    p, q = fresh_pq(v, lambda p, q: q)  # (power check against "always accept": q itself)
    x = torch.multinomial(q, N * m, replacement=True).view(N, m)
    idx, rest = accept_among(p.expand(N, v), x, q.expand(N, m, v), torch.rand(N, m))
    assert z_max(finish(x, idx, rest), p) < Z


def test_greedy_is_the_zero_temperature_case():
    v = 50
    logits = torch.randn(7, v)
    p = target_dist(logits, SamplingConfig())
    assert torch.equal(p.argmax(-1), logits.argmax(-1)) and torch.equal(p.sum(-1), torch.ones(7))
    x = torch.randint(0, v, (7, 3))
    x[:3, 1] = logits.argmax(-1)[:3]  # rows 0-2: the argmax is the second candidate
    x[:3, 0] = (logits.argmax(-1)[:3] + 1) % v
    idx, rest = accept_among(p, x, None, torch.zeros(7, 3))
    assert idx[:3].tolist() == [1, 1, 1]
    for r in range(3, 7):
        hit = (x[r] == logits[r].argmax()).nonzero().flatten().tolist()
        assert int(idx[r]) == (hit[0] if hit else -1)
        if not hit:
            assert int(rest[r].argmax()) == int(logits[r].argmax()) and float(rest[r].max()) == 1.0


def filtered_dist(row: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """Temperature, top-k, then top-p (the smallest head of the sorted distribution whose mass reaches
    top_p), renormalised: written out token by token in float64, independent of the runtime's code."""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept = order[:top_k] if top_k else order
    m = max(row[i] for i in kept)
    w = {i: math.exp((row[i] - m) / temperature) for i in kept}
    z = sum(w.values())
    head, mass = [], 0.0
    for i in kept:  # descending probability
        if mass >= top_p:
            break
        head.append(i)
        mass += w[i] / z
    total = sum(w[i] for i in head)
    return [w[i] / total if i in head else 0.0 for i in range(len(row))]


def test_target_dist_and_residual():
    logits = torch.randn(3, 40) * 3
    s = SamplingConfig(temperature=0.7, top_p=0.8, top_k=12)
    p = target_dist(logits, s)
    want = torch.tensor([filtered_dist(r, 0.7, 12, 0.8) for r in logits.double().tolist()], dtype=torch.float64)
    torch.testing.assert_close(p.double(), want, rtol=0, atol=1e-6)
    for row, probs in zip(logits, p):  # what is kept is the nucleus of the top 12 logits, counted directly
        kept = probs > 0
        top = torch.softmax(row.double().sort(descending=True).values[:12] / 0.7, -1)
        nucleus = int((top.cumsum(-1) < 0.8).sum()) + 1  # the fewest of them whose mass reaches top_p
        assert int(kept.sum()) == min(nucleus, 12)
        assert row[kept].min() > row[~kept].max()
    q = torch.softmax(torch.randn(3, 40), -1)
    r = residual(p, q)
    excess = (p.double() - q.double()).clamp_min(0)  # the rejection rule's residual, max(p - q, 0) normalised
    torch.testing.assert_close(r.double(), excess / excess.sum(-1, keepdim=True), rtol=0, atol=1e-6)
    assert torch.equal(residual(p, p), p)  # nothing left: rejection was impossible, keep p

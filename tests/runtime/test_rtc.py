"""Real-time chunking in the engine's decode, against a straightforward re-implementation written here.

Inputs (noise, previous chunk, delay) are drawn fresh each run; the seed is in the assertion messages."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.preprocess import InputError
from edgefm_ros.runtime.rtc_guidance import RtcConfig, guided_velocity, prefix_weights, rtc_inputs
from skips import gpu_mark


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % (2**31))


def ref_weights(schedule, d, h, total):
    """W by the definition, one position at a time."""
    h = min(h, total)
    d = min(d, h)
    out = []
    for i in range(total):
        if schedule == "ONES":
            out.append(1.0 if i < h else 0.0)
        elif i < d:
            out.append(1.0)
        elif i >= h or schedule == "ZEROS":
            out.append(0.0)
        else:
            r = 1.0 - (i - d + 1) / (h - d + 1)  # interior points of the ramp 1 -> 0 over [d - 1, h]
            out.append(r * (math.exp(r) - 1.0) / (math.e - 1.0) if schedule == "EXP" else r)
    return np.array(out)


def ref_w(t, beta):
    tau = 1.0 - t
    if tau == 0.0:
        return beta
    return min((1.0 - tau) / tau * ((1.0 - tau) ** 2 + tau ** 2) / (1.0 - tau) ** 2, beta)


def ref_decode(engine, prefix, noise, prev, weights, beta, vjp=False):
    """The guided Euler loop by the formulas; prev [B, C, A], weights [C]."""
    cfg, ex = engine.model_config, engine.act["expert"]
    n = cfg.num_steps
    w_pos = torch.as_tensor(weights, dtype=torch.float32)[None, :, None]
    x = noise.clone()
    for k in range(n):
        t = 1.0 - k / n

        def vel(xk):
            return engine.model.velocity(ex(xk), engine.time_terms[k], prefix.contexts, prefix.rope_self,
                                         prefix.rope_cross, prefix.mask_self, prefix.mask_cross).float()
        with torch.no_grad():
            v = vel(x)
        e = (prev - (x - t * v)) * w_pos
        if vjp:  # (d(x - t v(x))/dx)^T e = e - t J_v^T e
            _, jt_e = torch.autograd.functional.vjp(vel, x, e)
            g = e - t * jt_e
        else:
            g = e
        x = x + (-1.0 / n) * (v - ref_w(t, beta) * g)
    return x


@pytest.fixture(scope="module")
def setup(exact_engine):
    e = exact_engine
    inp = e.inputs_from_observation(e.synthetic_observation(3))
    return e, inp, e.prefill(inp)


def test_config_rejects_bad_values():
    for kw, name in [({"schedule": "linear"}, "schedule"), ({"guidance": "exact"}, "guidance"),
                     ({"max_guidance_weight": 0.0}, "max_guidance_weight"),
                     ({"max_guidance_weight": float("nan")}, "max_guidance_weight"),
                     ({"execution_horizon": 0}, "execution_horizon"),
                     ({"execution_horizon": 2.5}, "execution_horizon")]:
        with pytest.raises(ValueError, match=name):
            RtcConfig(**kw)


@pytest.mark.parametrize("schedule", ["ZEROS", "ONES", "LINEAR", "EXP"])
def test_prefix_weights_match_definition(schedule):
    rng = np.random.default_rng(_seed())
    for _ in range(50):
        total = int(rng.integers(1, 60))
        h, d = int(rng.integers(0, 70)), int(rng.integers(0, 70))
        np.testing.assert_allclose(prefix_weights(schedule, d, h, total), ref_weights(schedule, d, h, total),
                                   atol=1e-7, err_msg=f"{schedule} d={d} H={h} total={total}")
    w = prefix_weights("LINEAR", 2, 6, 10)
    np.testing.assert_allclose(w, [1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0, 0, 0], atol=1e-7)


def test_guided_decode_matches_reference_loop(setup):
    e, inp, prefix = setup
    cfg = e.model_config
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    c, a = cfg.chunk_size, cfg.max_action_dim
    for _ in range(3):
        noise = torch.randn(1, c, a, generator=g)
        n_prev = int(torch.randint(1, c + 1, (1,), generator=g))
        delay = int(torch.randint(0, c + 2, (1,), generator=g))
        prev = torch.randn(n_prev, cfg.action_dim, generator=g)
        inputs = rtc_inputs(prev, delay, e.rtc, c, a)
        got = e.decode(prefix, noise, rtc=inputs)
        padded = torch.zeros(1, c, a)
        padded[0, :n_prev, :cfg.action_dim] = prev
        w = ref_weights(e.rtc.schedule, delay, min(e.rtc.execution_horizon, n_prev), c)
        want = ref_decode(e, prefix, noise, padded, w, e.rtc.max_guidance_weight)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5,
                                   msg=lambda m: f"seed {seed} n={n_prev} d={delay}: {m}")


def test_delayed_actions_track_previous_chunk(setup):
    """The first d actions follow A_prev (a real chunk of the model, from other noise) far more closely
    than the unguided chunk does."""
    e, inp, prefix = setup
    cfg = e.model_config
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    c, a = cfg.chunk_size, cfg.max_action_dim
    prev = e.decode(prefix, torch.randn(1, c, a, generator=g))[0, :, :cfg.action_dim]
    noise = torch.randn(1, c, a, generator=g)
    free = e.decode(prefix, noise)[0, :, :cfg.action_dim]
    for d in (1, 3, min(5, c)):
        guided = e.decode(prefix, noise, rtc=rtc_inputs(prev, d, e.rtc, c, a))[0, :, :cfg.action_dim]
        err_g = (guided[:d] - prev[:d]).abs().max().item()
        err_f = (free[:d] - prev[:d]).abs().max().item()
        assert err_g < 0.25 * err_f, f"seed {seed} d={d}: guided {err_g:.3f} vs unguided {err_f:.3f}"


def test_no_prefix_and_zero_weights_are_bitwise_unguided(setup):
    e, inp, prefix = setup
    cfg = e.model_config
    seed = _seed()
    noise = torch.randn(1, cfg.chunk_size, cfg.max_action_dim, generator=torch.Generator().manual_seed(seed))
    free = e.sample(inp, noise)
    assert torch.equal(free, e.decode(prefix, noise))
    # ZEROS with delay 0: every weight is 0, the guidance adds exactly nothing
    z = Engine(e.ckpt, dataclasses.replace(e.config, rtc=RtcConfig(schedule="ZEROS")), e.hardware)
    prev = torch.randn(cfg.chunk_size, cfg.action_dim)
    assert torch.equal(free, z.sample(inp, noise, rtc_inputs(prev, 0, z.rtc, cfg.chunk_size, cfg.max_action_dim)))
    # ... and a positive delay does change the chunk
    assert not torch.equal(free, z.sample(inp, noise, rtc_inputs(prev, 2, z.rtc, cfg.chunk_size, cfg.max_action_dim)))


def test_predict_takes_raw_prefix(setup):
    """predict(rtc_prefix in raw units) normalises it: a prefix equal to a previous chunk's raw actions pulls
    the first d raw actions onto it."""
    e, inp, prefix = setup
    cfg = e.model_config
    obs = e.synthetic_observation(3)
    rng = np.random.default_rng(_seed())
    prev = e.predict(obs, noise=rng.standard_normal((cfg.chunk_size, cfg.max_action_dim)).astype(np.float32))
    noise = rng.standard_normal((cfg.chunk_size, cfg.max_action_dim)).astype(np.float32)
    free = e.predict(obs, noise=noise)
    guided = e.predict(obs, noise=noise, rtc_prefix=prev.actions, rtc_delay=2)
    err_g = np.abs(guided.actions[:2] - prev.actions[:2]).max()
    err_f = np.abs(free.actions[:2] - prev.actions[:2]).max()
    assert err_g < 0.25 * err_f, (err_g, err_f)
    with pytest.raises(InputError, match="rtc_prefix"):
        e.predict(obs, rtc_prefix=np.zeros((2, cfg.action_dim + 1), np.float32))
    with pytest.raises(InputError, match="non-finite"):
        e.predict(obs, rtc_prefix=np.full((2, cfg.action_dim), np.nan, np.float32))
    with pytest.raises(InputError, match="delay"):
        e.predict(obs, rtc_prefix=np.zeros((2, cfg.action_dim), np.float32), rtc_delay=-1)


def test_vjp_guidance_matches_autograd_jacobian():
    """guided_velocity's vjp form on a small differentiable velocity: g = (I - t J_v)^T e, J_v built in full."""
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    b, c, a = 1, 5, 3
    w1, w2 = torch.randn(c * a, 16, generator=g), torch.randn(16, c * a, generator=g)

    def vel(x):
        return torch.tanh(x.reshape(b, -1) @ w1) @ w2 / 4

    x = torch.randn(b, c, a, generator=g)
    t = 0.7
    inp = rtc_inputs(torch.randn(c - 1, a, generator=g), 2, RtcConfig(execution_horizon=4), c, a)
    xg = x.clone().requires_grad_(True)
    v = vel(xg).reshape(b, c, a)
    x1 = xg - t * v
    got = guided_velocity(x, v.detach(), t, 3.0, inp, lambda e: torch.autograd.grad(x1, xg, e)[0])
    jac = torch.autograd.functional.jacobian(lambda z: vel(z.reshape(b, c, a)).reshape(-1), x.reshape(-1))  # [CA, CA]
    e = ((inp.prev - (x - t * v.detach())) * inp.weights).reshape(-1)
    want = v.detach().reshape(-1) - 3.0 * (e - t * (jac.T @ e))
    torch.testing.assert_close(got.reshape(-1), want, atol=1e-5, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")


@pytest.fixture(scope="module")
def reference_vjp_engine(tiny):
    return Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="reference", vision_position_ids="legacy",
                                  rtc=RtcConfig(guidance="vjp"))


def test_vjp_decode_matches_reference_loop(reference_vjp_engine):
    e = reference_vjp_engine
    cfg = e.model_config
    c, a = cfg.chunk_size, cfg.max_action_dim
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    prefix = e.prefill(e.inputs_from_observation(e.synthetic_observation(5)))
    noise = torch.randn(1, c, a, generator=g)
    prev = torch.randn(c, cfg.action_dim, generator=g)
    got = e.decode(prefix, noise, rtc=rtc_inputs(prev, 2, e.rtc, c, a))
    padded = torch.zeros(1, c, a)
    padded[0, :, :cfg.action_dim] = prev
    want = ref_decode(e, prefix, noise, padded, ref_weights("LINEAR", 2, e.rtc.execution_horizon, c),
                      e.rtc.max_guidance_weight, vjp=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")
    # the Jacobian term matters: the constant form gives another chunk
    const = Engine(e.ckpt, dataclasses.replace(e.config, rtc=RtcConfig()), e.hardware)
    assert (const.decode(prefix, noise, rtc=rtc_inputs(prev, 2, const.rtc, c, a)) - got).abs().max() > 1e-4


def test_vjp_refused_by_inference_only_kernels(exact_engine):
    with pytest.raises(ValueError, match="vjp"):
        Engine(exact_engine.ckpt, dataclasses.replace(exact_engine.config, rtc=RtcConfig(guidance="vjp")),
               exact_engine.hardware)


def test_rtc_inputs_have_one_static_structure(setup):
    """Any delay and prefix length give the same tensor shapes and graph structure: one captured decode."""
    from edgefm_ros.runtime import graphs

    e, inp, prefix = setup
    cfg = e.model_config
    c, a = cfg.chunk_size, cfg.max_action_dim
    noise = torch.zeros(1, c, a)
    specs, shapes = set(), set()
    for n, d in [(1, 0), (c, c + 5), (max(1, c // 2), 2)]:
        leaves, spec = graphs.flatten((prefix, noise, rtc_inputs(torch.randn(n, cfg.action_dim), d, e.rtc, c, a)))
        specs.add(repr(spec))
        shapes.add(tuple((tuple(t.shape), t.dtype) for t in leaves))
    assert len(specs) == 1 and len(shapes) == 1


@gpu_mark("CUDA graphs need a CUDA device")
def test_captured_guided_decode_replays_any_delay(tiny):
    e = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="exact", vision_position_ids="legacy", device="cuda")
    e.warmup()
    e.capture_graphs()
    cfg = e.model_config
    c, a = cfg.chunk_size, cfg.max_action_dim
    inp = e.inputs_from_observation(e.synthetic_observation(7))
    prefix = e.prefill(inp)
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    for n, d in [(c, 2), (max(1, c - 3), 0), (2, 5)]:
        noise = torch.randn(1, c, a, generator=g)
        rtc = e.rtc_inputs(torch.randn(n, cfg.action_dim, generator=g).numpy(), d)
        got = e.sample(inp, noise, rtc)  # the captured graph
        want = e.decode(prefix, noise.cuda(), rtc=rtc)  # eager
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"seed {seed} n={n} d={d}: {m}")
    assert torch.equal(e.sample(inp, noise), e.decode_graph(prefix, noise.cuda()).clone())


def ref_prefix_decode(engine, prefix, noise, prev, d):
    """Training-time RTC's decode by its definition: the first d rows are prev, clean, at flow time 0 throughout;
    the other rows integrate from the noise at the Euler steps' times. prev [B, C, A]."""
    cfg, ex = engine.model_config, engine.act["expert"]
    n, c = cfg.num_steps, cfg.chunk_size
    x = noise.clone()
    x[:, :d] = prev[:, :d]
    for k in range(n):
        t = torch.full((c,), 1.0 - k / n)
        t[:d] = 0.0
        tt = ex(engine.model.time_terms(t))  # [C, He]: one time per action
        with torch.no_grad():
            v = engine.model.velocity(ex(x), tt, prefix.contexts, prefix.rope_self, prefix.rope_cross,
                                      prefix.mask_self, prefix.mask_cross).float()
        x[:, d:] = x[:, d:] + (-1.0 / n) * v[:, d:]
    return x


@pytest.fixture(scope="module")
def prefix_engine(exact_engine):
    e = exact_engine
    return Engine(e.ckpt, dataclasses.replace(e.config, rtc=RtcConfig(guidance="prefix")), e.hardware)


def test_prefix_form_gives_the_delay_rows_and_matches_its_definition(setup, prefix_engine):
    """guidance "prefix": the delay's rows come out as the previous chunk's exactly; the rest is the Euler loop
    with per-action flow times (0 on the given rows), and conditioned on them."""
    e, inp, prefix = setup
    p = prefix_engine
    cfg = p.model_config
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    c, a = cfg.chunk_size, cfg.max_action_dim
    for _ in range(3):
        noise = torch.randn(1, c, a, generator=g)
        n_prev = int(torch.randint(2, c + 1, (1,), generator=g))
        delay = int(torch.randint(1, c + 2, (1,), generator=g))
        d = min(delay, n_prev)
        prev = torch.randn(n_prev, cfg.action_dim, generator=g)
        inputs = rtc_inputs(prev, delay, p.rtc, c, a)
        np.testing.assert_array_equal(inputs.weights[0, :, 0].numpy(), (np.arange(c) < d).astype(np.float32))
        got = p.decode(prefix, noise, rtc=inputs)
        assert torch.equal(got[0, :d, :cfg.action_dim], prev[:d]), f"seed {seed} n={n_prev} d={delay}"
        want = ref_prefix_decode(p, prefix, noise, inputs.prev, d)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5,
                                   msg=lambda m: f"seed {seed} n={n_prev} d={delay}: {m}")
        if d < c:  # the rows after the prefix read it: another prefix, another continuation
            other = p.decode(prefix, noise, rtc=rtc_inputs(prev + 1.0, delay, p.rtc, c, a))
            assert float((other[0, d:] - got[0, d:]).abs().max()) > 1e-4, f"seed {seed} n={n_prev} d={delay}"
    # delay 0: nothing given, the unconditioned chunk
    noise = torch.randn(1, c, a, generator=g)
    torch.testing.assert_close(p.decode(prefix, noise, rtc=rtc_inputs(torch.randn(c, cfg.action_dim), 0, p.rtc, c, a)),
                               e.decode(prefix, noise), atol=1e-6, rtol=1e-6)


def test_prefix_form_through_predict_in_raw_units(prefix_engine):
    """predict(rtc_prefix=raw actions, rtc_delay=d) with the prefix form: the chunk's first d raw actions are
    the prefix's (normalised and back)."""
    p = prefix_engine
    cfg = p.model_config
    obs = p.synthetic_observation(5)
    rng = np.random.default_rng(_seed())
    prev = p.predict(obs, noise=rng.standard_normal((cfg.chunk_size, cfg.max_action_dim)).astype(np.float32))
    d = int(rng.integers(1, cfg.chunk_size))
    got = p.predict(obs, noise=rng.standard_normal((cfg.chunk_size, cfg.max_action_dim)).astype(np.float32),
                    rtc_prefix=prev.actions, rtc_delay=d)
    np.testing.assert_allclose(got.actions[:d], prev.actions[:d], atol=1e-5, rtol=1e-5, err_msg=f"d={d}")

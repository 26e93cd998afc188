"""Real-time chunking on the control side: the delay estimate, the rtc merge, the continuation prefix."""
import math

import numpy as np
import pytest

from edgefm_ros.control import ActionQueue, DelayConfig, DelayEstimator, TickGrid, latency_ticks
from edgefm_ros.control.rtc import ChunkContinuation, continuation

RNG = np.random.default_rng()


@pytest.mark.parametrize("kw,name", [({"percentile": 0}, "percentile"), ({"percentile": 101}, "percentile"),
                                     ({"window": 0}, "window"), ({"warmup": -1}, "warmup"),
                                     ({"max_ticks": -2}, "max_ticks")])
def test_delay_config_rejects_bad_values(kw, name):
    with pytest.raises(ValueError, match=name):
        DelayConfig(**kw)


def test_latency_ticks_is_ceiling_of_periods():
    period = RNG.uniform(0.01, 0.05)
    for _ in range(100):
        n = int(RNG.integers(0, 20))
        frac = RNG.uniform(0.01, 0.99)
        assert latency_ticks((n + frac) * period, period) == n + 1
        assert latency_ticks(n * period, period) == n  # exactly on a tick
    assert latency_ticks(0.0, period) == 0 and latency_ticks(float("nan"), period) == 0


def test_delay_is_high_percentile_of_window():
    period = 0.02
    cfg = DelayConfig(percentile=90, window=30, warmup=1)
    est = DelayEstimator(cfg, period)
    assert est.ticks() == 0 and math.isnan(est.latency_s())
    lat = RNG.uniform(0.05, 0.15, size=60)
    for v in lat:
        est.add(float(v))
    want = np.percentile(lat[-30:], 90)
    assert est.latency_s() == pytest.approx(want)
    assert est.ticks() == math.ceil(want / period - 1e-9)


def test_cold_start_spike_does_not_inflate_delay_for_good():
    """lerobot#2541: one slow first call (seconds) must not set the delay of every later chunk."""
    period = 1 / 30
    est = DelayEstimator(DelayConfig(percentile=95, window=10, warmup=1, max_ticks=1000), period)
    est.add(RNG.uniform(2.0, 5.0))  # cold start: allocation, packing, page faults
    assert est.ticks() >= 60  # alone, it is all there is
    steady = RNG.uniform(0.08, 0.12, size=5)
    for v in steady:
        est.add(float(v))
    assert est.ticks() <= math.ceil(0.12 / period)  # left out as soon as others exist
    # a spike after warm-up counts (it is real) but ages out of the window
    est2 = DelayEstimator(DelayConfig(percentile=95, window=10, warmup=0, max_ticks=1000), period)
    est2.add(3.0)
    for v in RNG.uniform(0.08, 0.12, size=3):
        est2.add(float(v))
    assert est2.ticks() >= 50
    for v in RNG.uniform(0.08, 0.12, size=10):
        est2.add(float(v))
    assert est2.ticks() <= math.ceil(0.12 / period)


def test_delay_capped_and_bad_samples_ignored():
    est = DelayEstimator(DelayConfig(max_ticks=7, warmup=0), 0.01)
    for v in (float("nan"), -1.0, float("inf")):
        est.add(v)
    assert est.count == 0 and est.ticks() == 0
    est.add(1.0)
    assert est.ticks() == 7


def test_rtc_merge_replaces_queue_from_first_unexecuted_tick():
    period = 0.02
    q = ActionQueue(TickGrid(0.0, period), "rtc")
    a, b = RNG.normal(size=(10, 4)), RNG.normal(size=(10, 4))
    q.merge(a, stamp=0.0, dt=period, now=0.0, seq=1)
    for k in range(3):
        q.pop(k)
    # chunk b observed at tick 3, arrives during tick 5 -> rows 0..2 already past (executed from a)
    delay = int(RNG.integers(1, 5))
    now = (3 + delay - 1) * period + 0.5 * period
    r = q.merge(b, stamp=3 * period, dt=period, now=now, seq=2)
    first = 3 + delay
    assert r.first_tick == first and r.skipped_rows == delay
    assert r.aggregated == 0 and r.replaced == 10 - first and r.dropped == 0
    kept = list(range(3, first))  # not yet popped, before the chunk's first usable tick: a's
    for k in kept:
        act, seq = q.pop(k)
        np.testing.assert_allclose(act, a[k])
        assert seq == 1
    for k in range(first, 13):
        act, seq = q.pop(k)
        np.testing.assert_allclose(act, b[k - 3])  # b exactly, no blending
        assert seq == 2


def test_continuation_resamples_last_chunk_at_new_rows():
    dt = 0.02
    a = RNG.normal(size=(10, 3)).astype(np.float32)
    stamp = RNG.uniform(1, 2)
    shift = int(RNG.integers(1, 8))
    got = continuation(a, stamp, dt, stamp + shift * dt, dt, 50)
    np.testing.assert_allclose(got, a[shift:], rtol=1e-6)
    # between rows: linear interpolation
    got = continuation(a, stamp, dt, stamp + 2.5 * dt, dt, 50)
    np.testing.assert_allclose(got, 0.5 * (a[2:-1] + a[3:]), rtol=1e-5, atol=1e-6)
    assert got.shape == (7, 3)
    assert continuation(a, stamp, dt, stamp + 20 * dt, dt, 50) is None  # ran out
    assert continuation(a, stamp, dt, stamp - dt, dt, 50) is None  # observed before the chunk starts
    assert continuation(a, stamp, dt, stamp, dt, 4).shape == (4, 3)  # at most max_rows


def test_chunk_continuation_request():
    dt = 0.05
    plan = ChunkContinuation(DelayEstimator(DelayConfig(warmup=0), dt), max_rows=10)
    assert plan.request(0.0, dt) is None
    a = RNG.normal(size=(10, 2)).astype(np.float32)
    plan.sent(a, 1.0, dt)
    plan.measured(0.12)
    req = plan.request(1.0 + 4 * dt, dt)
    np.testing.assert_allclose(req.prefix, a[4:], rtol=1e-6)
    assert req.delay == 3
    plan.reset()
    assert plan.request(1.0 + 4 * dt, dt) is None

"""Link estimation: harmonic mean with error discount, SRTT/RTTVAR, staleness, circuit breaker."""
import math

import numpy as np
import pytest

from edgefm_ros.routing.link import LinkConfig, LinkEstimator


def mbps_to_call(mbps: float, nbytes: int) -> float:
    return nbytes * 8 / (mbps * 1e6)


def test_bandwidth_is_discounted_harmonic_mean():
    rng = np.random.default_rng()
    link = LinkEstimator(LinkConfig(window=4, error_window=3, min_sample_bytes=1000))
    samples = rng.uniform(5, 100, 6)
    errors = []
    for i, s in enumerate(samples):
        if i:
            est = link.bandwidth_mbps(float(i))
            errors.append(abs(est - s) / s)
        link.observe(200_000, mbps_to_call(s, 200_000), 0.05, now=float(i))
    last = samples[-4:]
    hm = len(last) / np.sum(1 / last)
    assert link.bandwidth_mbps(6.0) == pytest.approx(hm / (1 + max(errors[-3:])), rel=1e-9)
    assert link.bandwidth_mbps(6.0) <= hm  # the discount only ever lowers it


def test_steady_link_converges_to_its_rate():
    link = LinkEstimator()
    rate = float(np.random.default_rng().uniform(10, 80))
    for i in range(10):
        link.observe(500_000, mbps_to_call(rate, 500_000), 0.03, now=float(i))
    assert link.bandwidth_mbps(10.0) == pytest.approx(rate, rel=1e-6)


def test_small_uploads_refresh_rtt_only():
    link = LinkEstimator(LinkConfig(min_sample_bytes=16384))
    link.observe(1000, 0.001, 0.04, now=0.0)
    assert math.isnan(link.bandwidth_mbps(0.0)) and link.rtt_s(0.0) == pytest.approx(0.04)


def test_srtt_rttvar_follow_rfc6298():
    rng = np.random.default_rng()
    link = LinkEstimator()
    rtts = rng.uniform(0.01, 0.3, 8)
    srtt, var = rtts[0], rtts[0] / 2
    link.observe(0, 0.0, float(rtts[0]), now=0.0)
    for i, r in enumerate(rtts[1:], start=1):
        var = 0.75 * var + 0.25 * abs(srtt - r)
        srtt = 0.875 * srtt + 0.125 * r
        link.observe(0, 0.0, float(r), now=float(i))
    assert link.rtt_s(8.0) == pytest.approx(srtt) and link.rttvar_s(8.0) == pytest.approx(var)


def test_stale_estimates_decay():
    cfg = LinkConfig(stale_after_s=5.0, stale_half_life_s=2.0)
    link = LinkEstimator(cfg)
    link.observe(400_000, mbps_to_call(40.0, 400_000), 0.05, now=100.0)
    assert link.bandwidth_mbps(105.0) == pytest.approx(40.0)
    assert link.bandwidth_mbps(107.0) == pytest.approx(20.0)
    assert link.bandwidth_mbps(109.0) == pytest.approx(10.0)
    assert link.rtt_s(109.0) == pytest.approx(0.2)
    link.observe(400_000, mbps_to_call(40.0, 400_000), 0.05, now=110.0)  # a probe refreshes it
    assert link.bandwidth_mbps(110.0) == pytest.approx(40.0)


def test_unknown_link_reads_nan():
    link = LinkEstimator()
    assert math.isnan(link.bandwidth_mbps(0.0)) and math.isnan(link.rtt_s(0.0))
    assert not link.breaker_open(0.0)


def test_circuit_breaker_opens_half_opens_and_backs_off():
    link = LinkEstimator(LinkConfig(breaker_failures=3, breaker_cooldown_s=10.0, breaker_max_cooldown_s=30.0))
    link.observe_failure(0.0)
    link.observe_failure(1.0)
    assert not link.breaker_open(1.5)
    link.observe_failure(2.0)
    assert link.breaker_open(2.0) and link.breaker_open(11.9)
    assert not link.breaker_open(12.0)  # half open: one trial allowed
    link.observe_failure(12.5)  # the trial failed: open again for twice as long
    assert link.breaker_open(32.4) and not link.breaker_open(32.6)
    link.observe_failure(33.0)
    assert link.breaker_open(62.9) and not link.breaker_open(63.1)  # capped at 30 s
    link.observe(50_000, 0.01, 0.05, now=64.0)  # success closes and resets
    assert not link.breaker_open(64.0) and link.consecutive_failures == 0
    link.observe_failure(65.0)
    assert not link.breaker_open(65.0)


@pytest.mark.parametrize("args, bad", [((-1, 0.1, 0.05, 0.0), "upload_bytes"), ((1000, 0.0, 0.05, 0.0), "upload_s"),
                                       ((1000, 0.1, float("nan"), 0.0), "rtt_s"), ((1000, 0.1, 0.05, math.inf), "now"),
                                       ((1.5, 0.1, 0.05, 0.0), "upload_bytes")])
def test_bad_observations_are_rejected(args, bad):
    with pytest.raises(ValueError, match=bad):
        LinkEstimator().observe(*args)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="window"):
        LinkConfig(window=0)
    with pytest.raises(ValueError, match="breaker_max_cooldown_s"):
        LinkConfig(breaker_cooldown_s=10.0, breaker_max_cooldown_s=5.0)


def test_a_static_link_keeps_its_rate_and_round_trip_while_failures_and_successes_move_the_breaker():
    est = LinkEstimator(LinkConfig(breaker_failures=2, breaker_cooldown_s=10.0))
    s = est.static_snapshot(0.0, 20.0, 0.04)
    assert (s.bandwidth_mbps, s.rtt_s, s.breaker_open) == (20.0, 0.04, False)
    est.observe_failure(1.0)
    est.observe_failure(1.5)
    s = est.static_snapshot(2.0, 20.0, 0.04)
    assert s.breaker_open and (s.bandwidth_mbps, s.rtt_s) == (20.0, 0.04)
    assert not est.static_snapshot(11.6, 20.0, 0.04).breaker_open  # the cool-down is over: a trial call may go
    est.observe(0, 0.0, 0.3, 12.0)  # the trial succeeded (its rate and round trip do not change the static link)
    s = est.static_snapshot(12.0, 20.0, 0.04)
    assert not s.breaker_open and (s.bandwidth_mbps, s.rtt_s) == (20.0, 0.04) and est.consecutive_failures == 0
    for bad, match in (((0.0, 0.04), "bandwidth_mbps"), ((float("nan"), 0.04), "bandwidth_mbps"),
                       ((20.0, -1.0), "rtt_s")):
        with pytest.raises(ValueError, match=match):
            est.static_snapshot(12.0, *bad)

"""Timing pieces: rolling statistics, tick statistics, the absolute-deadline ticker, the one-slot buffer,
and the chunk request rules."""
import threading
import time

import numpy as np
import pytest

from edgefm_ros.control import ChunkRequester, LatestSlot, RollingStats, Ticker, TickStats, period_errors, queue_state

RNG = np.random.default_rng()


def test_rolling_stats_percentiles_over_the_window_only():
    s = RollingStats(window=100)
    old = RNG.uniform(50, 60, size=50)
    new = RNG.uniform(0, 1, size=100)
    for v in np.concatenate([old, new, [np.nan, np.inf]]):
        s.add(v)
    assert len(s) == 100 and s.count == 150
    assert s.percentile(99) == pytest.approx(np.percentile(new, 99))
    summ = s.summary("lat_ms", 1e3)
    assert summ["lat_ms_p50"] == pytest.approx(np.percentile(new, 50) * 1e3)
    assert summ["lat_ms_max"] == pytest.approx(new.max() * 1e3)


def test_tick_stats_match_an_independent_computation():
    period = 0.02
    n = 400
    jitter = RNG.normal(0, 0.0005, size=n)
    deadlines = 5.0 + np.arange(n) * period
    times = deadlines + np.abs(jitter)
    st = TickStats(period)
    for t, d in zip(times, deadlines):
        st.record(t, d)
    errs = period_errors(times, period)
    summ = st.summary()
    assert summ["period_error_ms_p99"] == pytest.approx(np.percentile(errs, 99) * 1e3)
    assert summ["lateness_ms_max"] == pytest.approx(np.abs(jitter).max() * 1e3)
    assert summ["rate_hz"] == pytest.approx((n - 1) / (times[-1] - times[0]))
    assert summ["ticks"] == n and summ["missed_ticks"] == 0


def test_ticker_keeps_absolute_deadlines_and_counts_missed():
    period = 0.004
    tk = Ticker(period)
    ticks = [tk.wait() for _ in range(10)]
    assert [t.index for t in ticks] == list(range(10))
    assert all(t.woke >= t.deadline for t in ticks)
    assert ticks[-1].deadline - ticks[0].deadline == pytest.approx(9 * period)
    time.sleep(period * RNG.uniform(3.2, 4.5))
    late = tk.wait()
    assert late.missed >= 2 and late.index == 10 + late.missed
    stop = threading.Event()
    stop.set()
    assert tk.wait(stop) is None


def test_ticker_rejects_bad_period():
    with pytest.raises(ValueError, match="period"):
        Ticker(0.0)


def test_latest_slot_keeps_only_the_newest():
    slot = LatestSlot()
    items = RNG.integers(0, 1000, size=5).tolist()
    for x in items:
        slot.put(x)
    assert slot.take(0.01) == items[-1] and slot.overwritten == 4
    assert slot.take(0.01) is None
    got = []
    t = threading.Thread(target=lambda: got.append(slot.take(5.0)))
    t.start()
    slot.close()
    t.join(2.0)
    assert not t.is_alive() and got == [None]


def test_queue_state_threshold():
    chunk = int(RNG.integers(10, 60))
    th = RNG.uniform(0.2, 0.8)
    below = int(np.ceil(th * chunk)) - 1
    above = int(np.ceil(th * chunk)) + 1
    assert queue_state(below, chunk, th).request_chunk
    s = queue_state(above, chunk, th)
    assert not s.request_chunk and not s.must_go and s.fill_ratio == pytest.approx(above / chunk)
    assert queue_state(0, chunk, th).must_go
    assert queue_state(0, 0, th).request_chunk  # before the first chunk
    assert queue_state(chunk, chunk, 1.0).request_chunk  # 1.0: infer continuously
    with pytest.raises(ValueError, match="1.5"):
        queue_state(1, 2, 1.5)


def test_chunk_requester_waits_for_the_merge_or_the_timeout():
    r = ChunkRequester(merge_timeout_s=0.5, retry_s=0.1)
    assert r.should_start(True, False, 0, now=0.0)
    r.started()
    assert not r.should_start(True, True, 0, now=0.1)  # busy
    r.finished(published_seq=1, now=0.2)
    assert not r.should_start(True, True, 0, now=0.3)  # not merged yet
    assert r.should_start(True, False, 1, now=0.4)  # merged
    assert not r.should_start(False, False, 1, now=0.4)  # queue full enough
    r.started()
    r.finished(2, now=1.0)
    assert not r.should_start(True, False, 1, now=1.4)
    assert r.should_start(True, False, 1, now=1.6) and r.lost == 1  # chunk 2 never merged
    r.started()
    r.finished(0, now=2.0)  # refused observation: nothing to wait for, retry after retry_s
    assert not r.should_start(True, True, 1, now=2.05)
    assert r.should_start(True, False, 1, now=2.11)

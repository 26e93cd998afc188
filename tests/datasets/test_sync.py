"""The reference-clock rules: latest message at or before the tick, never after it, never before the
episode's start, within the maximum age; stale ticks dropped and counted; skew = tick - sample time."""
import numpy as np
import pytest

from edgefm_ros.datasets.sync import episode_ticks, sample_latest, skew_summary, synchronise

MS = 1_000_000


def test_ticks_are_on_the_grid_without_drift():
    t = episode_ticks(5 * MS, 5 * MS + 10_000 * MS, 30)  # 10 s at 30 fps
    assert len(t) == 301 and t[0] == 5 * MS and t[-1] == 5 * MS + 10_000 * MS
    k = np.arange(301)
    assert np.abs(t - (5 * MS + np.round(k * 1e9 / 30))).max() == 0
    assert len(episode_ticks(0, 49 * MS, 20)) == 1 and len(episode_ticks(0, 50 * MS, 20)) == 2
    assert len(episode_ticks(10, 5, 20)) == 0


def test_a_message_after_the_tick_is_never_used():
    times = np.array([0, 40, 100, 101]) * MS
    ticks = np.array([39, 40, 99, 100, 150]) * MS
    idx, age = sample_latest(times, ticks, 0, 1000 * MS)
    assert idx.tolist() == [0, 1, 1, 2, 3]
    assert (age == ticks - times[idx]).all() and (age >= 0).all()
    for i, t in zip(idx, ticks):  # the rule itself, message by message
        assert times[i] <= t and not ((times > times[i]) & (times <= t)).any()


def test_equal_stamps_take_the_last_recorded():
    idx, _ = sample_latest(np.array([0, 10, 10, 20]) * MS, np.array([10, 15]) * MS, 0, MS * 100)
    assert idx.tolist() == [2, 2]


def test_stale_and_before_start_samples_are_refused():
    times = np.array([0, 100, 300]) * MS
    idx, age = sample_latest(times, np.array([50, 161, 250, 300]) * MS, 0, 60 * MS)
    assert idx.tolist() == [0, -1, -1, 2] and age.tolist() == [50 * MS, -1, -1, 0]
    assert sample_latest(times, np.array([160]) * MS, 0, 60 * MS)[0].tolist() == [1]  # exactly max_age: kept
    # a message from before the episode's start (the previous episode's) is never sampled
    idx, _ = sample_latest(times, np.array([120, 310]) * MS, 110 * MS, 60 * MS)
    assert idx.tolist() == [-1, 2]
    idx, _ = sample_latest(times, np.array([-5]) * MS, -10 * MS, 60 * MS)  # nothing yet
    assert idx.tolist() == [-1]


def test_synchronise_drops_stale_ticks_and_counts_them_per_stream():
    fps = 10
    state = np.arange(0, 2001, 10) * MS  # 100 Hz, 0..2 s
    cam = np.array([t for t in range(0, 2001, 33) if not 700 <= t < 1100]) * MS  # 30 Hz, 0.4 s hole
    r = synchronise({"state": state, "cam": cam}, {"state": 20 * MS, "cam": 50 * MS}, 0, 2000 * MS, fps)
    assert r.total_ticks == 21
    # ticks 0.8 .. 1.1 s see a camera frame older than 50 ms (0.693 s is the last before the hole, 1.122 s
    # the first after it)
    assert r.stale == {"state": 0, "cam": 4} and r.dropped == 4 and r.inner == 4
    assert r.leading == 0 and r.trailing == 0
    kept_ms = (r.ticks // MS).tolist()
    assert kept_ms == [t for t in range(0, 2001, 100) if t not in (800, 900, 1000, 1100)]
    # every kept sample obeys the rule
    for name, times in (("state", state), ("cam", cam)):
        t_sample = times[r.index[name]]
        assert (t_sample <= r.ticks).all() and (r.ticks - t_sample <= {"state": 20, "cam": 50}[name] * MS).all()
        assert (r.age[name] == r.ticks - t_sample).all()


def test_leading_and_trailing_drops():
    act = np.array([300, 400, 500, 600]) * MS  # commands start late and stop early
    state = np.arange(0, 1001, 10) * MS
    r = synchronise({"state": state, "action": act}, {"state": 20 * MS, "action": 100 * MS}, 0, 1000 * MS, 10)
    assert (r.leading, r.inner, r.trailing) == (3, 0, 3)  # 700: the 600 ms command is exactly 100 ms old
    assert (r.ticks // MS).tolist() == [300, 400, 500, 600, 700]


def test_skew_summary_percentiles():
    s = skew_summary("/x", np.arange(101) * MS, stale=4)
    assert s.p50_ms == pytest.approx(50.0) and s.p95_ms == pytest.approx(95.0) and s.max_ms == 100.0
    d = s.as_dict()
    assert d["stale_ticks"] == 4 and d["samples"] == 101 and d["skew_p95_ms"] == 95.0
    assert skew_summary("/y", np.zeros(0), 0).as_dict()["skew_p50_ms"] is None

"""ActionQueue: resampling onto the tick grid, skipping passed rows, LeRobot aggregation, hold logic."""
import numpy as np
import pytest

from edgefm_ros.control import AGGREGATE_FUNCTIONS, REPLACING, ActionQueue, Commander, TickGrid, get_aggregate, resample

RNG = np.random.default_rng()


def _chunk(n=10, d=6):
    return RNG.normal(size=(n, d)).astype(np.float32)


@pytest.mark.parametrize("name,w_old", [("weighted_average", 0.3), ("latest_only", 0.0), ("average", 0.5),
                                        ("conservative", 0.7)])
def test_aggregate_functions_match_lerobot_weights(name, w_old):
    old, new = RNG.normal(size=(2, 7))
    np.testing.assert_allclose(get_aggregate(name)(old, new), w_old * old + (1 - w_old) * new)


def test_unknown_aggregate_names_the_value():
    with pytest.raises(ValueError, match="'median'"):
        get_aggregate("median")
    assert set(AGGREGATE_FUNCTIONS) == {"weighted_average", "latest_only", "average", "conservative", "rtc"}


def test_resample_is_linear_interpolation_in_time():
    a = _chunk(8, 3).astype(np.float64)
    stamp, dt = RNG.uniform(10, 20), RNG.uniform(0.01, 0.05)
    times = stamp + np.sort(RNG.uniform(0, 7 * dt, size=25))
    got = resample(a, stamp, dt, times)
    rows = stamp + np.arange(8) * dt
    want = np.stack([np.interp(times, rows, a[:, j]) for j in range(3)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_rows_whose_time_passed_are_skipped_by_measured_latency():
    period = 0.02
    origin = RNG.uniform(100, 200)
    q = ActionQueue(TickGrid(origin, period), "latest_only")
    a = _chunk(10)
    passed = int(RNG.integers(1, 6))  # latency: between `passed - 1` and `passed` periods
    now = origin + (passed - 1) * period + RNG.uniform(0.1, 0.9) * period
    r = q.merge(a, stamp=origin, dt=period, now=now, seq=3)
    assert r.skipped_rows == passed and r.scheduled == 10 - passed and r.first_tick == passed
    assert r.latency_s == pytest.approx(now - origin)
    assert q.ticks() == list(range(passed, 10))
    item = q.pop(passed)
    np.testing.assert_allclose(item[0], a[passed], rtol=1e-6)
    assert item[1] == 3


@pytest.mark.parametrize("name", sorted(set(AGGREGATE_FUNCTIONS) - REPLACING))
def test_overlap_is_aggregated_and_old_tail_dropped(name):
    period = 0.02
    q = ActionQueue(TickGrid(0.0, period), name)
    a, b = _chunk(10), _chunk(6)
    q.merge(a, stamp=0.0, dt=period, now=0.0, seq=1)
    for k in range(3):
        q.pop(k)
    r = q.merge(b, stamp=3 * period, dt=period, now=2.5 * period, seq=2)  # ticks 3..8 overlap a[3..8]
    assert (r.scheduled, r.aggregated, r.dropped, r.skipped_rows) == (6, 6, 1, 0)  # a's tick 9 replaced
    assert q.ticks() == list(range(3, 9))
    fn = get_aggregate(name)
    for k in range(3, 9):
        act, seq = q.pop(k)
        np.testing.assert_allclose(act, fn(a[k].astype(np.float64), b[k - 3].astype(np.float64)), rtol=1e-6)
        assert seq == 2


def test_queued_ticks_before_a_later_chunk_are_kept():
    period = 0.02
    q = ActionQueue(TickGrid(0.0, period), "average")
    a, b = _chunk(10), _chunk(5)
    q.merge(a, stamp=0.0, dt=period, now=0.0, seq=1)
    r = q.merge(b, stamp=6 * period, dt=period, now=0.001, seq=2)  # starts in the future at tick 6
    assert r.first_tick == 6 and q.ticks() == list(range(0, 11))
    np.testing.assert_allclose(q.pop(2)[0], a[2], rtol=1e-6)


def test_chunk_entirely_in_the_past_leaves_the_queue_alone():
    period = 0.02
    q = ActionQueue(TickGrid(0.0, period))
    a = _chunk(10)
    q.merge(a, 0.0, period, now=0.0, seq=1)
    before = q.ticks()
    r = q.merge(_chunk(4), stamp=0.0, dt=period, now=0.5, seq=2)
    assert r.scheduled == 0 and r.skipped_rows == 4 and r.first_tick == -1
    assert q.ticks() == before


def test_popped_ticks_are_never_rescheduled():
    period = 0.02
    q = ActionQueue(TickGrid(0.0, period))
    q.merge(_chunk(10), 0.0, period, now=0.0, seq=1)
    q.pop(4)  # ticks 0..4 are gone
    assert q.ticks() == list(range(5, 10))
    r = q.merge(_chunk(10), 0.0, period, now=0.0, seq=2)
    assert r.first_tick == 5 and r.skipped_rows == 5


@pytest.mark.parametrize("bad,match", [("nan", "non-finite"), ("dt", "dt"), ("shape", "shape")])
def test_bad_chunks_are_rejected_with_a_clear_error(bad, match):
    q = ActionQueue(TickGrid(0.0, 0.02))
    a, dt = _chunk(5), 0.02
    if bad == "nan":
        a[RNG.integers(5), RNG.integers(6)] = np.nan
    elif bad == "dt":
        dt = 0.0
    else:
        a = a[0]
    with pytest.raises(ValueError, match=match):
        q.merge(a, 0.0, dt, 0.0)
    assert len(q) == 0


def test_commander_holds_last_position_and_counts_underruns():
    period = 0.02
    q = ActionQueue(TickGrid(0.0, period))
    c = Commander(q)
    first = c.step(0)
    assert first.positions is None and first.holding and c.waiting_ticks == 1 and c.underruns == 0
    a = _chunk(3)
    q.merge(a, period, period, now=0.5 * period, seq=7)  # ticks 1..3
    cmds = [c.step(k) for k in range(1, 7)]
    assert [x.holding for x in cmds] == [False, False, False, True, True, True]
    assert [x.seq for x in cmds[:3]] == [7, 7, 7]
    for x in cmds[3:]:
        np.testing.assert_allclose(x.positions, a[2], rtol=1e-6)
    assert c.underruns == 3 and c.waiting_ticks == 1
    q.merge(_chunk(5), 7 * period, period, now=6.5 * period, seq=8)
    held = c.hold()
    assert held.holding and len(q) == 0
    np.testing.assert_allclose(held.positions, a[2], rtol=1e-6)


def test_tick_grid_rejects_bad_period():
    with pytest.raises(ValueError, match="period"):
        TickGrid(0.0, -0.01)

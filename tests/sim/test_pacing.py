"""sim/pacing.py on a controlled clock: ticks on an absolute grid, a loop more than a tick behind skips to the
grid, camera frames at their own period without a burst after falling behind, gaps between loop starts."""
import threading

import pytest

from edgefm_ros.sim.pacing import Pacer


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Sleep(threading.Event):
    """stop.wait(d) moves the clock on by d instead of sleeping."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock, self.waits = clock, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        self.clock.t += timeout
        return False


def test_ticks_keep_the_grid_and_skip_when_far_behind():
    clock = Clock()
    pacer = Pacer(0.01, 0.05, clock=clock)
    stop = Sleep(clock)
    pacer.begin()
    clock.t += 0.004  # the loop's work
    pacer.wait(stop)
    assert stop.waits[-1] == pytest.approx(0.006) and clock.t == pytest.approx(100.01)
    pacer.begin()
    clock.t += 0.035  # three and a half ticks late: no sleep, the grid skips the missed ticks
    pacer.wait(stop)
    assert len(stop.waits) == 1 and pacer.next_tick == pytest.approx(100.04)
    assert pacer.gaps_ms.count == 1 and pacer.gaps_ms.percentile(50) == pytest.approx(10.0)


def test_camera_period_without_a_burst_after_falling_behind():
    clock = Clock()
    pacer = Pacer(0.01, 0.05, clock=clock)
    t = pacer.begin()
    assert pacer.camera_due(t)
    pacer.camera_sent(t)
    assert not pacer.camera_due(t + 0.049) and pacer.camera_due(t + 0.05)
    late = t + 0.5  # ten frames late: one frame now, the next a period later
    pacer.camera_sent(late)
    assert pacer.next_camera == pytest.approx(late + 0.05)


def test_restart_measures_no_gap_across_a_pause_and_bad_periods_are_named():
    clock = Clock()
    pacer = Pacer(0.01, 0.05, clock=clock)
    pacer.begin()
    clock.t += 0.01
    pacer.begin()
    assert pacer.gaps_ms.count == 1
    clock.t += 5.0
    pacer.restart()
    pacer.begin()
    assert pacer.gaps_ms.count == 1 and pacer.next_tick == clock.t
    with pytest.raises(ValueError, match="camera_period"):
        Pacer(0.01, 0.0)

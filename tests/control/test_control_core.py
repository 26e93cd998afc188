"""ControlCore: chunks mapped to the command joint order by name, refused when they do not fit, latency
bookkeeping, queue state."""
import numpy as np
import pytest

from edgefm_ros.control.core import ControlCore
from edgefm_ros.types import ActionChunk

RNG = np.random.default_rng()
NAMES = ("a", "b", "c", "d")


def _chunk(names=NAMES, n=10, dt=0.02, stamp=0.0, seq=1):
    return ActionChunk(actions=RNG.normal(size=(n, len(names))).astype(np.float32), dt=dt, stamp=stamp,
                       joint_names=tuple(names), seq=seq)


def test_columns_are_mapped_by_joint_name():
    order = tuple(RNG.permutation(NAMES))
    core = ControlCore(0.02, "latest_only", 0.5, order)
    core.start(0.0)
    c = _chunk()
    core.merge(c, now=0.001)
    cmd = core.tick(1)
    want = c.actions[1, [NAMES.index(n) for n in order]]
    np.testing.assert_allclose(cmd.positions, want, rtol=1e-6)


def test_first_chunk_names_are_adopted_when_none_configured():
    core = ControlCore(0.02)
    core.merge(_chunk(), now=0.0)
    assert core.joint_names == NAMES


@pytest.mark.parametrize("bad", ["unknown_names", "fewer", "unnamed_wrong_width"])
def test_chunks_that_do_not_fit_are_rejected_and_counted(bad):
    core = ControlCore(0.02, joint_names=NAMES)
    c = {"unknown_names": _chunk(names=("a", "b", "c", "x")), "fewer": _chunk(names=("a", "b", "c")),
         "unnamed_wrong_width": ActionChunk(actions=RNG.normal(size=(5, 3)).astype(np.float32), dt=0.02,
                                            stamp=0.0)}[bad]
    with pytest.raises(ValueError):
        core.merge(c, now=0.0)
    assert core.counters().rejected_chunks == 1 and len(core.queue) == 0


def test_queue_state_and_latency_bookkeeping():
    period = 0.02
    core = ControlCore(period, "weighted_average", 0.5, NAMES)
    core.start(100.0)
    assert core.state().request_chunk and core.state().must_go
    latency = float(RNG.uniform(0.005, 0.05))
    stamp = 100.0 + 0.5 * period
    r = core.merge(_chunk(n=21, stamp=stamp, dt=period, seq=5), now=stamp + latency)
    s = core.state()
    assert s.chunk_size == 21 and s.queue_size == r.scheduled and not s.must_go
    assert s.request_chunk == (s.fill_ratio < 0.5)
    first = core.tick(r.first_tick)
    assert first.seq == 5
    assert core.frame_to_action.percentile(50) == pytest.approx(core.grid.time(r.first_tick) - stamp)
    assert core.arrival_latency.percentile(50) == pytest.approx(latency)
    cnt = core.counters()
    assert (cnt.chunks, cnt.last_seq, cnt.rejected_chunks) == (1, 5, 0)


def test_restart_keeps_the_hold_position():
    core = ControlCore(0.02, joint_names=NAMES)
    core.start(0.0)
    c = _chunk(stamp=0.0)
    core.merge(c, now=0.0)
    last = core.tick(0).positions
    core.start(50.0)
    held = core.tick(0)
    assert held.holding and np.array_equal(held.positions, last)


def test_a_late_chunk_is_dropped_but_reported_consumed():
    """Every row past on arrival: nothing is queued, it counts as late, and last_seq moves on so vla_node
    (ChunkRequester) starts the next chunk now instead of waiting out merge_timeout_s."""
    period = 0.02
    core = ControlCore(period, "latest_only", 0.5, NAMES)
    core.start(0.0)
    seq = int(RNG.integers(2, 1000))
    late_by = float(RNG.uniform(0.05, 1.0))
    r = core.merge(_chunk(n=10, stamp=0.0, dt=period, seq=seq), now=9 * period + late_by)
    cnt = core.counters()
    assert r.scheduled == 0 and len(core.queue) == 0
    assert (cnt.late_chunks, cnt.chunks, cnt.last_seq) == (1, 0, seq)
    from edgefm_ros.control.request import ChunkRequester

    req = ChunkRequester(merge_timeout_s=1.0)
    req.started()
    req.finished(seq, now=0.0)
    assert req.should_start(True, False, cnt.last_seq, now=0.01) and req.lost == 0

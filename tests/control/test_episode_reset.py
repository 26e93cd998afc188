"""ControlCore.reset (action_node's episode start): the old episode's queue and held position are dropped,
chunks observed before the start are stale (dropped but reported consumed), newer ones are merged."""
import numpy as np

from edgefm_ros.control.core import ControlCore
from edgefm_ros.types import ActionChunk

RNG = np.random.default_rng()
NAMES = ("ee_x", "ee_y", "ee_z", "gripper")


def _chunk(stamp, seq, n=16, dt=0.05):
    return ActionChunk(actions=RNG.normal(size=(n, 4)).astype(np.float32), dt=dt, stamp=stamp, joint_names=NAMES,
                       seq=seq)


def test_reset_drops_queue_and_hold_then_takes_only_new_chunks():
    core = ControlCore(0.05, "latest_only", 0.5, NAMES)
    core.start(0.0)
    core.merge(_chunk(0.0, 1), now=0.01)
    for k in range(1, 5):
        assert not core.tick(k).holding
    t_reset = 0.26
    core.reset(t_reset)
    cmd = core.tick(6)
    assert cmd.positions is None and cmd.holding  # nothing commanded: the new episode's arm is not driven
    st = core.state()
    assert st.queue_size == 0 and st.request_chunk and st.must_go
    old = _chunk(t_reset - RNG.uniform(0.01, 0.2), 2)  # computed from the old episode's observation
    r = core.merge(old, now=0.31)
    assert r.stale and r.scheduled == 0
    c = core.counters()
    assert c.stale_chunks == 1 and c.last_seq == 2 and c.chunks == 1  # consumed: the producer goes on
    assert core.tick(7).positions is None
    new = _chunk(0.32, 3)
    r = core.merge(new, now=0.36)
    assert not r.stale and r.scheduled > 0
    cmd = core.tick(8)  # t = 0.40: row (0.40 - 0.32) / 0.05 = 1.6
    np.testing.assert_allclose(cmd.positions, new.actions[1] * 0.4 + new.actions[2] * 0.6, rtol=1e-5, atol=1e-6)
    c = core.counters()
    assert c.underruns == 0 and c.waiting_ticks >= 2  # empty ticks after the reset are warm-up, not underruns

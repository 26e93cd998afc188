"""A bag replayed through the real nodes (installed executables, separate processes, real DDS), outputs
recorded and checked: chunks produced, commands at the configured rate, queue never empty after warm-up,
joint order, monotone time stamps."""
from __future__ import annotations

import time

import numpy as np
import pytest

from replay_helpers import (COMMAND_ORDER, COMMAND_TOPIC, JOINTS, assert_at_rate, graph_nodes, node_params,
                            realtime_applied, realtime_expected, record_topics)


def explained_by_chunks(cmd: np.ndarray, chunks: list[np.ndarray], tol: float = 1e-4) -> bool:
    """True when ``cmd`` (d,) equals (1 - w) * a[i] + w * a[i + 1] for some chunk a, row i and ONE w in [0, 1]
    shared by all joints: what latest_only aggregation commands when the columns are in the right order."""
    for a in chunks:
        for i in range(len(a) - 1):
            lo, hi = a[i], a[i + 1]
            d = hi - lo
            w = float(np.clip(np.dot(cmd - lo, d) / max(np.dot(d, d), 1e-12), 0.0, 1.0))
            if np.max(np.abs(lo + w * d - cmd)) < tol:
                return True
    return False


def _chunk_actions(path: str) -> list[np.ndarray]:
    from rosbags.rosbag2 import Reader

    from edgefm_ros.tools.bag.typestore import make_typestore

    ts, out = make_typestore(), []
    with Reader(path) as r:
        conns = [c for c in r.connections if c.msgtype == "edgefm_ros/msg/ActionChunk"]
        for c, _, data in r.messages(connections=conns):
            m = ts.deserialize_cdr(data, c.msgtype)
            out.append(np.asarray(m.actions, dtype=np.float64).reshape(m.chunk_size, m.action_dim))
    return out


def test_replay_through_the_nodes(ros, tiny_model, short_bag, tmp_path, ros_domain_id):
    from edgefm_ros.tools.bag.analyze import command_timing, read_run
    from edgefm_ros.tools.graph import ReplaySession, installed_executable

    for name in ("vla_node", "action_node"):
        assert installed_executable(name) is not None, f"{name} is not installed (colcon build)"
    params = node_params(tiny_model)
    nodes = graph_nodes()
    with ReplaySession(tmp_path, params, nodes, ros_domain_id, record_topics()) as s:
        s.wait_active(("vla_node", "action_node"), timeout=60)
        t_play = time.time()
        s.play(short_bag)
        t_end = time.time()
        time.sleep(0.3)
        assert all(s.alive(n) for n in nodes), {n: s.alive(n) for n in nodes}
        realtime = realtime_applied(s)
    run = read_run(str(s.record_path), COMMAND_TOPIC)

    # chunks: produced from the replayed data, in order, with the model's joint names and shape
    assert len(run.chunk_seq) >= 10, f"only {len(run.chunk_seq)} chunks in 8 s"
    assert np.all(np.diff(run.chunk_seq) > 0)
    assert np.all(np.diff(run.chunk_stamp) >= 0), "chunk observation stamps go backwards"
    assert run.chunk_joint_names == {JOINTS} and run.chunk_shape == {(8, 6)}
    if "router_node" in nodes:  # no cloud is configured: a cloud decision runs on the edge as "edge-fallback"
        assert sum(run.routes.values()) >= 4, run.routes
        assert set(run.chunk_source) <= {"edge", "edge-fallback"}
        if "edge-fallback" in run.chunk_source:
            assert run.routes["cloud"] > 0, "edge-fallback without a cloud decision"
    else:
        assert set(run.chunk_source) == {"edge"}
    assert min(run.chunk_stamp) >= t_play - 0.1, "a chunk carries a stamp from before the replay (not restamped?)"

    # commands: configured rate, monotone stamps, the command joint order
    assert run.cmd_joint_names == {COMMAND_ORDER}
    assert np.all(np.diff(run.cmd_stamp) > 0), "command stamps not strictly increasing"
    first_chunk = run.chunk_recv[0]
    timing = command_timing(run, 1 / 50, first_chunk + 0.5, t_end)
    assert realtime == realtime_expected()
    assert_at_rate(timing, 50.0, realtime)

    # queue never empty after warm-up (while the bag plays)
    t, holding = np.asarray(run.status_time), np.asarray(run.status_holding)
    window = (t > first_chunk + 1.0) & (t < t_end - 0.2)
    assert window.sum() > 100  # > 2 s of 50 Hz status (a loaded host's late first chunk shortens the window)
    assert not holding[window].any(), f"queue ran empty {holding[window].sum()} times after warm-up"

    # joint order: every command is an interpolation of one chunk's consecutive rows, mapped by joint name
    chunks = _chunk_actions(str(s.record_path))
    to_model = [COMMAND_ORDER.index(j) for j in JOINTS]
    cmds = run.positions[(np.asarray(run.cmd_stamp) > first_chunk + 0.5) & (np.asarray(run.cmd_stamp) < t_end)]
    assert len(cmds) > 100
    sample = cmds[np.random.default_rng().choice(len(cmds), size=40, replace=False)]
    assert all(explained_by_chunks(c[to_model], chunks) for c in sample)
    # the same commands read in the wrong order are not explained (the check has teeth)
    wrong = [c[::-1] for c in sample]
    assert sum(explained_by_chunks(c, chunks) for c in wrong) < len(wrong) // 2

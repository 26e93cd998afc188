"""The closed loop in simulation through the real node processes: sim_node's command safety, the loop with
the committed trained checkpoint (CI), and vla_node killed and restarted mid-episode."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from replay_helpers import assert_sim_at_rate

JOINTS = ["ee_x", "ee_y", "ee_z", "gripper"]
REPO = Path(__file__).resolve().parents[2]
TRAINED = REPO / "checkpoints" / "smolvla-metaworld"


@pytest.fixture(scope="module")
def sim(ros):
    pytest.importorskip("metaworld", reason="the simulator (metaworld, mujoco) is not installed")
    from edgefm_ros.sim import env  # noqa: F401  (MUJOCO_GL defaults)

    return ros


@pytest.fixture(scope="module")
def random_sim_checkpoint(tmp_path_factory):
    """A random-weight SmolVLA with the simulator's features (two 64x64 cameras, state/action 4), chunk 16."""
    import torch

    from edgefm_ros.training.random_checkpoint import make_checkpoint, write_processors

    out = tmp_path_factory.mktemp("ckpt") / "random-sim"
    make_checkpoint(out, arch="tiny", seed=0, cameras=2, raw_hw=(64, 64), dim=4)
    cfg = json.loads((out / "config.json").read_text())
    f = cfg["input_features"]
    f["observation.images.scene"] = f.pop("observation.images.camera1")
    f["observation.images.wrist"] = f.pop("observation.images.camera2")
    cfg.update(chunk_size=16, n_action_steps=8)
    (out / "config.json").write_text(json.dumps(cfg))
    # actions around the middle of the workspace, a few cm of spread: the arm wanders, never far
    write_processors(out, {"observation.state": {"mean": torch.tensor([0.0, 0.6, 0.2, 0.5]),
                                                 "std": torch.tensor([0.1, 0.1, 0.1, 0.5])},
                           "action": {"mean": torch.tensor([0.0, 0.65, 0.15, 0.0]),
                                      "std": torch.tensor([0.03, 0.03, 0.03, 0.5])}})
    return str(out)


def _ee_listener(node):
    """Subscribes to /joint_states; returns the list it fills with (stamp, [x, y, z, gripper])."""
    from sensor_msgs.msg import JointState

    from edgefm_ros.ros import qos

    rows = []

    def on(m):
        rows.append((m.header.stamp.sec + m.header.stamp.nanosec * 1e-9, list(m.position), list(m.name)))
    node.create_subscription(JointState, "/joint_states", on, qos.SENSOR)
    return rows


def _bad_commands(kind, rng, target):
    """Malformed commands of ``kind`` (NaN, wrong length, unknown joint names) aiming at ``target``."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    nan = list(target)
    nan[int(rng.integers(3))] = float("nan")
    short = list(target[: int(rng.integers(1, 4))])
    unknown = ["ee_x", "ee_y", f"joint_{rng.integers(9)}", "gripper"]
    if kind == "float64_multi_array":
        return [Float64MultiArray(data=nan), Float64MultiArray(data=short),
                Float64MultiArray(data=list(target) + [0.0])]
    if kind == "joint_state":
        return [JointState(name=JOINTS, position=nan), JointState(name=JOINTS, position=short),
                JointState(name=unknown, position=list(target))]
    return [JointTrajectory(joint_names=JOINTS, points=[JointTrajectoryPoint(positions=nan)]),
            JointTrajectory(joint_names=JOINTS, points=[JointTrajectoryPoint(positions=short)]),
            JointTrajectory(joint_names=unknown, points=[JointTrajectoryPoint(positions=list(target))]),
            JointTrajectory(joint_names=JOINTS, points=[])]


def _good_command(kind, target):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    order = [3, 1, 0, 2]  # names in another order than the arm's: mapped by name
    if kind == "float64_multi_array":
        return Float64MultiArray(data=list(target))
    if kind == "joint_state":
        return JointState(name=[JOINTS[i] for i in order], position=[target[i] for i in order])
    return JointTrajectory(joint_names=[JOINTS[i] for i in order],
                           points=[JointTrajectoryPoint(positions=[target[i] for i in order])])


@pytest.mark.parametrize("kind", ["joint_trajectory", "float64_multi_array", "joint_state"])
def test_bad_commands_never_move_the_arm(sim, kind, tmp_path, ros_domain_id):
    """NaN, wrong length, unknown joint names: the arm holds, diagnostics count and name the refusal; then a
    good command (names in another order) moves it to its target."""
    from edgefm_ros.ros.commands import COMMAND_MSG
    from edgefm_ros.ros import qos
    from edgefm_ros.tools.graph import ReplaySession

    rng = np.random.default_rng()
    params = {"sim_node": dict(episodes=["reach:1000"], timeout_s=60.0, command_type=kind,
                               command_topic="/test/command", diagnostics_period_s=0.25, autostart=True)}
    with ReplaySession(tmp_path, params, ("sim_node",), ros_domain_id) as s:
        rows = _ee_listener(s.node)
        pub = s.node.create_publisher(COMMAND_MSG[kind], "/test/command", qos.RELIABLE)
        s.wait_active(timeout=120)
        # the hand settles a few mm in the first ~0.5 s after a reset (physics, no command): wait it out
        assert s.wait_for(lambda: len(rows) > 120 and pub.get_subscription_count() > 0, 30)
        start = np.array(rows[-1][1][:3])
        target = start + np.array([rng.uniform(0.05, 0.1), rng.uniform(-0.1, -0.05), rng.uniform(0.03, 0.06)])
        cmd = [*target.tolist(), float(rng.uniform(-1, 1))]
        bad = _bad_commands(kind, rng, cmd)
        t_bad = time.time()
        for _ in range(10):
            for m in bad:
                if hasattr(m, "header"):
                    m.header.stamp = s.node.get_clock().now().to_msg()
                pub.publish(m)
            time.sleep(0.1)
        # the refusals are counted as the node takes the commands; its diagnostics come every 0.25 s. On a
        # loaded host its queue may drop some, so wait for all of them or for a count that has stopped rising
        # (0.8 s, three diagnostics periods, unchanged), not for a fixed time: the warning lasts 5 s after the last one
        seen: list[int] = []

        def settled() -> bool:
            seen.append(int(s.diagnostics("sim_node").get("commands_rejected", 0)))
            return seen[-1] >= 10 * len(bad) or (len(seen) > 8 and seen[-1] > 0 and len(set(seen[-8:])) == 1)

        s.wait_for(settled, 5.0, poll=0.1)
        time.sleep(0.3)  # one more diagnostics period: no late refusal or application is missed
        diag = s.diagnostics("sim_node")
        held = np.array([r[1][:3] for r in rows if r[0] > t_bad])
        good = _good_command(kind, cmd)
        if hasattr(good, "header"):
            good.header.stamp = s.node.get_clock().now().to_msg()
        pub.publish(good)
        time.sleep(1.5)
        moved = np.array(rows[-1][1][:3])
        diag_after = s.diagnostics("sim_node")
    assert rows[0][2] == JOINTS
    assert len(held) > 50
    drift = np.abs(held - start).max()
    assert drift < 1e-3, f"bad commands moved the arm by {drift * 1e3:.2f} mm"
    # all 40 when the node keeps up; on a loaded host its reliable depth-10 queue may drop the oldest of a
    # backlog (the latest command wins), never apply one
    assert len(bad) <= int(diag["commands_rejected"]) <= 10 * len(bad), diag
    assert int(diag["commands_applied"]) == 0, diag
    assert diag["level"] == 1 and "refused" in diag["message"], diag
    assert int(diag_after["commands_applied"]) == 1
    assert np.linalg.norm(moved - target) < 0.01 < np.linalg.norm(start - target), (start, moved, target)


def test_closed_loop_with_the_trained_checkpoint(sim, tmp_path, ros_domain_id):
    """CI: one task, a few held-out seeds, through the real nodes: most succeed, no underrun after warm-up."""
    if not (TRAINED / "config.json").is_file():
        pytest.fail(f"the committed trained checkpoint is missing at {TRAINED}")
    from edgefm_ros.sim.tasks import EVAL_SEEDS
    from edgefm_ros.tools.sim_ros import run_ros

    seeds = list(EVAL_SEEDS[:4])
    rr = run_ros(str(TRAINED), [f"drawer-open:{s}" for s in seeds], out_dir=tmp_path, domain_id=ros_domain_id,
                 progress=None)
    r = rr.report
    assert r["episodes"] == len(seeds)
    assert r["successes"] >= len(seeds) - 1, r["episodes_detail"]
    assert r["queue_underruns"]["after_warmup"] == 0, r["queue_underruns"]
    assert_sim_at_rate(r)
    # episodes last ~1.5 s: one 0.5 s stall of a loaded CI host put one at 0.69 (the others at 0.99), so the
    # mean over the episodes is what must keep real time; the worst one must still be well above half speed
    sim = r["simulation"]
    assert sim["real_time_factor_mean"] > 0.9 and sim["real_time_factor_min"] > 0.6, sim
    ok = [e for e in r["episodes_detail"] if e["success"]]
    assert all(0 < e["time_to_success_s"] < 5.0 for e in ok)


def test_vla_node_killed_the_arm_holds_restarted_the_episode_goes_on(sim, random_sim_checkpoint, tmp_path,
                                                                    ros_domain_id):
    from edgefm_ros.tools.bag.analyze import read_run
    from edgefm_ros.tools.sim_ros import COMMAND_TOPIC, LoopGraph, graph_params, joint_states

    params = graph_params(random_sim_checkpoint, ["reach:1000"])
    params["sim_node"]["timeout_s"] = 60.0
    with LoopGraph(tmp_path, params, ros_domain_id, progress=None, mode="process") as g:
        s = g.session
        g.start()
        assert s.wait_for(lambda: int(s.diagnostics("action_node").get("chunks", 0)) >= 5, 20)
        t_kill = time.time()
        s.stop_node("vla_node", signal.SIGKILL)
        assert s.wait_for(lambda: s.diagnostics("action_node").get("holding") == "true" and
                          float(s.diagnostics("action_node").get("since_last_chunk_s", 0)) > 1.0, 10)
        t_hold = time.time()
        time.sleep(2.2)
        t_restart = time.time()
        before = int(s.diagnostics("action_node")["chunks"])
        s.start_node("vla_node")
        s.wait_active(("vla_node",), timeout=60)
        assert s.wait_for(lambda: s.diagnostics("action_node").get("holding") == "false", 20)
        t_resumed = time.time()
        # action_node's own count (the recorder may miss a restarted publisher's first chunks during discovery)
        assert s.wait_for(lambda: int(s.diagnostics("action_node")["chunks"]) >= before + 3, 20), \
            "no chunks merged after the restart"
        time.sleep(1.0)
        events = list(g.events)
    run = read_run(str(s.record_path), COMMAND_TOPIC)
    js_t, js_p = joint_states(s.record_path)
    hold = (js_t >= t_hold) & (js_t <= t_hold + 2.0)
    assert hold.sum() > 100
    moved = np.linalg.norm(js_p[hold, :3] - js_p[hold][0, :3], axis=1).max()
    assert moved < 0.005, f"the arm moved {moved * 1e3:.1f} mm in 2 s with vla_node dead"
    assert max(run.chunk_recv[i] for i in range(len(run.chunk_recv)) if run.chunk_recv[i] < t_restart) < t_kill + 0.2
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 1 and not [e for e in events if e["event"] in ("success", "timeout", "reset")], events
    resumed = (js_t > t_resumed - 0.5) & (js_t < t_resumed + 2.0)
    assert np.linalg.norm(js_p[resumed, :3] - js_p[resumed][0, :3], axis=1).max() > 0.005, \
        "the arm did not move again after vla_node came back"


def test_inference_delay_reaches_the_arm_as_latency(sim, random_sim_checkpoint, tmp_path, ros_domain_id):
    """vla_node's inference_delay_ms: every chunk is published that much later (observation -> chunk), and
    action_node skips the rows whose time has passed (the loop keeps its rate)."""
    from edgefm_ros.tools.sim_ros import run_ros

    delay = 250.0
    rr = run_ros(random_sim_checkpoint, ["reach:1001"], out_dir=tmp_path, delay_ms=delay, domain_id=ros_domain_id,
                 progress=None, mode="process")
    lat = rr.report["inference_latency_ms"]
    assert delay <= lat["p50"] < delay + 400, lat
    assert rr.report["settings"]["delay_ms"] == delay
    assert_sim_at_rate(rr.report)
    skipped = [float(h[4]["skipped_rows_p50"]) for h in rr.run.diag_history
               if h[1].startswith("action_node") and h[4].get("skipped_rows_p50", "nan") != "nan"]
    assert skipped and skipped[-1] >= delay / 1e3 * rr.report["control_hz"] - 1, skipped[-3:]

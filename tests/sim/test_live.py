"""sim_node's episode logic without ROS or MuJoCo (edgefm_ros.sim.live) on a stand-in arm: commands checked
before they reach the arm, physics kept on the wall clock, episodes ended by success, timeout or request."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from edgefm_ros.sim.live import Episode, LiveConfig, LiveSim, command_target, parse_episode

JOINTS = ("ee_x", "ee_y", "ee_z", "gripper")


@dataclass(frozen=True)
class Task:
    instruction: str
    max_seconds: float


class Arm:
    """A first-order position controller: the hand moves toward the target at ``speed`` m/s."""

    def __init__(self, speed=0.5):
        self.speed, self.sim_time = speed, 0.0
        self.resets: list[tuple[str, int]] = []

    def reset(self, task, seed):
        self.resets.append((task, seed))
        rng = np.random.default_rng(seed)
        self.pos = rng.uniform(-0.1, 0.1, 3)
        self.goal = rng.uniform(-0.1, 0.1, 3)
        self.target = np.append(self.pos, 0.0)

    def set_command(self, target):
        t = np.asarray(target, dtype=np.float64)
        assert t.shape == (4,) and np.all(np.isfinite(t))
        self.target = t

    def advance(self, seconds):
        assert seconds > 0
        d = self.target[:3] - self.pos
        step = min(1.0, self.speed * seconds / max(np.linalg.norm(d), 1e-12))
        self.pos = self.pos + d * step
        self.sim_time += seconds

    def state(self):
        return np.append(self.pos, self.target[3]).astype(np.float32)

    def success(self):
        return bool(np.linalg.norm(self.pos - self.goal) < 0.01)


TASKS = {"reach": Task("reach the goal", 2.0), "push": Task("push it", 3.0)}


def _run(live, t0, t1, dt=0.01, on_tick=None):
    events, t = [], t0
    while t < t1:
        if on_tick:
            on_tick(t)
        events += live.update(t)
        t += dt
    return events, t


def test_command_target_refuses_bad_commands_naming_the_problem():
    rng = np.random.default_rng()
    x = rng.normal(size=4)
    perm = rng.permutation(4)
    np.testing.assert_array_equal(command_target([JOINTS[i] for i in perm], x[perm], JOINTS), x)
    np.testing.assert_array_equal(command_target([], x, JOINTS), x)  # Float64MultiArray: configured order
    bad = x.copy()
    bad[rng.integers(4)] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        command_target(JOINTS, bad, JOINTS)
    with pytest.raises(ValueError, match="3 values, expected 4"):
        command_target([], x[:3], JOINTS)
    with pytest.raises(ValueError, match="unknown joints \\['joint_1'\\]"):
        command_target(["ee_x", "joint_1", "ee_z", "gripper"], x, JOINTS)
    with pytest.raises(ValueError, match="lacks joints \\['gripper'\\]"):
        command_target(JOINTS[:3], x[:3], JOINTS)
    with pytest.raises(ValueError, match="but 3 values"):
        command_target(JOINTS, x[:3], JOINTS)


def test_parse_episode():
    assert parse_episode("reach:1003", TASKS) == Episode("reach", 1003)
    for bad, msg in (("reach", "not 'task:seed'"), ("fly:3", "unknown task 'fly'"), ("reach:x", "not an integer")):
        with pytest.raises(ValueError, match=msg):
            parse_episode(bad, TASKS)


def test_physics_follows_the_wall_clock_and_holds_without_commands():
    arm = Arm()
    live = LiveSim(arm, TASKS, [Episode("reach", 5)], LiveConfig(settle_s=0.0))
    t0 = 1000.0
    ev = live.update(t0)
    assert ev[0]["event"] == "start" and ev[0]["instruction"] == "reach the goal" and arm.resets == [("reach", 5)]
    start = arm.pos.copy()
    _run(live, t0 + 0.01, t0 + 1.0)
    assert arm.sim_time == pytest.approx(1.0, abs=0.02)  # simulated time kept up with the clock
    np.testing.assert_allclose(arm.pos, start)  # no command: the arm held
    live.update(t0 + 1.2)  # a late update: physics advances by the whole gap
    assert arm.sim_time == pytest.approx(1.2, abs=0.02) and live.current.slipped_s == 0.0
    live.update(t0 + 2.0)  # beyond max_catchup_s (0.25 s) the simulation slips, counted
    assert live.current.slipped_s == pytest.approx(0.8 - 0.25, abs=0.02)
    assert arm.sim_time == pytest.approx(1.45, abs=0.02)


def test_bad_and_stale_commands_never_move_the_arm_good_ones_reach_the_goal():
    arm = Arm(speed=1.0)
    live = LiveSim(arm, TASKS, [Episode("reach", 7), Episode("push", 8)], LiveConfig(settle_s=0.2))
    t0 = 50.0
    live.update(t0)
    start = arm.pos.copy()
    goal = np.append(arm.goal, 0.5)
    nan = goal.copy()
    nan[2] = np.nan
    bad = [(JOINTS, nan), ([], goal[:3]), (("ee_x", "ee_y", "elbow", "gripper"), goal), (JOINTS, goal[:2])]
    for names, pos in bad:
        assert not live.command(names, pos, t0 + 0.01, t0 + 0.01)
    assert not live.command(JOINTS, goal, t0 - 0.5, t0 + 0.01)  # stamped before the episode: old policy
    _run(live, t0 + 0.01, t0 + 0.5)
    np.testing.assert_allclose(arm.pos, start)
    assert live.rejected_total == 4 and live.current.rejected == 4 and live.stale_total == 1
    assert "but 2 values" in live.last_rejection
    assert live.command(JOINTS[::-1], goal[::-1], t0 + 0.5, t0 + 0.5)
    events, t = _run(live, t0 + 0.5, t0 + 2.0)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "success" and kinds[1] == "start", kinds
    rec = live.finished[0].result()
    assert rec["success"] and rec["task"] == "reach" and rec["seed"] == 7 and rec["commands"] == 1
    assert 0.5 < rec["time_to_success_s"] < 0.9 and rec["rejected_commands"] == 4
    assert events[1]["t"] - events[0]["t"] == pytest.approx(0.2, abs=0.011)  # settle_s
    assert arm.resets[-1] == ("push", 8)


def test_timeout_reset_request_and_done():
    arm = Arm()
    live = LiveSim(arm, TASKS, [Episode("reach", 1), Episode("push", 2)], LiveConfig(settle_s=0.0))
    events, t = _run(live, 0.0, 2.5)
    assert [e["event"] for e in events] == ["start", "timeout", "start"]
    assert events[1]["elapsed_s"] == pytest.approx(2.0, abs=0.011)  # the task's max_seconds
    live.request(None)  # end push early
    live.request(Episode("reach", 9))
    ev = live.update(t)
    assert [e["event"] for e in ev] == ["reset", "start"] and ev[1]["seed"] == 9
    with pytest.raises(ValueError, match="unknown task"):
        live.request(Episode("fly", 1))
    events, _ = _run(live, t + 0.01, t + 2.2)
    assert [e["event"] for e in events] == ["timeout", "done"]
    assert [r.outcome for r in live.finished] == ["timeout", "reset", "timeout"]
    assert live.phase == "done" and not math.isnan(live.finished[-1].end)


def test_config_errors_name_the_value():
    with pytest.raises(ValueError, match="settle_s"):
        LiveConfig(settle_s=-1.0)
    with pytest.raises(ValueError, match="unknown tasks \\['fly'\\]"):
        LiveSim(Arm(), TASKS, [Episode("fly", 1)], LiveConfig())


def test_commands_just_after_a_start_are_the_old_episode_s():
    """action_node may command from the old episode until the episode-start message reaches it: a command
    stamped within command_guard_s of the start is ignored, a later one is applied."""
    arm = Arm()
    live = LiveSim(arm, TASKS, [Episode("reach", 3)], LiveConfig(command_guard_s=0.05))
    live.update(10.0)
    start = arm.pos.copy()
    far = np.append(start + 0.2, 0.0)
    assert not live.command(JOINTS, far, 10.03, 10.03)
    _run(live, 10.01, 10.3)
    np.testing.assert_allclose(arm.pos, start)
    assert live.stale_total == 1
    assert live.command(JOINTS, far, 10.3, 10.3)
    _run(live, 10.3, 10.5)
    assert np.linalg.norm(arm.pos - start) > 0.05

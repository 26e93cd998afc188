"""The simulated teleoperation device (edgefm_ros.sim.teleop), no ROS: it teaches the tasks through the
simulator's position interface, its noise and hesitations are seeded and bounded, bad input is refused."""
from __future__ import annotations

import numpy as np
import pytest

from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.teleop import GROUND_TRUTH_NAMES, TeleopConfig, TeleopOperator, ground_truth_vector


@pytest.fixture(scope="module")
def env():
    e = SimEnv(SimConfig())
    yield e
    e.close()


def _teach(env, op: TeleopOperator, task: str, seed: int) -> tuple[bool, list[np.ndarray]]:
    """One episode with commands at the device's rate; (success, commands sent)."""
    env.reset(task, seed)
    op.begin(task, seed, env.observation())
    sent = []
    while env.sim_time < env.task.max_seconds:
        cmd = op.command(env.observation(), env.sim_time)
        sent.append(cmd)
        env.set_command(cmd)
        env.advance(1.0 / op.cfg.rate_hz)
        if env.success():
            return True, sent
    return False, sent


@pytest.mark.parametrize("task", ["drawer-open", "reach"])
def test_the_device_teaches_the_task_from_ground_truth_alone(env, task):
    op = TeleopOperator(TeleopConfig())
    results = [_teach(env, op, task, seed)[0] for seed in range(5)]
    assert all(results), results


def test_noise_is_seeded_and_does_not_accumulate(env):
    clean = TeleopOperator(TeleopConfig())
    noisy = TeleopOperator(TeleopConfig(noise_m=0.004, seed=1))
    ok_c, cmds_c = _teach(env, clean, "drawer-open", 7)
    ok_n, cmds_n = _teach(env, noisy, "drawer-open", 7)
    assert ok_c and ok_n
    again = TeleopOperator(TeleopConfig(noise_m=0.004, seed=1))
    _, cmds_again = _teach(env, again, "drawer-open", 7)
    assert np.array_equal(np.stack(cmds_n), np.stack(cmds_again))  # the same seed, the same commands
    # the first command of each: the same intended target, noise of the configured size around it
    env.reset("drawer-open", 7)
    obs = env.observation()
    clean.begin("drawer-open", 7, obs)
    noisy.begin("drawer-open", 7, obs)
    devs = []
    for _ in range(200):  # the same observation: the clean target moves the same way, the noise does not add up
        c, n = clean.command(obs, 0.0), noisy.command(obs, 0.0)
        devs.append(n[:3] - c[:3])
    devs = np.stack(devs)
    assert 0.002 < devs.std() < 0.006 and np.abs(devs.mean(0)).max() < 0.002


def test_hesitations_hold_the_last_command(env):
    op = TeleopOperator(TeleopConfig(hesitate_per_s=2.0, hesitate_s=(0.3, 0.3), seed=3))
    ok, sent = _teach(env, op, "window-open", 11)
    assert op.hesitations >= 1
    repeats = sum(np.array_equal(a, b) for a, b in zip(sent, sent[1:]))
    assert repeats >= op.hesitations * 5  # 0.3 s at 20 Hz: 6 commands held per hesitation
    assert ok  # a hesitant teacher still finishes within the time limit


def test_bad_config_and_input_are_refused():
    with pytest.raises(ValueError, match="control_hz 7"):
        TeleopConfig(rate_hz=7.0)
    with pytest.raises(ValueError, match="noise_m"):
        TeleopConfig(noise_m=0.5)
    with pytest.raises(ValueError, match="hesitate_s"):
        TeleopConfig(hesitate_s=(0.5, 0.1))
    op = TeleopOperator()
    with pytest.raises(RuntimeError, match="begin"):
        op.command(np.zeros(39), 0.0)
    with pytest.raises(ValueError, match="unknown task 'fly'"):
        op.begin("fly", 0, np.zeros(39))
    with pytest.raises(ValueError, match="39 values"):
        op.begin("reach", 0, np.zeros(4))
    v = np.arange(39.0)
    assert np.array_equal(ground_truth_vector(GROUND_TRUTH_NAMES, v), v)
    with pytest.raises(ValueError, match="missing"):
        ground_truth_vector(GROUND_TRUTH_NAMES[:-1], v[:-1])
    bad = v.copy()
    bad[5] = np.nan
    with pytest.raises(ValueError, match="obj1_y"):
        ground_truth_vector(GROUND_TRUTH_NAMES, bad)

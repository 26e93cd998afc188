"""The synchronous closed loop (edgefm_ros.sim.rollout): chunks executed n_action_steps at a time with the
policy blocking simulated time, success timed, bad chunks refused; ``edgefm-sim eval --exec sync`` end to end
on a tiny random-weight checkpoint (plumbing and determinism; its actions mean nothing)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgefm_ros.sim.env import SimConfig, SimEnv  # noqa: E402  (first: it picks the headless GL)

pytest.importorskip("metaworld", reason="metaworld not installed (scripts/setup.sh installs it)")

from edgefm_ros.sim.rollout import EnginePolicy, checkpoint_settings, checkpoint_tasks, run_episode  # noqa: E402
from edgefm_ros.sim.tasks import TASKS  # noqa: E402


@pytest.fixture(scope="module")
def env():
    e = SimEnv(SimConfig(image_hw=(32, 32)))
    yield e
    e.close()


class GoalPolicy:
    """Sees the goal through the env (a test oracle): a chunk of targets on the straight line to it."""

    def __init__(self, env, chunk=10, step=0.02):
        self.env, self.chunk, self.step, self.calls = env, chunk, step, []

    def __call__(self, images, state, instruction):
        self.calls.append((set(images), state.copy(), instruction))
        goal = self.env.observation()[36:39]
        d = goal - state[:3]
        n = np.linalg.norm(d)
        k = np.arange(1, self.chunk + 1)[:, None] * self.step
        xyz = state[:3] + d / max(n, 1e-9) * np.minimum(k, n)
        return np.concatenate([xyz, np.zeros((self.chunk, 1))], axis=1)


def test_oracle_policy_reaches_and_chunks_are_cut(env):
    pol = GoalPolicy(env)
    r = run_episode(env, pol, "reach", 1000, n_action_steps=4)
    assert r.success and 0 < r.time_to_success_s < 5.0
    assert r.boundaries == tuple(range(0, 4 * len(r.boundaries), 4))
    assert len(r.commands) <= 4 * len(r.boundaries) and r.commands.shape[1] == 4
    assert len(pol.calls) == len(r.boundaries) == len(r.inference_s)
    imgs, state, text = pol.calls[0]
    assert imgs == {"scene", "wrist"} and state.shape == (4,) and text == "move the gripper to the red ball"
    assert np.isclose(r.time_to_success_s, len(r.commands) / env.config.control_hz)


def test_waiting_for_inference_slows_success(env):
    fast = run_episode(env, GoalPolicy(env), "reach", 1001, n_action_steps=4)
    slow = run_episode(env, GoalPolicy(env), "reach", 1001, n_action_steps=4, delay_s=0.2)
    assert fast.success and slow.success and slow.time_to_success_s > fast.time_to_success_s + 0.1


def test_a_policy_that_never_moves_times_out(env):
    def hold(images, state, instruction):
        return np.tile(np.append(state[:3], 0.0), (8, 1))

    r = run_episode(env, hold, "button-press-topdown", 1002, n_action_steps=8, max_seconds=1.0)
    assert not r.success and np.isnan(r.time_to_success_s)
    assert len(r.commands) == 20  # 1 s at 20 Hz


@pytest.mark.parametrize("chunk", [np.zeros((8, 3)), np.zeros(4), np.full((8, 4), np.nan)])
def test_bad_chunks_are_refused(env, chunk):
    with pytest.raises(ValueError):
        run_episode(env, lambda *a: chunk, "reach", 1003, n_action_steps=4, max_seconds=0.5)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    pytest.importorskip("torch")
    from edgefm_ros.training.random_checkpoint import make_checkpoint

    out = make_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", "tiny", cameras=2, raw_hw=(32, 32), dim=4)
    cfg = json.loads((out / "config.json").read_text())
    feats = cfg["input_features"]
    for i, cam in enumerate(("scene", "wrist")):
        feats[f"observation.images.{cam}"] = feats.pop(f"observation.images.camera{i + 1}")
    cfg["n_action_steps"] = 10
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_checkpoint_settings(tiny_checkpoint):
    st = checkpoint_settings(tiny_checkpoint)
    assert st["image_hw"] == (32, 32) and set(st["cameras"]) == {"scene", "wrist"} and st["n_action_steps"] == 10


def test_checkpoint_tasks_from_training_record(tmp_path):
    assert checkpoint_tasks(tmp_path) == list(TASKS)  # no record: every task
    (tmp_path / "edgefm_train.json").write_text(json.dumps({"tasks": [TASKS["drawer-open"].instruction,
                                                                      TASKS["reach"].instruction]}))
    assert checkpoint_tasks(tmp_path) == ["drawer-open", "reach"]


def test_sync_eval_cli_end_to_end(tiny_checkpoint, tmp_path):
    from edgefm_ros.tools.sim_cli import main

    out = tmp_path / "eval.json"
    args = ["eval", "--exec", "sync", "--checkpoint", str(tiny_checkpoint), "--tasks", "reach",
            "--seeds", "1000-1001", "--max-seconds", "1.0", "--json", str(out)]
    assert main(args) == 0
    rep = json.loads(out.read_text())
    assert rep["exec"] == "sync" and rep["episodes"] == 2 and set(rep["tasks"]) == {"reach"}
    assert rep["settings"]["n_action_steps"] == 10
    d = rep["episodes_detail"]
    assert [e["seed"] for e in d] == [1000, 1001]
    assert all(e["commands"] == 20 and e["chunks"] == 2 for e in d)  # 1 s at 20 Hz, 10 actions per chunk
    assert rep["inference_latency_ms"]["count"] >= 2
    assert main(args[:-2] + ["--json", str(tmp_path / "again.json")]) == 0  # same seeds, same episodes
    again = json.loads((tmp_path / "again.json").read_text())
    assert [e["rms_jerk"] for e in again["episodes_detail"]] == [e["rms_jerk"] for e in d]
    assert main(["eval", "--exec", "sync", "--checkpoint", str(tiny_checkpoint), "--seeds", "0-1"]) == 2  # train seeds
    assert rep["settings"]["engine_mode"] == "exact"


def test_sync_eval_runs_the_engine_mode_asked_for(tiny_checkpoint, tmp_path, monkeypatch):
    """--mode fast builds the policy's engine in fast mode (its tuned kernels), and the report says so; an
    unknown mode is refused by the parser."""
    from edgefm_ros.runtime import engine as engine_mod
    from edgefm_ros.tools.sim_cli import main

    built = []
    real = engine_mod.Engine.from_checkpoint.__func__

    def spy(cls, *a, **kw):
        eng = real(cls, *a, **kw)
        built.append(eng.config.mode)
        return eng

    monkeypatch.setattr(engine_mod.Engine, "from_checkpoint", classmethod(spy))
    out = tmp_path / "fast.json"
    assert main(["eval", "--exec", "sync", "--mode", "fast", "--checkpoint", str(tiny_checkpoint), "--tasks", "reach",
                 "--seeds", "1000", "--max-seconds", "0.5", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert built == ["fast"] and rep["settings"]["engine_mode"] == "fast" and rep["episodes"] == 1
    with pytest.raises(SystemExit):
        main(["eval", "--exec", "sync", "--mode", "turbo", "--checkpoint", str(tiny_checkpoint)])


def test_engine_policy_refuses_missing_cameras(tiny_checkpoint):
    from edgefm_ros.runtime.engine import Engine

    eng = Engine.from_checkpoint(tiny_checkpoint)
    with pytest.raises(ValueError, match="wrist"):
        EnginePolicy(eng, ["scene"])

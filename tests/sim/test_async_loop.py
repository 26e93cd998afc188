"""The asynchronous loop on the simulated clock (edgefm_ros.sim.async_loop) with a scripted env and policy:
chunks arrive ``latency`` after their observation while the queue keeps commanding; ``rtc`` sends the last
chunk's actions from the observation on and the delay in ticks."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from edgefm_ros.sim.async_loop import run_async_episode
from edgefm_ros.types import ActionChunk

RNG = np.random.default_rng()
HZ = 20.0


@dataclass
class _Config:
    control_hz: float = HZ


class ScriptedEnv:
    """Records commands; succeeds after ``ticks`` ticks."""

    def __init__(self, ticks: int):
        self.config, self.ticks, self.sim_time, self.commanded = _Config(), ticks, 0.0, []

    def reset(self, task, seed):
        self.sim_time, self.commanded = 0.0, []

    def render(self):
        return {"scene": np.zeros((4, 4, 3), np.uint8), "wrist": np.zeros((4, 4, 3), np.uint8)}

    def state(self):
        return np.zeros(4, np.float32)

    def set_command(self, cmd):
        self.commanded.append((round(self.sim_time * HZ), np.asarray(cmd).copy()))

    def advance(self, s):
        self.sim_time += s

    def success(self):
        return self.sim_time * HZ >= self.ticks - 1e-6


@dataclass
class _Spec:
    chunk_size: int = 8
    max_action_dim: int = 6
    action_dim: int = 5
    camera_keys: tuple = ("observation.images.scene", "observation.images.wrist")


class ScriptedEngine:
    """Chunk c's row i = [c, stamp tick + i, random, random, 0]: the command says which chunk and which tick."""

    def __init__(self):
        self.spec, self.calls = _Spec(), []

    def predict(self, obs, *, noise, dt, rtc_prefix=None, rtc_delay=0):
        c = len(self.calls) + 1
        self.calls.append((obs.stamp, None if rtc_prefix is None else np.array(rtc_prefix), rtc_delay))
        rows = np.arange(self.spec.chunk_size)
        a = np.stack([np.full(8, c), round(obs.stamp * HZ) + rows, RNG.normal(size=8), RNG.normal(size=8),
                      np.zeros(8)], axis=1).astype(np.float32)
        return ActionChunk(actions=a, dt=dt, stamp=obs.stamp)


@pytest.mark.parametrize("aggregate", ["latest_only", "rtc"])
def test_queue_keeps_commanding_while_a_chunk_is_computed(aggregate):
    latency_ticks = int(RNG.integers(1, 4))
    env, eng = ScriptedEnv(60), ScriptedEngine()
    r = run_async_episode(env, eng, "reach", 1000, aggregate=aggregate, latency_s=latency_ticks / HZ - 1e-4,
                          restamp_held=False)
    assert r.success
    # every command is the row of its chunk meant for its tick (rows past on arrival skipped, not replayed)
    for tick, cmd in env.commanded:
        assert abs(cmd[1] - tick) < 1e-6, (tick, cmd)
    # chunk c (c >= 2) is requested with 4 of the 8 rows left and first commanded latency_ticks later
    stamps = [round(s * HZ) for s, _, _ in eng.calls]
    firsts = {}
    for tick, cmd in env.commanded:
        firsts.setdefault(int(round(cmd[0])), tick)
    for c in range(2, max(firsts) + 1):
        assert firsts[c] == stamps[c - 1] + latency_ticks
    assert not any(np.isnan(cmd).any() for _, cmd in env.commanded)
    assert len(r.boundaries) == len(firsts)


def test_rtc_sends_last_chunk_from_observation_and_delay():
    latency = 0.17  # 3.4 ticks -> d = 4
    env, eng = ScriptedEnv(60), ScriptedEngine()
    run_async_episode(env, eng, "reach", 1000, aggregate="rtc", latency_s=latency, restamp_held=False)
    assert eng.calls[0][1] is None  # nothing to continue
    chunks = {}
    for i, (stamp, prefix, delay) in enumerate(eng.calls[1:], start=2):
        assert delay == math.ceil(latency * HZ)
        # the prefix is the last chunk that arrived before this request, from this observation's tick on
        assert prefix is not None and np.all(prefix[:, 1] == round(stamp * HZ) + np.arange(len(prefix)))
        assert np.all(prefix[:, 0] == prefix[0, 0]) and prefix.shape[1] == eng.spec.action_dim
        chunks[i] = prefix
    assert chunks


@pytest.mark.parametrize("aggregate", ["latest_only", "rtc"])
def test_a_chunk_asked_for_while_holding_starts_at_its_arrival(aggregate):
    """The first request (nothing queued: the arm holds) takes L ticks: its row 0 is the first command, at tick
    L, not row L; the same for a chunk after an underrun. Without restamping, rows of the wait are skipped."""
    lat = int(RNG.integers(3, 8))  # under the 8-row chunk: without restamping some rows still run
    env, eng = ScriptedEnv(80), ScriptedEngine()
    run_async_episode(env, eng, "reach", 1000, aggregate=aggregate, latency_s=lat / HZ - 1e-4)
    first = [cmd for _, cmd in env.commanded if cmd[0] == 1]
    assert env.commanded[0][0] == lat and abs(first[0][1]) < 0.01 and abs(first[1][1] - 1) < 0.01  # rows 0, 1
    env2, eng2 = ScriptedEnv(80), ScriptedEngine()
    run_async_episode(env2, eng2, "reach", 1000, aggregate=aggregate, latency_s=lat / HZ - 1e-4,
                      restamp_held=False)
    assert abs([cmd for _, cmd in env2.commanded if cmd[0] == 1][0][1] - lat) < 0.01  # row L: the wait skipped


def test_latest_only_sends_no_prefix():
    env, eng = ScriptedEnv(40), ScriptedEngine()
    run_async_episode(env, eng, "reach", 1000, aggregate="latest_only", latency_s=0.1)
    assert len(eng.calls) > 2 and all(p is None and d == 0 for _, p, d in eng.calls)


def test_cli_async_eval_on_committed_checkpoint(tmp_path, repo_root):
    """`edgefm-sim eval --exec async` end to end (Meta-World, the committed checkpoint): rtc guides the chunks
    (other commands than latest_only on the same seed and latency), both reports say how they ran."""
    from skips import require_material, require_module

    require_module("metaworld", "metaworld not installed (scripts/setup.sh installs it)")
    ckpt = repo_root / "checkpoints" / "smolvla-metaworld"
    require_material((ckpt / "config.json").is_file(), f"committed checkpoint missing at {ckpt}")
    from edgefm_ros.tools.sim_cli import main

    reports = {}
    for agg in ("latest_only", "rtc"):
        out = tmp_path / f"{agg}.json"
        assert main(["eval", "--exec", "async", "--checkpoint", str(ckpt), "--tasks", "button-press-topdown",
                     "--seeds", "1000-1000", "--aggregate", agg, "--delay-ms", "150", "--json", str(out)]) == 0
        import json

        reports[agg] = json.loads(out.read_text())
    for agg, r in reports.items():
        assert r["exec"] == "async-sim" and r["settings"]["aggregate"] == agg
        assert r["settings"]["latency_ms"] == pytest.approx(200.0) and r["episodes"] == 1
    a, b = (reports[k]["episodes_detail"][0] for k in ("latest_only", "rtc"))
    assert (a["rms_jerk"], a["commands"]) != (b["rms_jerk"], b["commands"])

"""The benchmark's episode draws (edgefm_ros.sim.conditions, tasks, episode): camera conditions per seed and
what each does to a frame, the condition sets' shares, instruction phrasings held out of training, disjoint
seed sets, and the same condition and instruction for the same episode in the sync and async executors."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgefm_ros.sim import conditions as C
from edgefm_ros.sim.episode import episode_setup
from edgefm_ros.sim.tasks import (CALIBRATION_SEEDS, EVAL_SEEDS, SEED_SETS, TASKS, TRAIN_SEEDS,
                                  episode_instruction)

RNG = np.random.default_rng()


def scene(h: int = 96, w: int = 128) -> np.ndarray:
    """A frame with flat regions, edges and a mid-grey level: what each condition does is measurable."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.empty((h, w, 3), np.uint8)
    img[..., 0] = (60 + 120 * ((x // 16 + y // 16) % 2)).astype(np.uint8)  # checkerboard edges
    img[..., 1] = (40 + 160 * x / (w - 1)).astype(np.uint8)  # ramp
    img[..., 2] = 110
    return img


def sharpness(img: np.ndarray) -> float:
    """Edge energy of the checkerboard channel (mean squared difference of neighbours)."""
    g = img[..., 0].astype(np.float64)
    return float((np.diff(g, axis=0) ** 2).mean() + (np.diff(g, axis=1) ** 2).mean())


def test_draw_is_deterministic_per_seed_and_independent_of_order():
    seeds = RNG.integers(0, 10_000, size=50).tolist()
    first = [C.draw_condition("mixed", "push", s).name for s in seeds]
    again = [C.draw_condition("mixed", "push", s).name for s in reversed(seeds)][::-1]
    assert first == again
    assert all(episode_setup("push", s, "mixed").condition.name == n for s, n in zip(seeds, first))
    # tasks draw independently: one seed's episodes are not all under one condition
    by_task = [[C.draw_condition("mixed", t, s).name for s in range(200)] for t in TASKS]
    assert len({tuple(x) for x in by_task}) == len(TASKS)


@pytest.mark.parametrize("name", sorted(C.CONDITION_SETS))
def test_condition_sets_draw_their_stated_shares(name):
    cs = C.CONDITION_SETS[name]
    n = 4000
    counts = Counter(C.draw_condition(name, list(TASKS)[s % len(TASKS)], s).name for s in range(n))
    assert set(counts) == {c for c, _ in cs.shares}
    for cond, share in cs.shares:
        sd = np.sqrt(share * (1 - share) / n)
        assert abs(counts[cond] / n - share) < 4 * sd + 1e-9, (cond, counts[cond] / n, share)


def test_sets_name_their_shares():
    mixed = C.CONDITION_SETS["mixed"]
    assert C.DEFAULT_ROUTING_SET == "mixed"
    assert mixed.share("clean") == pytest.approx(0.4)
    assert sum(mixed.share(d) for d in C.DEGRADED) == pytest.approx(0.6)
    assert C.CONDITION_SETS["clean"].shares == (("clean", 1.0),)
    assert C.CONDITION_SETS["degraded"].share("clean") == 0.0
    assert set(C.DEGRADED) == {"blur", "dark", "bright", "noise", "jpeg"}


def test_bad_names_and_configs_raise_naming_the_value():
    with pytest.raises(ValueError, match="'foggy'"):
        C.get_condition_set("foggy")
    with pytest.raises(ValueError, match="1.5"):
        C.ConditionSet("x", (("clean", 1.5),))
    with pytest.raises(ValueError, match="'smoke'"):
        C.ConditionSet("x", (("smoke", 1.0),))
    with pytest.raises(ValueError, match="0"):
        C.JpegWire(quality=0)
    with pytest.raises(ValueError, match="-3"):
        C.SensorNoise(std=-3.0)
    with pytest.raises(ValueError, match="float32"):
        C.CONDITIONS["blur"].apply(np.zeros((8, 8, 3), np.float32), RNG)


def apply(name: str, img: np.ndarray, seed: int = 5) -> np.ndarray:
    return C.ConditionedCamera(C.CONDITIONS[name], seed)({"scene": img})["scene"]


def test_clean_leaves_the_frame_as_rendered():
    img = scene()
    assert np.array_equal(apply("clean", img), img)


def test_blur_removes_detail_and_keeps_brightness():
    img = scene()
    out = apply("blur", img)
    assert out.shape == img.shape and out.dtype == np.uint8
    assert sharpness(out) < 0.25 * sharpness(img)
    assert abs(out.mean() - img.mean()) < 3.0
    # the size is a fraction of the width: at twice the resolution, the blurred frame downsampled again is
    # (nearly) the blurred small frame
    big = np.repeat(np.repeat(img, 2, 0), 2, 1)
    back = apply("blur", big).reshape(96, 2, 128, 2, 3).mean((1, 3))
    assert np.abs(back - out).mean() < 2.0


def test_exposure_darkens_or_clips():
    img = scene()
    dark, bright = apply("dark", img), apply("bright", img)
    assert dark.mean() < 0.45 * img.mean()
    assert bright.mean() > 1.4 * img.mean()
    assert (bright == 255).mean() > (img == 255).mean() + 0.2  # highlights clip
    assert len(np.unique(dark[..., 0])) < len(np.unique(img[..., 0])) + 1  # no new levels appear in the dark


def test_noise_is_fresh_per_frame_and_reproducible_per_seed():
    img = scene()
    cam = C.ConditionedCamera(C.CONDITIONS["noise"], 11)
    a, b = cam({"scene": img})["scene"], cam({"scene": img})["scene"]
    assert not np.array_equal(a, b)  # a new draw every frame
    interior = (img > 60) & (img < 195)  # not clipped at 0/255 by a 40-level std
    resid = a.astype(np.float64) - img
    assert resid[interior].std() == pytest.approx(C.CONDITIONS["noise"].std, rel=0.1)
    again = C.ConditionedCamera(C.CONDITIONS["noise"], 11)
    assert np.array_equal(again({"scene": img})["scene"], a)  # the same seed, the same frames


def test_jpeg_wire_loses_detail_like_a_low_quality_jpeg():
    img = scene()
    out = apply("jpeg", img)
    assert out.shape == img.shape
    err = np.abs(out.astype(np.int16) - img).mean()
    good = C.JpegWire(quality=95).apply(img, RNG)
    assert err > 5.0 and err > 2 * np.abs(good.astype(np.int16) - img).mean()


def test_augmentation_covers_every_condition_kind():
    rng = np.random.default_rng(RNG.integers(1 << 30))
    kinds = Counter(C.random_condition(rng).name for _ in range(500))
    assert set(kinds) == set(C.CONDITIONS)


def test_seed_sets_are_disjoint():
    sets = list(SEED_SETS.values())
    for i, a in enumerate(sets):
        for b in sets[i + 1:]:
            assert not set(a) & set(b)
    assert SEED_SETS == {"train": TRAIN_SEEDS, "eval": EVAL_SEEDS, "calibration": CALIBRATION_SEEDS}


def test_held_out_phrasings_never_reach_training_seeds():
    for name, spec in TASKS.items():
        assert spec.heldout and len(spec.train_phrasings) >= 3
        assert not set(spec.heldout) & set(spec.train_phrasings)
        train_draws = {episode_instruction(name, s, "varied") for s in TRAIN_SEEDS}
        assert train_draws == set(spec.train_phrasings)  # every training phrasing used, no held-out one
        eval_draws = Counter(episode_instruction(name, s, "varied") for s in list(EVAL_SEEDS)[:300])
        assert set(spec.heldout) <= set(eval_draws)  # evaluation sees the held-out wordings
        for s in list(CALIBRATION_SEEDS)[:50]:
            assert episode_instruction(name, s, "varied") in spec.all_phrasings
        assert episode_instruction(name, 1234, "canonical") == spec.instruction
    with pytest.raises(ValueError, match="'fancy'"):
        episode_instruction("push", 1, "fancy")


class _Recorder:
    """A policy for both executors: records the first observation and holds the arm where it is."""

    def __init__(self):
        self.seen = []

    # sync: policy(images, state, instruction)
    def __call__(self, images, state, instruction):
        self.seen.append(({k: v.copy() for k, v in images.items()}, instruction))
        return np.tile(np.concatenate([state[:3], [-1.0]]), (4, 1))

    # async: engine.predict(obs, ...)
    @property
    def spec(self):
        from types import SimpleNamespace

        return SimpleNamespace(chunk_size=4, max_action_dim=4, action_dim=4,
                               camera_keys=("observation.images.scene", "observation.images.wrist"))

    def predict(self, obs, *, noise, dt, rtc_prefix=None, rtc_delay=0):
        from edgefm_ros.types import ActionChunk

        images = {k.removeprefix("observation.images."): v for k, v in obs.images.items()}
        a = self(images, obs.state, obs.task)
        return ActionChunk(actions=a.astype(np.float32), dt=dt, stamp=obs.stamp)


def test_sync_and_async_apply_the_same_condition_to_the_same_episode():
    from edgefm_ros.sim.async_loop import run_async_episode
    from edgefm_ros.sim.env import SimConfig, SimEnv
    from edgefm_ros.sim.rollout import run_episode

    # one seed per degradation kind that changes pixels at random (noise) and one deterministic (jpeg)
    picks = {}
    for s in EVAL_SEEDS:
        picks.setdefault(C.draw_condition("mixed", "reach", s).name, s)
        if {"noise", "jpeg"} <= set(picks):
            break
    with SimEnv(SimConfig(image_hw=(32, 32))) as env:
        for cond in ("noise", "jpeg"):
            seed = picks[cond]
            env.reset("reach", seed)
            rendered = env.render()
            sync, asy = _Recorder(), _Recorder()
            r1 = run_episode(env, sync, "reach", seed, n_action_steps=2, max_seconds=0.2, conditions="mixed",
                             phrasings="varied")
            r2 = run_async_episode(env, asy, "reach", seed, aggregate="latest_only", latency_s=0.05,
                                   max_seconds=0.2, conditions="mixed", phrasings="varied")
            assert r1.condition == r2.condition == cond
            (img1, text1), (img2, text2) = sync.seen[0], asy.seen[0]
            assert text1 == text2 == episode_instruction("reach", seed, "varied") == r1.instruction
            for cam in ("scene", "wrist"):
                assert np.array_equal(img1[cam], img2[cam])  # the same frame under the same draw
                assert not np.array_equal(img1[cam], rendered[cam])  # and it is not the clean render
            clean = _Recorder()
            run_episode(env, clean, "reach", seed, n_action_steps=2, max_seconds=0.1)
            assert np.array_equal(clean.seen[0][0]["scene"], rendered["scene"])  # default: clean, canonical
            assert clean.seen[0][1] == TASKS["reach"].instruction


def test_live_sim_publishes_the_episode_condition_and_instruction():
    """sim_node's episode logic: the start event names the seed's condition and wording; camera() applies it."""
    from edgefm_ros.sim.live import LiveConfig, LiveSim, Episode

    class Arm:
        sim_time = 0.0

        def reset(self, task, seed):
            self.sim_time = 0.0

        def set_command(self, target):
            pass

        def advance(self, seconds):
            self.sim_time += seconds

        def success(self):
            return False

    seed = next(s for s in EVAL_SEEDS if C.draw_condition("degraded", "push", s).name == "dark")
    live = LiveSim(Arm(), TASKS, [Episode("push", seed)], LiveConfig(conditions="degraded", phrasings="varied"))
    img = scene()
    assert np.array_equal(live.camera({"scene": img})["scene"], img)  # before any episode: as rendered
    (ev,) = live.update(0.0)
    assert ev["event"] == "start" and ev["condition"] == "dark"
    assert ev["instruction"] == episode_instruction("push", seed, "varied") == live.current.instruction
    assert np.array_equal(live.camera({"scene": img})["scene"], apply("dark", img))
    assert live.current.result()["condition"] == "dark"
    with pytest.raises(ValueError, match="'hazy'"):
        LiveConfig(conditions="hazy")

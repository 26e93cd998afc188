"""Training augmentation over the camera conditions (edgefm_ros.training.augment) and its hook in the batcher."""
from __future__ import annotations

import numpy as np
import pytest

from edgefm_ros.training.augment import ConditionAugment, make_augment
from edgefm_ros.training.recipe import TrainConfig

RNG = np.random.default_rng()


def test_each_sample_gets_one_condition_on_every_camera():
    base = RNG.integers(40, 200, size=(1, 32, 32, 3), dtype=np.uint8)
    frames = {"a": np.repeat(base, 64, 0), "b": np.repeat(base, 64, 0)}  # both cameras see the same picture
    aug = ConditionAugment(int(RNG.integers(1 << 30)))
    out = aug(frames)
    assert out["a"].shape == frames["a"].shape and out["a"].dtype == np.uint8
    changed = [not np.array_equal(out["a"][i], base[0]) for i in range(64)]
    assert 10 < sum(changed) < 64  # a clean share and degraded samples
    # same condition on both cameras: deterministic kinds give the same frame; noise differs but by the
    # same amount
    for i in range(64):
        da = np.abs(out["a"][i].astype(int) - base[0]).mean()
        db = np.abs(out["b"][i].astype(int) - base[0]).mean()
        assert da == pytest.approx(db, rel=0.2, abs=0.5)
    assert np.array_equal(frames["a"][0], base[0])  # the dataset's frames are not modified


def test_seeded_and_named():
    frames = {"a": RNG.integers(0, 255, size=(8, 16, 16, 3), dtype=np.uint8)}
    one, two = ConditionAugment(3)(frames), ConditionAugment(3)(frames)
    assert all(np.array_equal(one[k], two[k]) for k in one)
    assert make_augment("none", 0) is None
    with pytest.raises(ValueError, match="'sepia'"):
        make_augment("sepia", 0)
    with pytest.raises(ValueError, match="'sepia'"):
        TrainConfig(augment="sepia")

"""Several datasets trained as one (edgefm_ros.datasets.merge, `edgefm-vla train --dataset A --dataset B`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth import make_demos, write_demos  # noqa: E402

from edgefm_ros.datasets.merge import merge_demos  # noqa: E402


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    rng = np.random.default_rng()
    a = write_demos(root / "a", make_demos(episodes=4, length=int(rng.integers(5, 9)), seed=int(rng.integers(1 << 20))),
                    failed=(1,))
    b_raw = make_demos(episodes=3, length=int(rng.integers(5, 9)), seed=int(rng.integers(1 << 20)))
    b_raw.tasks = ["press the button", "a wording only b has"]  # one text shared, one new: indices must move
    b = write_demos(root / "b", b_raw)
    return root, a, b


def test_merged_frames_episodes_and_texts_follow_each_part(two):
    _, a, b = two
    m = merge_demos([a, b], names=["a", "b"])
    na = len(a.state)
    assert len(m.state) == na + len(b.state)
    for c in a.images:
        assert np.array_equal(m.images[c][:na], a.images[c]) and np.array_equal(m.images[c][na:], b.images[c])
    assert np.array_equal(m.action[na:], b.action)
    # episodes renumbered after a's, contiguous, and each frame keeps its own text
    off = int(a.episode_index.max()) + 1
    assert np.array_equal(m.episode_index[na:], b.episode_index + off)
    assert len(np.unique(m.episode_index)) == len(np.unique(a.episode_index)) + len(np.unique(b.episode_index))
    texts = [m.tasks[i] for i in m.task_index]
    assert texts == [a.tasks[i] for i in a.task_index] + [b.tasks[i] for i in b.task_index]
    assert len(m.tasks) == len(set(a.tasks) | set(b.tasks))
    # per-episode columns move with their episodes: a's failed episode 1 is still the one failed
    assert [e for e, ok in m.episode_success.items() if not ok] == [1]
    assert m.episode_task[off] == b.episode_task[int(b.episode_index[0])]
    # statistics over all frames, not either part's
    both = np.concatenate([a.action, b.action])
    assert np.allclose(m.stats["action"]["mean"], both.mean(0), atol=1e-6)
    assert np.allclose(m.stats["action"]["std"], both.std(0), atol=1e-6)
    assert np.allclose(m.stats["observation.state"]["max"], np.concatenate([a.state, b.state]).max(0))
    assert merge_demos([a]) is a


def test_parts_that_differ_are_named(two):
    _, a, b = two
    small = make_demos(episodes=2, length=4, hw=(16, 16))
    with pytest.raises(ValueError, match=r"dataset small: camera 'scene' frames \(16, 16, 3\)"):
        merge_demos([a, small], names=["a", "small"])
    other = make_demos(episodes=2, length=4)
    other.images = {"scene": other.images["scene"]}
    with pytest.raises(ValueError, match=r"dataset other: cameras \['scene'\]"):
        merge_demos([a, other], names=["a", "other"])
    wide = make_demos(episodes=2, length=4)
    wide.action = np.pad(wide.action, ((0, 0), (0, 2)))
    with pytest.raises(ValueError, match="dataset wide: action has 6 dims, a's has 4"):
        merge_demos([a, wide], names=["a", "wide"])
    fast = make_demos(episodes=2, length=4)
    fast.fps = 30
    with pytest.raises(ValueError, match="dataset fast: fps 30"):
        merge_demos([a, fast], names=["a", "fast"])
    with pytest.raises(ValueError, match="no datasets"):
        merge_demos([])


def test_train_cli_takes_several_datasets(two, tmp_path):
    root, a, b = two
    out = tmp_path / "policy"
    r = subprocess.run([sys.executable, "-m", "edgefm_ros.tools.vla_cli", "train", "--dataset", str(root / "a"),
                        "--dataset", str(root / "b"), "--out", str(out), "--steps", "2", "--batch-size", "2",
                        "--log-every", "1", "--save-every", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ok_a = sum(a.episode_success.values())
    assert f"2 datasets as one: {len(np.unique(a.episode_index)) + len(np.unique(b.episode_index))} episodes" \
        in r.stdout
    meta = json.loads((out / "edgefm_train.json").read_text())
    assert meta["dataset"] == [str(root / "a"), str(root / "b")]
    assert meta["episodes"] == ok_a + len(np.unique(b.episode_index))  # a's failed episode left out
    r = subprocess.run([sys.executable, "-m", "edgefm_ros.tools.vla_cli", "train", "--dataset", str(root / "a"),
                        "--dataset", str(tmp_path / "nothing"), "--out", str(tmp_path / "p2"), "--steps", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "nothing" in r.stderr

"""Demonstration datasets in LeRobot's v3.0 layout (edgefm_ros.sim.dataset): what is written is read back
exactly, the stats are LeRobot's (population std, images per channel on [0, 1]), bad episodes are refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("cv2")

from edgefm_ros.sim.dataset import DatasetWriter, read_dataset  # noqa: E402


def episode(rng, t, hw=(16, 24)):
    frames = {c: rng.integers(0, 256, size=(t, *hw, 3), dtype=np.uint8) for c in ("scene", "wrist")}
    return frames, rng.normal(size=(t, 4)).astype(np.float32), rng.normal(size=(t, 4)).astype(np.float32)


def test_round_trip_and_stats(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "ds"
    eps = [episode(rng, 5), episode(rng, 3), episode(rng, 4)]
    texts = ["open the drawer", "press the button", "open the drawer"]
    with DatasetWriter(root, fps=20, image_hw=(16, 24)) as w:
        for i, ((f, s, a), text) in enumerate(zip(eps, texts)):
            w.add_episode(f, s, a, text, success=i != 1, task=f"t{i}", seed=100 + i)
    for p in ("meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet",
              "data/chunk-000/file-000.parquet"):
        assert (root / p).is_file(), p
    ds = read_dataset(root)
    assert len(ds) == 12 and ds.image_hw == (16, 24) and ds.fps == 20.0
    for cam in ("scene", "wrist"):
        np.testing.assert_array_equal(ds.images[cam], np.concatenate([e[0][cam] for e in eps]))
    np.testing.assert_array_equal(ds.state, np.concatenate([e[1] for e in eps]))
    np.testing.assert_array_equal(ds.action, np.concatenate([e[2] for e in eps]))
    np.testing.assert_array_equal(ds.episode_index, [0] * 5 + [1] * 3 + [2] * 4)
    np.testing.assert_array_equal(ds.frame_index, [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3])
    np.testing.assert_allclose(ds.timestamp[:5], np.arange(5) / 20.0, rtol=1e-6)
    assert ds.tasks == ["open the drawer", "press the button"]
    np.testing.assert_array_equal(ds.task_index, [0] * 5 + [1] * 3 + [0] * 4)
    assert ds.episode_success == {0: True, 1: False, 2: True}
    assert ds.episode_seed == {0: 100, 1: 101, 2: 102} and ds.episode_task[2] == "t2"
    act = ds.action.astype(np.float64)
    np.testing.assert_allclose(ds.stats["action"]["mean"], act.mean(0), rtol=1e-5)
    np.testing.assert_allclose(ds.stats["action"]["std"], act.std(0), rtol=1e-5)  # population std
    np.testing.assert_allclose(ds.stats["observation.state"]["min"], ds.state.min(0))
    np.testing.assert_allclose(ds.stats["observation.state"]["max"], ds.state.max(0))
    img = ds.images["scene"].reshape(-1, 3) / 255.0
    assert ds.stats["observation.images.scene"]["mean"].shape == (3, 1, 1)
    np.testing.assert_allclose(ds.stats["observation.images.scene"]["mean"].ravel(), img.mean(0), rtol=1e-5)
    np.testing.assert_allclose(ds.stats["observation.images.scene"]["std"].ravel(), img.std(0), rtol=1e-4)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 3 and info["total_frames"] == 12
    assert info["features"]["observation.images.wrist"]["shape"] == [16, 24, 3]
    assert info["features"]["action"]["names"] == ["ee_x", "ee_y", "ee_z", "gripper"]
    only_scene = read_dataset(root, cameras=["scene"])
    assert set(only_scene.images) == {"scene"}


def test_bad_episodes_and_reuse_are_refused(tmp_path):
    rng = np.random.default_rng(1)
    f, s, a = episode(rng, 4)
    w = DatasetWriter(tmp_path / "ds", fps=20, image_hw=(16, 24))
    with pytest.raises(ValueError, match="states"):
        w.add_episode(f, s[:, :3], a, "x", success=True)
    with pytest.raises(ValueError, match="wrist"):
        w.add_episode({"scene": f["scene"]}, s, a, "x", success=True)
    bad = s.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        w.add_episode(f, bad, a, "x", success=True)
    with pytest.raises(ValueError, match="no episodes"):
        w.close()
    w2 = DatasetWriter(tmp_path / "ds2", fps=20, image_hw=(16, 24))
    w2.add_episode(f, s, a, "x", success=True)
    w2.close()
    with pytest.raises(ValueError, match="already exists"):
        DatasetWriter(tmp_path / "ds2", fps=20, image_hw=(16, 24))
    with pytest.raises(FileNotFoundError):
        read_dataset(tmp_path / "nothing")

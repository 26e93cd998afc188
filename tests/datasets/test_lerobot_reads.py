"""LeRobot 0.4.4's own LeRobotDataset reads a converted dataset frame for frame: state, action (and the
action chunk its delta_timestamps query builds, with action_is_pad), indices, timestamps and task text
exactly; camera frames within a video codec's tolerance of ours (and the recorded frame's code exactly).

Opt-in (the harness is a 1.6 GB environment, ../shared/reference/README.md section 6):
- EDGEFM_LEROBOT_HARNESS: the harness folder (its .venv beside its scripts); reads an image dataset;
- EDGEFM_LEROBOT_VIDEO_HARNESS: a harness whose venv can decode video the way LeRobot 0.4.4 does there:
  torchvision 0.28 no longer has VideoReader (LeRobot's 'pyav' backend), so it needs torchcodec
  (`.venv/bin/pip install --no-deps torchcodec==0.13.0`, the release for torch 2.13, and FFmpeg's shared
  libraries: `apt-get install ffmpeg`); reads a video dataset.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bags import make_bag  # noqa: E402
from skips import require_material, require_opt_in  # noqa: E402

from edgefm_ros.datasets.convert import ConvertConfig, convert_bags  # noqa: E402
from edgefm_ros.datasets.mapping import DatasetMapping  # noqa: E402
from edgefm_ros.datasets.reader import read_lerobot_dataset  # noqa: E402
from edgefm_ros.datasets.synthbag import frame_code_of  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "lerobot_read.py"
CHUNK = 4
FPS = 20


def _harness_python(h: Path) -> Path:
    py = h / ".venv" / "bin" / "python"
    require_material(py.is_file(), f"no harness venv at {py} (run the harness's setup_venv.sh there)")
    return py


def _lerobot_read(h: Path, root: Path, out: Path, backend: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("_ROS_WHEELS_BOOTSTRAP_COMPLETE", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HOME=str(out.parent / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = [str(_harness_python(h)), str(SCRIPT), str(root), str(out), str(h), "--chunk", str(CHUNK)]
    if backend:
        cmd += ["--backend", backend]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return dict(np.load(out))


def _check(tmp_path: Path, h: Path, images: bool, backend: str | None) -> dict:
    bags = [make_bag(tmp_path, "a", storage="mcap", frame_code=True),
            make_bag(tmp_path, "b", storage="sqlite3", frame_code=True, episodes=(("drawer-open", 1.1),))]
    root = tmp_path / "ds"
    convert_bags(bags, root, DatasetMapping(), ConvertConfig(fps=FPS, images=images))
    ours = read_lerobot_dataset(root)
    lr = _lerobot_read(h, root, tmp_path / "lerobot.npz", backend)
    n = len(ours)
    assert int(lr["num_episodes"]) == 3 and len(lr["state"]) == n
    np.testing.assert_array_equal(lr["state"], ours.state)
    np.testing.assert_array_equal(lr["episode_index"], ours.episode_index)
    np.testing.assert_array_equal(lr["frame_index"], ours.frame_index)
    np.testing.assert_array_equal(lr["index"], np.arange(n))
    np.testing.assert_array_equal(lr["timestamp"], ours.timestamp)
    assert [str(t) for t in lr["tasks"]] == [ours.tasks[i] for i in ours.task_index]
    # the action chunk LeRobot's delta_timestamps query builds: the next CHUNK actions of the episode, the last
    # one repeated past its end and flagged
    for i in range(n):
        ends = np.flatnonzero(ours.episode_index == ours.episode_index[i])[-1]
        steps = np.arange(i, i + CHUNK)
        np.testing.assert_array_equal(lr["action_chunk"][i], ours.action[np.minimum(steps, ends)])
        np.testing.assert_array_equal(lr["action_is_pad"][i], steps > ends)
    for cam in ("scene", "wrist"):
        theirs = lr[f"cam:observation.images.{cam}"].transpose(0, 2, 3, 1)  # [N, H, W, 3]
        mine = ours.images[cam]
        assert theirs.shape == mine.shape
        diff = np.abs(theirs.astype(np.int16) - mine.astype(np.int16))
        if images:
            assert diff.max() == 0  # PNG: the same pixels
        else:  # two decoders' colour conversion of the same AV1 stream
            assert diff.mean() < 1.0 and diff.max() <= 4, (cam, diff.mean(), diff.max())
            print(f"{cam}: LeRobot's frames vs ours: mean |diff| {diff.mean():.3f}, max {diff.max()}")
        assert [frame_code_of(f) for f in theirs] == [frame_code_of(f) for f in mine]
    return lr


def test_lerobot_reads_an_image_dataset(tmp_path):
    h = require_opt_in("EDGEFM_LEROBOT_HARNESS", "LeRobot 0.4.4's harness, a 1.6 GB environment")
    _check(tmp_path, h, images=True, backend=None)


def test_lerobot_reads_a_video_dataset(tmp_path):
    h = require_opt_in("EDGEFM_LEROBOT_VIDEO_HARNESS", "LeRobot 0.4.4's harness with torchcodec and FFmpeg")
    lr = _check(tmp_path, h, images=False, backend="torchcodec")
    assert str(lr["video_backend"]) == "torchcodec"


"""From a teaching session to a deployable checkpoint, the walkthrough of docs/recordings.md in small:
two episodes taught through real ROS nodes (sim_node, the teleoperation device, ``edgefm-bag record``, over
DDS) -> ``edgefm-bag to-dataset`` (LeRobot v3.0, MP4 cameras) -> training's loader (and LeRobot 0.4.4's own
LeRobotDataset, opt-in) -> a few fine-tuning steps from the committed checkpoint (``edgefm-vla train --init``)
-> the runtime Engine loads the result and predicts a finite chunk."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from skips import require_material, require_module, require_opt_in  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "checkpoints" / "smolvla-metaworld"
TASK = "drawer-close"  # not in the committed checkpoint's training set
LEROBOT_READ = Path(__file__).resolve().parent / "lerobot_read.py"


def _teach_and_convert(tmp_path: Path, domain: int, seeds=(0, 1)) -> tuple[Path, dict]:
    """Teach TASK on ``seeds`` through the graph into an MCAP bag, convert it with the CLI; (dataset, summary)."""
    require_module("rclpy", "rclpy (ROS 2 Jazzy wheels) is not installed")
    require_module("metaworld", "the simulator (metaworld, mujoco) is not installed")
    from edgefm_ros.tools.bag_cli import main as bag_main
    from edgefm_ros.tools.teach import TeachConfig, run_teach

    bag, ds = tmp_path / "taught", tmp_path / "ds"
    summary = run_teach(TeachConfig(tasks=(TASK,), seeds=tuple(seeds), bag=str(bag), domain_id=domain),
                        workdir=tmp_path / "logs", progress=None)
    assert [(e["task"], e["seed"], e["outcome"]) for e in summary["episodes"]] == \
        [(TASK, s, "success") for s in seeds]
    assert bag_main(["to-dataset", str(bag), "--out", str(ds)]) == 0
    return ds, summary


def test_taught_episodes_train_a_checkpoint_the_engine_runs(tmp_path, ros_domain_id):
    from edgefm_ros.runtime.engine import Engine
    from edgefm_ros.training.data import read_demos
    from edgefm_ros.types import Observation

    ds, summary = _teach_and_convert(tmp_path, ros_domain_id)
    info = json.loads((ds / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 2 and info["fps"] == 20
    assert info["features"]["observation.images.scene"]["dtype"] == "video"
    demos = read_demos(ds)
    # one dataset episode per taught episode, each as long as the episode at 20 fps (less the ticks before the
    # first command and the last ones), in the order taught, with the instruction sim_node published
    assert demos.episode_task == {0: TASK, 1: TASK} and demos.episode_success == {0: True, 1: True}
    for i, e in enumerate(summary["episodes"]):
        n = int((demos.episode_index == i).sum())
        assert 0.75 * 20 * (e["end"] - e["start"]) <= n <= 20 * (e["end"] - e["start"]) + 1, (i, n)
    assert demos.tasks == ["push the drawer closed"]
    assert demos.images["scene"].shape[1:] == (64, 64, 3) and np.isfinite(demos.state).all()
    # the commands recorded are the device's: the arm's target moves toward the drawer (+y) in every episode
    for i in range(2):
        a = demos.action[demos.episode_index == i]
        assert a[-1, 1] - a[0, 1] > 0.05, a[:, 1]

    # the training CLI in a process of its own, as a user runs it (and away from this process's EGL/Mesa
    # libraries: torch's optimizer imports triton, whose LLVM crashes once Mesa's is loaded)
    out = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "edgefm_ros.tools.vla_cli", "train", "--dataset", str(ds), "--out",
                        str(out), "--init", str(COMMITTED), "--steps", "4", "--batch-size", "4", "--threads", "1",
                        "--log-every", "2", "--save-every", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "step 4/4" in r.stdout
    record = json.loads((out / "edgefm_train.json").read_text())
    assert record["step"] == 4 and record["tasks"] == [TASK] and record["init"] == str(COMMITTED)
    engine = Engine.from_checkpoint(out)
    i = len(demos.state) // 2
    obs = Observation({f"observation.images.{c}": demos.images[c][i] for c in ("scene", "wrist")},
                      demos.state[i], demos.tasks[int(demos.task_index[i])])
    chunk = engine.predict(obs, noise=np.random.default_rng(0).standard_normal(
        (engine.spec.chunk_size, engine.spec.max_action_dim)).astype(np.float32))
    assert chunk.actions.shape[0] == 16 and chunk.actions.shape[1] >= 4
    assert np.isfinite(chunk.actions).all()


def test_lerobot_reads_the_taught_dataset(tmp_path, ros_domain_id):
    """LeRobot 0.4.4's LeRobotDataset (the harness venv, with torchcodec for video) reads the converted teaching
    session: the same frames, states, actions and task text as training's loader."""
    h = require_opt_in("EDGEFM_LEROBOT_VIDEO_HARNESS", "LeRobot 0.4.4's harness with torchcodec and FFmpeg")
    py = h / ".venv" / "bin" / "python"
    require_material(py.is_file(), f"no harness venv at {py} (run the harness's setup_venv.sh there)")
    from edgefm_ros.datasets.reader import read_lerobot_dataset

    ds, _ = _teach_and_convert(tmp_path, ros_domain_id)
    env = {k: v for k, v in os.environ.items()
           if k not in ("_ROS_WHEELS_BOOTSTRAP_COMPLETE", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = tmp_path / "lerobot.npz"
    r = subprocess.run([str(py), str(LEROBOT_READ), str(ds), str(out), str(h), "--backend", "torchcodec"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lr, ours = dict(np.load(out)), read_lerobot_dataset(ds)
    assert int(lr["num_episodes"]) == 2
    np.testing.assert_array_equal(lr["state"], ours.state)
    np.testing.assert_array_equal(lr["action_chunk"][:, 0], ours.action)
    assert [str(t) for t in lr["tasks"]] == [ours.tasks[i] for i in ours.task_index]
    for cam in ("scene", "wrist"):
        diff = np.abs(lr[f"cam:observation.images.{cam}"].transpose(0, 2, 3, 1).astype(np.int16)
                      - ours.images[cam].astype(np.int16))
        assert diff.mean() < 1.0 and diff.max() <= 4, (cam, diff.mean(), diff.max())

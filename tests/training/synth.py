"""A small synthetic demonstration set with the shape of edgefm_ros.sim's datasets (two cameras,
state/action [4], several tasks): the target is a bright square in the scene image and the expert
moves the state towards it, so the actions depend on the images, the task and the state."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TASKS = ("reach the red square", "press the button")


@dataclass
class SynthDemos:
    images: dict
    state: np.ndarray
    action: np.ndarray
    episode_index: np.ndarray
    frame_index: np.ndarray
    task_index: np.ndarray
    tasks: list
    fps: int = 10
    stats: dict = field(default_factory=dict)


def make_demos(episodes: int = 6, length: int = 12, hw: tuple[int, int] = (32, 32), seed: int = 0) -> SynthDemos:
    rng = np.random.default_rng(seed)
    h, w = hw
    scene, wrist, state, action, ep, fi, ti = [], [], [], [], [], [], []
    for e in range(episodes):
        task = e % len(TASKS)
        target = rng.uniform(-1, 1, size=2).astype(np.float32)
        pos = rng.uniform(-1, 1, size=4).astype(np.float32)
        r, c = int((target[0] + 1) / 2 * (h - 6)), int((target[1] + 1) / 2 * (w - 6))
        for f in range(length):
            img = np.full((h, w, 3), 40, np.uint8)
            img[r:r + 6, c:c + 6] = (230, 40, 40) if task == 0 else (40, 40, 230)
            scene.append(img)
            wrist.append(np.roll(img, f, axis=1))
            goal = np.concatenate([target, [0.5 if task == 0 else -0.5, 1.0]]).astype(np.float32)
            cmd = pos + 0.3 * (goal - pos)
            state.append(pos.copy())
            action.append(cmd)
            pos = cmd
            ep.append(e)
            fi.append(f)
            ti.append(task)
    state, action = np.stack(state), np.stack(action)
    stats = {k: {"mean": v.mean(0), "std": v.std(0), "min": v.min(0), "max": v.max(0)}
             for k, v in (("observation.state", state), ("action", action))}
    return SynthDemos({"scene": np.stack(scene), "wrist": np.stack(wrist)}, state, action, np.array(ep),
                      np.array(fi), np.array(ti), list(TASKS), stats=stats)


def write_demos(root, demos: SynthDemos, failed: tuple[int, ...] = ()):
    """The demos through edgefm_ros.sim's dataset writer (LeRobot v3.0 layout), read back with its reader.
    Episodes in ``failed`` are written with success=False."""
    from edgefm_ros.sim.dataset import DatasetWriter, read_dataset

    with DatasetWriter(root, fps=demos.fps, image_hw=demos.images["scene"].shape[1:3]) as w:
        for e in np.unique(demos.episode_index):
            rows = demos.episode_index == e
            task = int(demos.task_index[rows][0])
            w.add_episode({k: v[rows] for k, v in demos.images.items()}, demos.state[rows], demos.action[rows],
                          demos.tasks[task], success=int(e) not in failed, task=f"task{task}", seed=int(e))
    return read_dataset(root)

"""Open loop on demonstration frames: how far a checkpoint's chunk lies from the demonstration's, at each
episode's first frame (the hand at its reset position: only the images tell where to go) and a third of the
way in (the hand already on its way). Per task, on the first N episodes of a dataset, with the same noise per
episode for every checkpoint.

    python docs/data/routing/cloud_experiments/first_chunk_fit.py --dataset data/metaworld6-128 \
        --checkpoints checkpoints/smolvla-cloud --tasks push,reach,drawer-open
"""
import argparse

import numpy as np

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.training.data import read_demos
from edgefm_ros.types import Observation

ap = argparse.ArgumentParser()
ap.add_argument("--dataset", required=True)
ap.add_argument("--checkpoints", required=True, help="comma-separated")
ap.add_argument("--tasks", default="push,reach,drawer-open")
ap.add_argument("--episodes", type=int, default=15)
a = ap.parse_args()
d = read_demos(a.dataset)
print(f"{'checkpoint':<28} {'task':<12} {'chunk err, first frame':>23} {'a third in':>11} "
      f"{'chunk end, first frame':>23}")
for path in a.checkpoints.split(","):
    eng = Engine.from_checkpoint(path, mode="exact")
    spec = eng.spec
    for task in a.tasks.split(","):
        eps = [e for e, t in sorted(d.episode_task.items()) if t == task][:a.episodes]
        first, third, end = [], [], []
        for e in eps:
            idx = np.flatnonzero(d.episode_index == e)
            noise = np.random.default_rng(e).standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
            for which, f in ((first, idx[0]), (third, idx[len(idx) // 3])):
                images = {k: d.images[k if k in d.images else k.split(".")[-1]][f] for k in spec.camera_keys}
                act = eng.predict(Observation(images, d.state[f], d.tasks[d.task_index[f]]), noise=noise).actions[:, :3]
                n = min(spec.chunk_size, idx[-1] - f + 1)
                ref = d.action[f:f + n, :3]
                which.append(np.linalg.norm(act[:n] - ref, axis=1).mean())
                if which is first:
                    end.append(np.linalg.norm(act[n - 1] - ref[-1]))
        print(f"{path.rstrip('/').split('/')[-1]:<28} {task:<12} {np.mean(first) * 100:>20.1f} cm "
              f"{np.mean(third) * 100:>8.1f} cm {np.median(end) * 100:>20.1f} cm")

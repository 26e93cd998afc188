"""Run with LeRobot 0.4.4's harness python (tests/datasets/test_lerobot_reads.py does): load a dataset with
LeRobot's own LeRobotDataset and save every item's tensors to an .npz for the test to compare.

    python lerobot_read.py DATASET_DIR OUT.npz HARNESS_DIR [--chunk N] [--backend torchcodec|pyav]
"""
import argparse
import sys

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("out")
p.add_argument("harness")
p.add_argument("--chunk", type=int, default=4)
p.add_argument("--backend", default=None)
a = p.parse_args()
sys.path.insert(0, a.harness)
import tv_compat  # noqa: E402,F401  (torchvision next to the CPU-only torch)
from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata  # noqa: E402

meta = LeRobotDatasetMetadata("local/converted", root=a.root)
delta = {"action": [k / meta.fps for k in range(a.chunk)]}
ds = LeRobotDataset("local/converted", root=a.root, delta_timestamps=delta, video_backend=a.backend)
out = {k: [] for k in ("state", "action_chunk", "action_is_pad", "episode_index", "frame_index", "index",
                       "timestamp", "task_index")}
cams = {k: [] for k in meta.camera_keys}
tasks = []
for i in range(len(ds)):
    item = ds[i]
    out["state"].append(item["observation.state"].numpy())
    out["action_chunk"].append(item["action"].numpy())
    out["action_is_pad"].append(item["action_is_pad"].numpy())
    for k in ("episode_index", "frame_index", "index", "timestamp", "task_index"):
        out[k].append(item[k].numpy())
    for k in cams:
        cams[k].append(np.round(item[k].numpy() * 255.0).astype(np.uint8))  # [3, H, W] float in [0, 1]
    tasks.append(item["task"])
arrays = {k: np.stack(v) for k, v in out.items()}
arrays.update({f"cam:{k}": np.stack(v) for k, v in cams.items()})
arrays["tasks"] = np.array(tasks)
arrays["num_episodes"] = np.array(ds.num_episodes)
arrays["video_backend"] = np.array(str(ds.video_backend))
np.savez(a.out, **arrays)
print(f"read {len(ds)} frames, {ds.num_episodes} episodes, cameras {list(cams)}, backend {ds.video_backend}")

"""Demonstrations -> training batches, through the runtime's own preprocessing.

Each sample is one frame: its camera images (uint8 -> [0, 1] -> resize_with_pad -> [-1, 1], as the
Engine does), its task text (tokenized like the Engine), its state (MEAN_STD with the dataset's stats,
zero-padded to max_state_dim) and the chunk of ``chunk_size`` actions starting at that frame. Past the
episode's last frame the chunk repeats that frame's action and ``is_pad`` marks those steps, as
LeRobot's ``delta_timestamps`` query does (clamped index, ``action_is_pad``).
"""
from __future__ import annotations

import math

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from edgefm_ros.runtime.preprocess import ModelInputs, Preprocessor


class Demos(Protocol):
    """What training reads of a dataset (edgefm_ros.sim.dataset.DemoDataset has these)."""

    images: Mapping[str, np.ndarray]  # key -> uint8 [N, H, W, 3]
    state: np.ndarray  # [N, S] f32
    action: np.ndarray  # [N, A] f32
    episode_index: np.ndarray  # [N] i64, frames of an episode contiguous and in order
    task_index: np.ndarray  # [N] i64
    tasks: Sequence[str]  # task_index -> instruction
    stats: Mapping[str, Mapping[str, np.ndarray]]  # feature -> {"mean", "std", ...}


@dataclass(frozen=True)
class Batch:
    inputs: ModelInputs
    actions: torch.Tensor  # [B, C, max_action_dim] f32, normalised, zero-padded dims
    is_pad: torch.Tensor  # [B, C] bool, chunk steps past the episode's end


def episode_ends(episode_index: np.ndarray) -> np.ndarray:
    """[N] index of the last frame of each frame's episode; raises if an episode is not contiguous."""
    ep = np.asarray(episode_index)
    if ep.ndim != 1 or len(ep) == 0:
        raise ValueError(f"episode_index must be a non-empty 1-D array, got shape {ep.shape}")
    change = np.flatnonzero(ep[1:] != ep[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(ep)]]) - 1
    if len(np.unique(ep[starts])) != len(starts):
        raise ValueError("episode_index: an episode's frames are not contiguous")
    return np.repeat(ends, ends - starts + 1)


class ChunkBatcher:
    def __init__(self, demos: Demos, camera_keys: Sequence[str], chunk_size: int, max_action_dim: int,
                 preprocess: Preprocessor, episodes: Sequence[int] | None = None,
                 augment: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]] | None = None,
                 episode_weights: Mapping[int, float] | None = None, start_weight: tuple[int, float] = (0, 1.0)):
        """``episodes``: the episodes to sample frames from (default: all). ``augment``: applied to each
        batch's uint8 frames {key: [B, H, W, 3]} before preprocessing (training/augment.py).
        ``episode_weights``: episode -> relative sampling weight of its frames (default 1 each).
        ``start_weight`` (K, W): each episode's first K frames are drawn W times as often (times the
        episode's weight): the frames where only the images tell where to go."""
        n = len(demos.state)
        self.keys = {}
        for k in camera_keys:  # a checkpoint names cameras "observation.images.<name>"; datasets may use either
            short = k.split(".")[-1]
            src = k if k in demos.images else short
            if src not in demos.images:
                raise ValueError(f"dataset has no camera {k!r} (cameras: {sorted(demos.images)})")
            if demos.images[src].shape[0] != n or demos.images[src].dtype != np.uint8:
                raise ValueError(f"camera {src!r}: expected uint8 [{n}, H, W, 3], got "
                                 f"{demos.images[src].dtype} {demos.images[src].shape}")
            self.keys[k] = src
        for name in ("action", "episode_index", "task_index"):
            if len(getattr(demos, name)) != n:
                raise ValueError(f"dataset {name} has {len(getattr(demos, name))} rows, state has {n}")
        bad_tasks = sorted(set(np.unique(demos.task_index).tolist()) - set(range(len(demos.tasks))))
        if bad_tasks:
            raise ValueError(f"task_index value(s) {bad_tasks} have no task text ({len(demos.tasks)} tasks)")
        if not np.isfinite(demos.action).all() or not np.isfinite(demos.state).all():
            raise ValueError("dataset state/action holds non-finite values")
        self.demos, self.chunk, self.max_action_dim, self.pre = demos, chunk_size, max_action_dim, preprocess
        self.augment = augment
        self.ends = episode_ends(demos.episode_index)
        keep = np.ones(n, bool) if episodes is None else np.isin(demos.episode_index, np.asarray(list(episodes)))
        self.frames = np.flatnonzero(keep)  # [M] i64 sampled frame indices
        if len(self.frames) == 0:
            raise ValueError(f"no frames to train on (episodes {list(episodes or [])[:10]})")
        self.size = len(self.frames)
        self.probs = None
        k, ws = start_weight
        if not (isinstance(k, int) and k >= 0 and math.isfinite(ws) and ws > 0):
            raise ValueError(f"start_weight must be (frames >= 0, weight > 0), got {start_weight!r}")
        if episode_weights or (k > 0 and ws != 1.0):
            w = np.ones(len(self.frames))
            if episode_weights:
                w = np.array([float(episode_weights.get(int(e), 1.0)) for e in demos.episode_index[self.frames]])
            if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
                raise ValueError(f"episode_weights must be finite, >= 0 and not all 0, got values {sorted(set(w))[:5]}")
            if k > 0:
                first = np.r_[0, np.flatnonzero(np.diff(demos.episode_index)) + 1]  # each episode's first frame
                start = first[np.searchsorted(first, self.frames, side="right") - 1]
                w = np.where(self.frames - start < k, w * ws, w)
            self.probs = torch.from_numpy(w / w.sum())
        s = preprocess.stats
        self.action_mean, self.action_std, self.eps = s.action_mean.numpy(), s.action_std.numpy(), s.eps

    def batch(self, idx: np.ndarray) -> Batch:
        d = self.demos
        idx = np.asarray(idx, dtype=np.int64)
        raw = {k: d.images[src][idx] for k, src in self.keys.items()}
        if self.augment is not None:
            raw = self.augment(raw)
        frames = {k: torch.from_numpy(np.ascontiguousarray(v)).permute(0, 3, 1, 2).float().div_(255.0)
                  for k, v in raw.items()}
        tasks = [d.tasks[int(i)] for i in d.task_index[idx]]
        inputs = self.pre(frames, torch.from_numpy(np.asarray(d.state[idx], dtype=np.float32)), tasks)
        steps = idx[:, None] + np.arange(self.chunk)[None, :]  # [B, C]
        is_pad = steps > self.ends[idx][:, None]
        steps = np.minimum(steps, self.ends[idx][:, None])
        act = (np.asarray(d.action, dtype=np.float32)[steps] - self.action_mean) / (self.action_std + self.eps)
        act = torch.from_numpy(act.astype(np.float32))
        act = F.pad(act, (0, self.max_action_dim - act.shape[-1]))
        return Batch(inputs, act, torch.from_numpy(is_pad))

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        if self.probs is None:
            pick = torch.randint(0, self.size, (batch_size,), generator=generator).numpy()
        else:
            pick = torch.multinomial(self.probs, batch_size, replacement=True, generator=generator).numpy()
        return self.batch(self.frames[pick])


def read_demos(root) -> Demos:
    """A LeRobot v3.0 dataset for training: one with MP4 video cameras, or without this package's per-episode
    columns (success, task_name, seed), through edgefm_ros.datasets.reader (PyAV); the simulator's own image
    datasets through edgefm_ros.sim.dataset.read_dataset, as before."""
    # the dataset readers need PyAV, OpenCV, pandas and pyarrow (pinned in requirements.txt): imported only
    # when a dataset is read, so that the batcher and the trainer import without them
    import pyarrow.parquet as pq

    from edgefm_ros.datasets.reader import camera_features, read_lerobot_dataset
    from edgefm_ros.sim.dataset import EPISODES_PATH, read_dataset

    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise FileNotFoundError(f"{root} is not a dataset: {info_path} is missing")
    info = json.loads(info_path.read_text())
    episodes = root / EPISODES_PATH
    sim_columns = episodes.is_file() and {"success", "task_name", "seed"} <= set(pq.read_schema(episodes).names)
    if "video" in camera_features(info).values() or not sim_columns:
        return read_lerobot_dataset(root)
    return read_dataset(root)

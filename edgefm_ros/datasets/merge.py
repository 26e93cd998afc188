"""Several datasets read as one for training: the same cameras, frame shapes, state and action dims and fps;
episodes renumbered after each other, task texts pooled, state and action statistics over all frames.

    demos = merge_demos([read_demos(a), read_demos(b)])

Camera statistics are kept only where every part has them, pooled by their frame counts (training reads the
state and action statistics; LeRobot's SmolVLA leaves camera frames unnormalised).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .reader import LeRobotDemos
from .stats import vector_stats


def _pool_image_stats(parts: Sequence[dict], key: str) -> dict[str, np.ndarray] | None:
    found = [p.get(key) for p in parts]
    if any(s is None or not {"mean", "std", "count"} <= set(s) for s in found):
        return None
    n = np.array([float(np.asarray(s["count"]).reshape(-1)[0]) for s in found])
    mean = [np.asarray(s["mean"], np.float64) for s in found]
    var = [np.asarray(s["std"], np.float64) ** 2 for s in found]
    m = sum(w * x for w, x in zip(n, mean)) / n.sum()
    v = sum(w * (x + (mu - m) ** 2) for w, x, mu in zip(n, var, mean)) / n.sum()
    out = {"mean": m.astype(np.float32), "std": np.sqrt(v).astype(np.float32),
           "count": np.array([int(n.sum())])}
    if all("min" in s and "max" in s for s in found):
        out["min"] = np.min([np.asarray(s["min"]) for s in found], axis=0).astype(np.float32)
        out["max"] = np.max([np.asarray(s["max"]) for s in found], axis=0).astype(np.float32)
    return out


def merge_demos(parts: Sequence, names: Sequence[str] | None = None) -> LeRobotDemos:
    """One dataset of ``parts`` (DemoDataset or LeRobotDemos), in order. ``names`` label the parts in errors
    (default part 0, 1, ...). Raises ValueError naming the part and the value that differs."""
    parts = list(parts)
    if not parts:
        raise ValueError("merge_demos: no datasets given")
    names = list(names) if names is not None else [f"part {i}" for i in range(len(parts))]
    if len(names) != len(parts):
        raise ValueError(f"merge_demos: {len(names)} names for {len(parts)} datasets")
    if len(parts) == 1:
        return parts[0]
    first, name0 = parts[0], names[0]
    cams = sorted(first.images)
    for p, name in zip(parts[1:], names[1:]):
        if sorted(p.images) != cams:
            raise ValueError(f"dataset {name}: cameras {sorted(p.images)} differ from {name0}'s {cams}")
        for c in cams:
            if p.images[c].shape[1:] != first.images[c].shape[1:]:
                raise ValueError(f"dataset {name}: camera {c!r} frames {p.images[c].shape[1:]} differ from "
                                 f"{name0}'s {first.images[c].shape[1:]}")
        for field in ("state", "action"):
            a, b = getattr(p, field).shape[1], getattr(first, field).shape[1]
            if a != b:
                raise ValueError(f"dataset {name}: {field} has {a} dims, {name0}'s has {b}")
        if float(p.fps) != float(first.fps):
            raise ValueError(f"dataset {name}: fps {p.fps} differs from {name0}'s {first.fps}")

    tasks: list[str] = []
    index_of: dict[str, int] = {}
    episode_index, task_index = [], []
    success, task_name, seed = {}, {}, {}
    offset = 0
    for p in parts:
        remap = np.empty(len(p.tasks), dtype=np.int64)
        for i, text in enumerate(p.tasks):
            if text not in index_of:
                index_of[text] = len(tasks)
                tasks.append(text)
            remap[i] = index_of[text]
        ep = np.asarray(p.episode_index, dtype=np.int64)
        episode_index.append(ep + offset)
        task_index.append(remap[np.asarray(p.task_index, dtype=np.int64)])
        for src, dst in ((getattr(p, "episode_success", {}), success), (getattr(p, "episode_task", {}), task_name),
                         (getattr(p, "episode_seed", {}), seed)):
            dst.update({int(e) + offset: v for e, v in (src or {}).items()})
        offset += int(ep.max()) + 1 if len(ep) else 0

    state = np.concatenate([np.asarray(p.state, np.float32) for p in parts])
    action = np.concatenate([np.asarray(p.action, np.float32) for p in parts])
    stats: dict[str, dict[str, np.ndarray]] = {
        "observation.state": {k: np.asarray(v, np.float32) for k, v in vector_stats(state).items()},
        "action": {k: np.asarray(v, np.float32) for k, v in vector_stats(action).items()}}
    for key in first.stats:
        if key.startswith("observation.images."):
            pooled = _pool_image_stats([p.stats for p in parts], key)
            if pooled is not None:
                stats[key] = pooled
    return LeRobotDemos(
        images={c: np.concatenate([p.images[c] for p in parts]) for c in cams},
        state=state, action=action,
        episode_index=np.concatenate(episode_index), task_index=np.concatenate(task_index),
        frame_index=np.concatenate([np.asarray(p.frame_index, np.int64) for p in parts]),
        timestamp=np.concatenate([np.asarray(p.timestamp, np.float32) for p in parts]),
        tasks=tasks, fps=float(first.fps), episode_success=success, episode_task=task_name, episode_seed=seed,
        stats=stats, info={**first.info, "merged_from": list(names), "total_episodes": offset,
                           "total_frames": int(len(state)), "total_tasks": len(tasks)})

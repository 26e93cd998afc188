"""A LeRobot v3.0 dataset read whole into numpy arrays, cameras stored as MP4 video (decoded with PyAV) or as
images in the parquet (PNG/JPEG bytes): what training reads (edgefm_ros.training.data.Demos).

A video frame is found the way LeRobot finds it: the episode's ``videos/<key>/from_timestamp`` plus the
row's ``timestamp``, matched to a decoded frame's presentation time within ``tolerance_s`` (LeRobot's
default 1e-4 s). Each video file is decoded once, in order, straight into the output array.

    ds = read_lerobot_dataset("datasets/rec")       # LeRobotDemos: images {name: uint8 [N, H, W, 3]}, ...
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import av
import cv2
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .mapping import CAMERA_PREFIX

TOLERANCE_S = 1e-4


@dataclass
class LeRobotDemos:
    """The fields of edgefm_ros.sim.dataset.DemoDataset (training reads either)."""

    images: dict[str, np.ndarray]  # camera name (key without observation.images.) -> uint8 [N, H, W, 3]
    state: np.ndarray  # float32 [N, S]
    action: np.ndarray  # float32 [N, A]
    episode_index: np.ndarray  # int64 [N]
    frame_index: np.ndarray  # int64 [N]
    task_index: np.ndarray  # int64 [N]
    timestamp: np.ndarray  # float32 [N]
    tasks: list[str]  # task_index -> text
    fps: float
    episode_success: dict[int, bool]
    episode_task: dict[int, str]  # episode -> task name ("" where the dataset has none)
    episode_seed: dict[int, int]
    stats: dict[str, dict[str, np.ndarray]]
    info: dict

    def __len__(self) -> int:
        return len(self.state)

    @property
    def image_hw(self) -> tuple[int, int]:
        return tuple(next(iter(self.images.values())).shape[1:3])


def camera_features(info: dict) -> dict[str, str]:
    """camera key -> 'video' | 'image'."""
    return {k: f["dtype"] for k, f in info["features"].items() if f.get("dtype") in ("video", "image")}


def _decode_image(data: bytes, where: str) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR) if data else None
    if img is None:
        raise ValueError(f"{where}: image bytes are not a decodable image")
    return img[:, :, ::-1]


def _fill_from_video(path: Path, out: np.ndarray, rows: np.ndarray, times: np.ndarray, tol: float) -> None:
    """Decode ``path`` once and copy the frame at each ``times[i]`` (s) into ``out[rows[i]]``."""
    if not path.is_file():
        raise FileNotFoundError(f"video file {path} is missing")
    order = np.argsort(times, kind="stable")
    rows, times = rows[order], times[order]
    j, n = 0, len(times)
    last_t = None
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "AUTO"
        for f in c.decode(stream):
            if j >= n:
                break
            t = float(f.pts * f.time_base)
            if last_t is not None and t <= last_t:
                raise ValueError(f"{path}: frame times not increasing ({t} after {last_t})")
            last_t = t
            if times[j] < t - tol:  # a wanted time between frames or before the first: no frame matches it
                raise ValueError(f"{path}: no frame within {tol} s of t={times[j]:.6f} (next frame at {t:.6f})")
            if abs(times[j] - t) <= tol:
                img = f.to_ndarray(format="rgb24")
                if img.shape != out.shape[1:]:
                    raise ValueError(f"{path}: frame {img.shape} differs from the feature's {out.shape[1:]}")
                while j < n and abs(times[j] - t) <= tol:
                    out[rows[j]] = img
                    j += 1
    if j < n:
        raise ValueError(f"{path}: no frame within {tol} s of t={times[j]:.6f} (the video ends at {last_t})")


def read_lerobot_dataset(root: str | Path, cameras: Sequence[str] | None = None,
                         tolerance_s: float = TOLERANCE_S) -> LeRobotDemos:
    """The whole dataset as arrays; ``cameras``: names or keys to decode (default all)."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise FileNotFoundError(f"{root} is not a LeRobot dataset: {info_path} is missing")
    info = json.loads(info_path.read_text())
    if info.get("codebase_version") != "v3.0":
        raise ValueError(f"{root}: codebase_version {info.get('codebase_version')!r}; this reader reads v3.0")
    cams = camera_features(info)
    names = {k.removeprefix(CAMERA_PREFIX): k for k in cams}
    want = list(names) if cameras is None else [c.removeprefix(CAMERA_PREFIX) for c in cameras]
    bad = [c for c in want if c not in names]
    if bad:
        raise ValueError(f"cameras {bad} not in dataset {root} (has {sorted(names)})")
    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{root}/data holds no parquet files")
    img_cols = [names[c] for c in want if cams[names[c]] == "image"]
    cols = img_cols + ["observation.state", "action", "episode_index", "frame_index", "task_index", "timestamp",
                       "index"]
    table = pa.concat_tables([pq.read_table(f, columns=cols) for f in files])
    table = table.take(pc.sort_indices(table, [("index", "ascending")]))
    n = table.num_rows

    def vec(name: str) -> np.ndarray:
        col = table.column(name).combine_chunks()
        return np.asarray(col.flatten(), dtype=np.float32).reshape(n, -1)

    ep_index = np.asarray(table.column("episode_index"), dtype=np.int64)
    timestamp = np.asarray(table.column("timestamp"), dtype=np.float32)
    eps = pd.concat([pd.read_parquet(f) for f in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))],
                    ignore_index=True)
    images: dict[str, np.ndarray] = {}
    for c in want:
        key = names[c]
        h, w = info["features"][key]["shape"][:2]
        arr = np.empty((n, h, w, 3), dtype=np.uint8)
        if cams[key] == "image":
            for i, b in enumerate(table.column(key).combine_chunks().field("bytes").to_pylist()):
                arr[i] = _decode_image(b, f"{root}: {key} row {i}")
        else:
            _read_video_feature(root, info, eps, key, ep_index, timestamp, arr, tolerance_s)
        images[c] = arr
    tasks_df = pd.read_parquet(root / "meta" / "tasks.parquet")
    tasks = [""] * len(tasks_df)
    for text, idx in zip(tasks_df.index, tasks_df["task_index"]):
        tasks[int(idx)] = str(text)
    stats_path = root / "meta" / "stats.json"
    stats_raw = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    stats = {k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in stats_raw.items()}
    col = lambda name, default: (eps[name].tolist() if name in eps else [default] * len(eps))  # noqa: E731
    e_idx = [int(e) for e in eps["episode_index"]]
    return LeRobotDemos(
        images=images, state=vec("observation.state"), action=vec("action"), episode_index=ep_index,
        frame_index=np.asarray(table.column("frame_index"), dtype=np.int64),
        task_index=np.asarray(table.column("task_index"), dtype=np.int64), timestamp=timestamp, tasks=tasks,
        fps=float(info["fps"]),
        episode_success={e: bool(s) for e, s in zip(e_idx, col("success", True))},
        episode_task={e: str(t or "") for e, t in zip(e_idx, col("task_name", ""))},
        episode_seed={e: int(s) for e, s in zip(e_idx, col("seed", -1))},
        stats=stats, info=info)


def _read_video_feature(root: Path, info: dict, eps: pd.DataFrame, key: str, ep_index: np.ndarray,
                        timestamp: np.ndarray, out: np.ndarray, tol: float) -> None:
    template = info.get("video_path")
    if not template:
        raise ValueError(f"{root}: {key} is a video feature but info.json has no video_path")
    per_file: dict[Path, tuple[list, list]] = {}
    rows_of = {int(e): np.flatnonzero(ep_index == e) for e in np.unique(ep_index)}
    for _, ep in eps.iterrows():
        e = int(ep["episode_index"])
        if e not in rows_of:
            continue
        path = root / template.format(video_key=key, chunk_index=int(ep[f"videos/{key}/chunk_index"]),
                                      file_index=int(ep[f"videos/{key}/file_index"]))
        rows = rows_of[e]
        r, t = per_file.setdefault(path, ([], []))
        r.append(rows)
        t.append(float(ep[f"videos/{key}/from_timestamp"]) + timestamp[rows].astype(np.float64))
    covered = sum(len(x) for r, _ in per_file.values() for x in r)
    if covered != len(ep_index):
        raise ValueError(f"{root}: {len(ep_index) - covered} rows belong to episodes missing from meta/episodes")
    for path, (r, t) in sorted(per_file.items()):
        _fill_from_video(path, out, np.concatenate(r), np.concatenate(t), tol)

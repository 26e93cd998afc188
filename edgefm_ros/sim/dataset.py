"""Demonstrations in LeRobot's v3.0 dataset layout, images stored in the parquet as PNG bytes.

    root/meta/info.json                               codebase_version v3.0, fps, features, totals
    root/meta/stats.json                              per feature: mean, std, min, max, count, q01..q99
    root/meta/tasks.parquet                           index: task text, column task_index
    root/meta/episodes/chunk-000/file-000.parquet     one row per episode (length, data range, success, seed)
    root/data/chunk-000/file-NNN.parquet              one row per frame

Frame columns: ``observation.images.<camera>`` (struct{bytes: PNG, path}, as Hugging Face ``datasets``
stores an Image), ``observation.state`` float32[4], ``action`` float32[4] (the absolute command sent after
the frame), ``timestamp``, ``frame_index``, ``episode_index``, ``index``, ``task_index``. Stats follow LeRobot:
vectors per dimension, images per channel on [0, 1] with shape [3, 1, 1], std the population std.

    w = DatasetWriter(root, fps=20, image_hw=(64, 64), cameras=("scene", "wrist"))
    w.add_episode(frames, states, actions, instruction, success=True, task="reach", seed=3)
    w.close()
    ds = read_dataset(root)         # numpy arrays (images decoded)
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

CODEBASE_VERSION = "v3.0"
ROBOT_TYPE = "metaworld_sawyer_ee"
STATE_NAMES = ["ee_x", "ee_y", "ee_z", "gripper"]
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
FILE_SIZE_MB = 100  # start a new data file past this size (LeRobot's default)


def image_key(camera: str) -> str:
    return f"observation.images.{camera}"


def _png(img: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(img[:, :, ::-1]))  # RGB -> BGR for OpenCV
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


def _unpng(data: bytes) -> np.ndarray:
    import cv2

    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("a frame's image bytes are not a decodable PNG")
    return img[:, :, ::-1]  # BGR -> RGB


class _Moments:
    """Running count / sum / sum of squares / min / max over the last axis's channels."""

    def __init__(self, dim: int):
        self.n = 0
        self.s = np.zeros(dim)
        self.ss = np.zeros(dim)
        self.lo = np.full(dim, np.inf)
        self.hi = np.full(dim, -np.inf)

    def add(self, x: np.ndarray) -> None:  # x: [N, dim] float64
        self.n += len(x)
        self.s += x.sum(0)
        self.ss += (x * x).sum(0)
        self.lo = np.minimum(self.lo, x.min(0))
        self.hi = np.maximum(self.hi, x.max(0))

    def stats(self) -> dict[str, np.ndarray]:
        mean = self.s / self.n
        std = np.sqrt(np.maximum(self.ss / self.n - mean ** 2, 0.0))
        return {"mean": mean, "std": std, "min": self.lo, "max": self.hi}


def _vector_stats(x: np.ndarray) -> dict[str, list]:
    """LeRobot's stats of a [N, D] feature: mean, std (population), min, max, count, q01..q99."""
    x = np.asarray(x, dtype=np.float64)
    out = {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0)}
    for q in QUANTILES:
        out[f"q{int(round(q * 100)):02d}"] = np.quantile(x, q, axis=0)
    res = {k: v.tolist() for k, v in out.items()}
    res["count"] = [int(len(x))]
    return res


class DatasetWriter:
    """Writes episodes as they come (data files rotate past FILE_SIZE_MB); ``close()`` writes the metadata."""

    def __init__(self, root: str | Path, *, fps: float, image_hw: tuple[int, int],
                 cameras: Sequence[str] = ("scene", "wrist"), robot_type: str = ROBOT_TYPE):
        import pyarrow as pa

        self.root = Path(root)
        if (self.root / "meta" / "info.json").exists():
            raise ValueError(f"dataset {self.root} already exists; choose a new directory")
        if not (fps > 0 and math.isfinite(fps)):
            raise ValueError(f"fps must be positive, got {fps!r}")
        self.pa = pa
        self.fps, self.image_hw, self.cameras, self.robot_type = float(fps), tuple(image_hw), tuple(cameras), robot_type
        self.tasks: dict[str, int] = {}  # instruction -> task_index
        self.episodes: list[dict] = []
        self._states: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []
        self._img = {c: _Moments(3) for c in self.cameras}
        self._frames = 0
        self._file_index = 0
        self._writer = None
        self._file_bytes = 0
        img_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        self.schema = pa.schema(
            [(image_key(c), img_t) for c in self.cameras]
            + [("observation.state", pa.list_(pa.float32(), 4)), ("action", pa.list_(pa.float32(), 4)),
               ("timestamp", pa.float32()), ("frame_index", pa.int64()), ("episode_index", pa.int64()),
               ("index", pa.int64()), ("task_index", pa.int64())])

    def add_episode(self, frames: Mapping[str, np.ndarray], states: np.ndarray, actions: np.ndarray,
                    instruction: str, *, success: bool, task: str = "", seed: int = -1) -> int:
        """frames: {camera: uint8 [T, H, W, 3]}; states, actions: [T, 4]. Returns the episode index."""
        pa = self.pa
        states = np.asarray(states, dtype=np.float32)
        actions = np.asarray(actions, dtype=np.float32)
        t = len(states)
        if t < 1 or states.shape != (t, 4) or actions.shape != (t, 4):
            raise ValueError(f"episode: states {states.shape} and actions {actions.shape} must both be [T>=1, 4]")
        if not (np.isfinite(states).all() and np.isfinite(actions).all()):
            raise ValueError("episode: states/actions hold non-finite values")
        for c in self.cameras:
            f = frames.get(c)
            if f is None or f.shape != (t, *self.image_hw, 3) or f.dtype != np.uint8:
                raise ValueError(f"episode: camera {c!r} frames must be uint8 {(t, *self.image_hw, 3)}, got "
                                 f"{None if f is None else (f.shape, f.dtype)}")
        ep = len(self.episodes)
        task_index = self.tasks.setdefault(instruction, len(self.tasks))
        if self._writer is None:
            self._open()
        cols = {}
        for c in self.cameras:
            cols[image_key(c)] = pa.array([{"bytes": _png(im), "path": None} for im in frames[c]],
                                          type=self.schema.field(image_key(c)).type)
            self._img[c].add(frames[c].reshape(-1, 3).astype(np.float64) / 255.0)
        cols["observation.state"] = pa.array(list(states), type=pa.list_(pa.float32(), 4))
        cols["action"] = pa.array(list(actions), type=pa.list_(pa.float32(), 4))
        cols["timestamp"] = pa.array((np.arange(t) / self.fps).astype(np.float32))
        cols["frame_index"] = pa.array(np.arange(t, dtype=np.int64))
        cols["episode_index"] = pa.array(np.full(t, ep, dtype=np.int64))
        cols["index"] = pa.array(np.arange(self._frames, self._frames + t, dtype=np.int64))
        cols["task_index"] = pa.array(np.full(t, task_index, dtype=np.int64))
        table = pa.table(cols, schema=self.schema)
        self._writer.write_table(table)
        self._file_bytes += table.nbytes
        self.episodes.append({
            "episode_index": ep, "tasks": [instruction], "length": t,
            "data/chunk_index": 0, "data/file_index": self._file_index,
            "dataset_from_index": self._frames, "dataset_to_index": self._frames + t,
            "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
            "success": bool(success), "task_name": task, "seed": int(seed)})
        self._frames += t
        self._states.append(states)
        self._actions.append(actions)
        if self._file_bytes > FILE_SIZE_MB * 2 ** 20:
            self._writer.close()
            self._writer = None
            self._file_index += 1
        return ep

    def _open(self) -> None:
        import pyarrow.parquet as pq

        path = self.root / DATA_PATH.format(chunk_index=0, file_index=self._file_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(path, self.schema)
        self._file_bytes = 0

    def close(self) -> None:
        """Write meta/ (info, stats, tasks, episodes). Needs at least one episode."""
        import pandas as pd

        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not self.episodes:
            raise ValueError("DatasetWriter.close: no episodes were added")
        meta = self.root / "meta"
        (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
        h, w = self.image_hw
        features = {image_key(c): {"dtype": "image", "shape": [h, w, 3], "names": ["height", "width", "channels"]}
                    for c in self.cameras}
        features["observation.state"] = {"dtype": "float32", "shape": [4], "names": STATE_NAMES}
        features["action"] = {"dtype": "float32", "shape": [4], "names": STATE_NAMES}
        for k, dt in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                      ("index", "int64"), ("task_index", "int64")):
            features[k] = {"dtype": dt, "shape": [1], "names": None}
        n_ep = len(self.episodes)
        info = {
            "codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
            "total_episodes": n_ep, "total_frames": self._frames, "total_tasks": len(self.tasks),
            "chunks_size": 1000, "data_files_size_in_mb": FILE_SIZE_MB, "video_files_size_in_mb": 200,
            "fps": self.fps if not float(self.fps).is_integer() else int(self.fps),
            "splits": {"train": f"0:{n_ep}"}, "data_path": DATA_PATH, "video_path": None, "features": features,
            "successful_episodes": int(sum(e["success"] for e in self.episodes)),
        }
        (meta / "info.json").write_text(json.dumps(info, indent=2))
        stats = {"observation.state": _vector_stats(np.concatenate(self._states)),
                 "action": _vector_stats(np.concatenate(self._actions))}
        for c in self.cameras:
            m = self._img[c].stats()
            stats[image_key(c)] = {k: v.reshape(3, 1, 1).tolist() for k, v in m.items()}
            stats[image_key(c)]["count"] = [int(self._img[c].n // (h * w))]
        for k, col in (("timestamp", "timestamp"), ("frame_index", "frame_index"), ("episode_index", "episode_index"),
                       ("index", "index"), ("task_index", "task_index")):
            stats[k] = _vector_stats(self._column(col)[:, None])
        (meta / "stats.json").write_text(json.dumps(stats, indent=2))
        tasks = pd.DataFrame({"task_index": list(self.tasks.values())}, index=pd.Index(list(self.tasks), name="task"))
        tasks.to_parquet(meta / "tasks.parquet")
        pd.DataFrame(self.episodes).to_parquet(self.root / EPISODES_PATH, index=False)

    def _column(self, name: str) -> np.ndarray:
        out = []
        for e in self.episodes:
            t = e["length"]
            if name == "timestamp":
                out.append(np.arange(t) / self.fps)
            elif name == "frame_index":
                out.append(np.arange(t))
            elif name == "episode_index":
                out.append(np.full(t, e["episode_index"]))
            elif name == "index":
                out.append(np.arange(e["dataset_from_index"], e["dataset_to_index"]))
            else:
                out.append(np.full(t, self.tasks[e["tasks"][0]]))
        return np.concatenate(out).astype(np.float64)

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            self._writer.close()


@dataclass
class DemoDataset:
    images: dict[str, np.ndarray]  # camera -> uint8 [N, H, W, 3]
    state: np.ndarray  # float32 [N, 4]
    action: np.ndarray  # float32 [N, 4]
    episode_index: np.ndarray  # int64 [N]
    frame_index: np.ndarray  # int64 [N]
    task_index: np.ndarray  # int64 [N]
    timestamp: np.ndarray  # float32 [N]
    tasks: list[str]  # task_index -> instruction
    fps: float
    episode_success: dict[int, bool]
    episode_task: dict[int, str]  # episode -> our task name
    episode_seed: dict[int, int]
    stats: dict[str, dict[str, np.ndarray]]  # feature -> {mean, std, min, max, count, q01..}
    info: dict

    def __len__(self) -> int:
        return len(self.state)

    @property
    def image_hw(self) -> tuple[int, int]:
        return tuple(next(iter(self.images.values())).shape[1:3])


def read_dataset(root: str | Path, cameras: Sequence[str] | None = None) -> DemoDataset:
    """The whole dataset as numpy arrays (images decoded). ``cameras``: a subset to decode (default all)."""
    import pandas as pd
    import pyarrow.parquet as pq

    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise FileNotFoundError(f"{root} is not a dataset: {info_path} is missing")
    info = json.loads(info_path.read_text())
    keys = [k for k, f in info["features"].items() if f["dtype"] == "image"]
    all_cams = [k.removeprefix("observation.images.") for k in keys]
    cams = list(all_cams if cameras is None else cameras)
    bad = [c for c in cams if c not in all_cams]
    if bad:
        raise ValueError(f"cameras {bad} not in dataset {root} (has {all_cams})")
    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{root}/data holds no parquet files")
    cols = [image_key(c) for c in cams] + ["observation.state", "action", "episode_index", "frame_index",
                                            "task_index", "timestamp"]
    parts = [pq.read_table(f, columns=cols) for f in files]
    import pyarrow as pa

    table = pa.concat_tables(parts)
    n = table.num_rows

    def vec(name: str) -> np.ndarray:
        return np.asarray(table.column(name).combine_chunks().flatten(), dtype=np.float32).reshape(n, -1)

    h, w = info["features"][keys[0]]["shape"][:2]
    images = {}
    for c in cams:
        arr = np.empty((n, h, w, 3), dtype=np.uint8)
        for i, b in enumerate(table.column(image_key(c)).combine_chunks().field("bytes").to_pylist()):
            arr[i] = _unpng(b)
        images[c] = arr
    tasks_df = pd.read_parquet(root / "meta" / "tasks.parquet")
    tasks = [""] * len(tasks_df)
    for text, idx in zip(tasks_df.index, tasks_df["task_index"]):
        tasks[int(idx)] = str(text)
    eps = pd.read_parquet(root / EPISODES_PATH)
    stats_raw = json.loads((root / "meta" / "stats.json").read_text())
    stats = {k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in stats_raw.items()}
    return DemoDataset(
        images=images, state=vec("observation.state"), action=vec("action"),
        episode_index=np.asarray(table.column("episode_index"), dtype=np.int64),
        frame_index=np.asarray(table.column("frame_index"), dtype=np.int64),
        task_index=np.asarray(table.column("task_index"), dtype=np.int64),
        timestamp=np.asarray(table.column("timestamp"), dtype=np.float32),
        tasks=tasks, fps=float(info["fps"]),
        episode_success={int(e): bool(s) for e, s in zip(eps["episode_index"], eps["success"])},
        episode_task={int(e): str(t) for e, t in zip(eps["episode_index"], eps["task_name"])},
        episode_seed={int(e): int(s) for e, s in zip(eps["episode_index"], eps["seed"])},
        stats=stats, info=info)

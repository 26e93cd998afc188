"""A LeRobot v3.0 dataset written episode by episode (cameras as MP4 video, or PNG images in the parquet).

    root/meta/info.json                                   codebase_version v3.0, fps, features, totals, paths
    root/meta/stats.json                                  per feature: min, max, mean, std, count, q01..q99
    root/meta/tasks.parquet                               index: task text; column task_index
    root/meta/episodes/chunk-000/file-000.parquet         one row per episode: length, data and video ranges,
                                                          per-episode stats/<feature>/<stat>, outcome, source
    root/data/chunk-000/file-NNN.parquet                  one row per frame
    root/videos/<camera key>/chunk-000/file-NNN.mp4       per camera, the episodes one after another

Frame columns: ``observation.state`` and ``action`` (float32 fixed-size lists), ``timestamp`` (float32,
frame_index / fps), ``frame_index``, ``episode_index``, ``index``, ``task_index`` (int64), and with images one
``observation.images.<name>`` struct{bytes: PNG, path} per camera. An episode's frames lie in one video file
from ``videos/<key>/from_timestamp`` on; data files rotate past 100 MB, video files past 200 MB (LeRobot's
sizes). Everything but the MP4 bytes is a pure function of the input: the same episodes give byte-identical
parquet and JSON files.

    w = DatasetWriter(root, fps=20, state_names=[...], action_names=[...], cameras=["observation.images.scene"])
    ep = w.add_episode(state, action, "Open the drawer.", meta={...})   # rows; frames follow per camera
    w.add_frame("observation.images.scene", rgb)                        # in order, T per episode
    w.close()                                                           # meta/
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .stats import ImageMoments, sample_positions, vector_stats
from .video import VideoConfig, VideoWriter

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_MB = 100
VIDEO_FILE_MB = 200
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
DEFAULT_FEATURES = (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                    ("index", "int64"), ("task_index", "int64"))


def _png(rgb: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[:, :, ::-1]))
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


def _chunk_file(i: int) -> tuple[int, int]:
    return i // CHUNKS_SIZE, i % CHUNKS_SIZE


@dataclass
class _Episode:
    index: int
    length: int
    task: str
    task_index: int
    from_index: int
    state: np.ndarray
    action: np.ndarray
    meta: dict
    sampled: frozenset = frozenset()  # positions whose frames feed the image statistics
    data_file: int = -1
    video: dict = field(default_factory=dict)  # key -> (file index, from_ts, to_ts)
    pngs: dict = field(default_factory=dict)  # key -> [bytes] (image mode, until written)


class _CameraVideo:
    """A camera's video files: frames in order, a new file after an episode once past VIDEO_FILE_MB."""

    def __init__(self, root: Path, key: str, fps: int, cfg: VideoConfig):
        self.root, self.key, self.fps, self.cfg = root, key, fps, cfg
        self.file_index = 0
        self.writer: VideoWriter | None = None
        self.info: dict | None = None

    def add(self, rgb: np.ndarray) -> None:
        if self.writer is None:
            c, f = _chunk_file(self.file_index)
            self.writer = VideoWriter(self.root / VIDEO_PATH.format(video_key=self.key, chunk_index=c, file_index=f),
                                      self.fps, self.cfg)
        self.writer.add(rgb)

    def end_episode(self, length: int) -> tuple[int, float, float]:
        """(file index, from_timestamp, to_timestamp) of the episode whose last frame was just added."""
        w = self.writer
        span = (self.file_index, (w.frames - length) / self.fps, w.frames / self.fps)
        self.info = w.info()
        if w.bytes > VIDEO_FILE_MB * 2 ** 20:
            w.close()
            self.writer = None
            self.file_index += 1
        return span

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class DatasetWriter:
    def __init__(self, root: str | Path, *, fps: int, state_names: Sequence[str], action_names: Sequence[str],
                 cameras: Sequence[str], images: bool = False, video: VideoConfig = VideoConfig(),
                 robot_type: str = "", extra_info: dict | None = None):
        self.root = Path(root)
        if float(fps) != int(fps) or int(fps) <= 0:
            raise ValueError(f"fps must be a positive whole number (LeRobot's datasets and videos), got {fps!r}")
        self.fps = int(fps)
        self.state_names, self.action_names = list(state_names), list(action_names)
        self.cameras, self.images, self.video_cfg = list(cameras), bool(images), video
        self.robot_type, self.extra_info = robot_type, dict(extra_info or {})
        self.tasks: dict[str, int] = {}
        self.episodes: list[_Episode] = []
        self.frames = 0
        self._cam_pos = {k: 0 for k in self.cameras}  # frames received per camera
        self._cam_ep = {k: 0 for k in self.cameras}  # the episode each camera is filling
        self._videos = {k: _CameraVideo(self.root, k, self.fps, video) for k in self.cameras} if not images else {}
        self._moments = {k: ImageMoments() for k in self.cameras}
        self._shape: dict[str, tuple[int, int]] = {}
        self._next_write = 0  # the next episode whose rows are due
        self._lock = threading.Lock()  # add_frame may be called from one thread per camera
        self._writer: pq.ParquetWriter | None = None
        self._data_file = 0
        self._data_bytes = 0
        s, a = len(self.state_names), len(self.action_names)
        cols = [(k, pa.struct([("bytes", pa.binary()), ("path", pa.string())])) for k in self.cameras] if images else []
        cols += [("observation.state", pa.list_(pa.float32(), s)), ("action", pa.list_(pa.float32(), a))]
        cols += [(n, pa.float32() if t == "float32" else pa.int64()) for n, t in DEFAULT_FEATURES]
        self.schema = pa.schema(cols)

    # episodes ------------------------------------------------------------------------------------------
    def add_episode(self, state: np.ndarray, action: np.ndarray, task: str, meta: dict | None = None) -> int:
        """Register an episode's rows (its frames follow through add_frame); returns its index."""
        state = np.asarray(state, dtype=np.float32)
        action = np.asarray(action, dtype=np.float32)
        t = len(state)
        if t < 1 or state.shape != (t, len(self.state_names)) or action.shape != (t, len(self.action_names)):
            raise ValueError(f"episode: state {state.shape} / action {action.shape} must be [T>=1, "
                             f"{len(self.state_names)}] / [T, {len(self.action_names)}]")
        if not (np.isfinite(state).all() and np.isfinite(action).all()):
            raise ValueError("episode: state/action hold non-finite values")
        if not task:
            raise ValueError("episode: empty task text")
        with self._lock:
            ti = self.tasks.setdefault(task, len(self.tasks))
            ep = _Episode(len(self.episodes), t, task, ti, self.frames, state, action, dict(meta or {}),
                          frozenset(sample_positions(t).tolist()))
            self.episodes.append(ep)
            self.frames += t
            self._flush_ready()
        return ep.index

    def add_frame(self, key: str, rgb: np.ndarray) -> None:
        """The next frame of camera ``key`` (episodes in order, ``length`` frames each). Each camera's frames
        may come from its own thread (one thread per camera)."""
        with self._lock:
            e = self._cam_ep[key]
            if e >= len(self.episodes):
                raise ValueError(f"camera {key}: a frame beyond the registered episodes")
            ep = self.episodes[e]
        pos = self._cam_pos[key] - ep.from_index  # position within the episode
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"camera {key}: expected uint8 [H, W, 3], got {rgb.dtype} {rgb.shape}")
        shape = self._shape.setdefault(key, rgb.shape[:2])
        if rgb.shape[:2] != shape:
            raise ValueError(f"camera {key}: frame {rgb.shape[1]}x{rgb.shape[0]} differs from its first "
                             f"{shape[1]}x{shape[0]}")
        if pos in ep.sampled:
            self._moments[key].add(rgb)
        if self.images:
            ep.pngs.setdefault(key, []).append(_png(rgb))
        else:
            self._videos[key].add(rgb)
        self._cam_pos[key] += 1
        if pos + 1 == ep.length:
            if not self.images:
                ep.video[key] = self._videos[key].end_episode(ep.length)
            with self._lock:
                self._cam_ep[key] += 1
                self._flush_ready()

    def _complete(self, ep: _Episode) -> bool:
        return all(self._cam_ep[k] > ep.index for k in self.cameras)

    def _flush_ready(self) -> None:
        while self._next_write < len(self.episodes) and (not self.images or self._complete(self.episodes[self._next_write])):
            self._write_rows(self.episodes[self._next_write])
            self._next_write += 1

    def _write_rows(self, ep: _Episode) -> None:
        if self._writer is None:
            c, f = _chunk_file(self._data_file)
            path = self.root / DATA_PATH.format(chunk_index=c, file_index=f)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(path, self.schema)
            self._data_bytes = 0
        t = ep.length
        cols = {}
        if self.images:
            for k in self.cameras:
                cols[k] = pa.array([{"bytes": b, "path": None} for b in ep.pngs.pop(k)], type=self.schema.field(k).type)
        cols["observation.state"] = pa.FixedSizeListArray.from_arrays(pa.array(ep.state.reshape(-1)),
                                                                      len(self.state_names))
        cols["action"] = pa.FixedSizeListArray.from_arrays(pa.array(ep.action.reshape(-1)), len(self.action_names))
        frame = np.arange(t, dtype=np.int64)
        cols["timestamp"] = pa.array((frame / self.fps).astype(np.float32))
        cols["frame_index"] = pa.array(frame)
        cols["episode_index"] = pa.array(np.full(t, ep.index, dtype=np.int64))
        cols["index"] = pa.array(np.arange(ep.from_index, ep.from_index + t, dtype=np.int64))
        cols["task_index"] = pa.array(np.full(t, ep.task_index, dtype=np.int64))
        table = pa.table(cols, schema=self.schema)
        self._writer.write_table(table)
        ep.data_file = self._data_file
        self._data_bytes += table.nbytes
        if self._data_bytes > DATA_FILE_MB * 2 ** 20:
            self._writer.close()
            self._writer = None
            self._data_file += 1

    def abort(self) -> None:
        """Close the open files after a failure (the caller removes the directory)."""
        for v in self._videos.values():
            try:
                v.close()
            except Exception:  # the encoder's own error: the files are discarded anyway
                pass
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # metadata ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the files and write meta/ (every episode's frames must have arrived)."""
        for v in self._videos.values():
            v.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not self.episodes:
            raise ValueError("no episodes to write")
        missing = {k: len(self.episodes) - self._cam_ep[k] for k in self.cameras if self._cam_ep[k] < len(self.episodes)}
        if missing or self._next_write < len(self.episodes):
            raise ValueError(f"episodes without all their frames (camera: episodes missing): {missing}")
        meta = self.root / "meta"
        (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
        (meta / "info.json").write_text(json.dumps(self._info(), indent=2) + "\n")
        (meta / "stats.json").write_text(json.dumps(self._stats(), indent=2) + "\n")
        tasks = pd.DataFrame({"task_index": list(self.tasks.values())}, index=pd.Index(list(self.tasks), name="task"))
        tasks.to_parquet(meta / "tasks.parquet")
        pq.write_table(self._episodes_table(), self.root / EPISODES_PATH)

    def _features(self) -> dict:
        f = {}
        for k in self.cameras:
            h, w = self._shape[k]
            f[k] = {"dtype": "image" if self.images else "video", "shape": [h, w, 3],
                    "names": ["height", "width", "channels"]}
            if not self.images:
                f[k]["info"] = self._videos[k].info
        f["observation.state"] = {"dtype": "float32", "shape": [len(self.state_names)], "names": self.state_names}
        f["action"] = {"dtype": "float32", "shape": [len(self.action_names)], "names": self.action_names}
        for n, t in DEFAULT_FEATURES:
            f[n] = {"dtype": t, "shape": [1], "names": None}
        return f

    def _info(self) -> dict:
        n = len(self.episodes)
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type or None, "total_episodes": n,
                "total_frames": self.frames, "total_tasks": len(self.tasks), "chunks_size": CHUNKS_SIZE,
                "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB, "fps": self.fps,
                "splits": {"train": f"0:{n}"}, "data_path": DATA_PATH,
                "video_path": None if self.images else VIDEO_PATH, "features": self._features()}
        info.update(self.extra_info)
        return info

    def _stats(self) -> dict:
        st = np.concatenate([e.state for e in self.episodes])
        ac = np.concatenate([e.action for e in self.episodes])
        stats = {k: self._moments[k].stats() for k in self.cameras}
        stats["observation.state"] = vector_stats(st)
        stats["action"] = vector_stats(ac)
        frame = np.concatenate([np.arange(e.length) for e in self.episodes])
        stats["timestamp"] = vector_stats(frame / self.fps)
        stats["frame_index"] = vector_stats(frame)
        stats["episode_index"] = vector_stats(np.concatenate([np.full(e.length, e.index) for e in self.episodes]))
        stats["index"] = vector_stats(np.arange(self.frames))
        stats["task_index"] = vector_stats(np.concatenate([np.full(e.length, e.task_index) for e in self.episodes]))
        return stats

    def _episodes_table(self) -> pa.Table:
        eps = self.episodes
        cols: dict[str, pa.Array] = {
            "episode_index": pa.array([e.index for e in eps], pa.int64()),
            "tasks": pa.array([[e.task] for e in eps], pa.list_(pa.string())),
            "length": pa.array([e.length for e in eps], pa.int64()),
            "data/chunk_index": pa.array([_chunk_file(e.data_file)[0] for e in eps], pa.int64()),
            "data/file_index": pa.array([_chunk_file(e.data_file)[1] for e in eps], pa.int64()),
            "dataset_from_index": pa.array([e.from_index for e in eps], pa.int64()),
            "dataset_to_index": pa.array([e.from_index + e.length for e in eps], pa.int64()),
        }
        for k in ([] if self.images else self.cameras):
            cols[f"videos/{k}/chunk_index"] = pa.array([_chunk_file(e.video[k][0])[0] for e in eps], pa.int64())
            cols[f"videos/{k}/file_index"] = pa.array([_chunk_file(e.video[k][0])[1] for e in eps], pa.int64())
            cols[f"videos/{k}/from_timestamp"] = pa.array([e.video[k][1] for e in eps], pa.float64())
            cols[f"videos/{k}/to_timestamp"] = pa.array([e.video[k][2] for e in eps], pa.float64())
        cols["meta/episodes/chunk_index"] = pa.array([0] * len(eps), pa.int64())
        cols["meta/episodes/file_index"] = pa.array([0] * len(eps), pa.int64())
        meta_keys = []
        for e in eps:
            meta_keys += [k for k in e.meta if k not in meta_keys]
        for k in meta_keys:
            cols[k] = pa.array([e.meta.get(k) for e in eps])
        for name, get in (("observation.state", lambda e: e.state), ("action", lambda e: e.action)):
            per = [vector_stats(get(e)) for e in eps]
            for s in per[0]:
                cols[f"stats/{name}/{s}"] = pa.array([p[s] for p in per], pa.list_(pa.float64()) if s != "count"
                                                     else pa.list_(pa.int64()))
        return pa.table(cols)

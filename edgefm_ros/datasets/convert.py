"""Bags -> a LeRobot v3.0 dataset: the two passes and the atomic output.

    report = convert_bags(["demo.bag"], "datasets/demo", DatasetMapping(), ConvertConfig(fps=20))

Pass 1 (``plan_bag``, per bag, before anything is written): read the mapped topics (bagread.scan_bag), split
the episodes (episodes.split_episodes), synchronise each episode's streams on the reference clock
(sync.synchronise) and check that every episode keeps at least one chunk of frames. Pass 2: read the camera
topics again, decode only the frames the ticks use, and write the dataset (v3writer.DatasetWriter) into a
temporary directory beside ``out``, renamed to ``out`` only when everything is written: the dataset
appears whole or not at all.
"""
from __future__ import annotations

import contextlib
import math
import os
import queue
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .bagread import BagScan, header_stamp_ns, iter_camera_messages, scan_bag
from .episodes import EpisodeSpan, split_episodes
from .errors import RecordingError
from .images import decode_frame
from .mapping import ACTION_KEY as ACTION
from .mapping import STATE_KEY as STATE
from .mapping import DatasetMapping
from .report import ConversionReport, stream_report
from .sync import SyncResult, synchronise
from .v3writer import DatasetWriter
from .video import VideoConfig

Progress = Callable[[str, int, int], None]  # (stage, done, total)
QUEUE_FRAMES = 16  # encoded camera messages waiting per camera thread (bounds memory)


@dataclass(frozen=True)
class ConvertConfig:
    fps: int = 20  # the reference clock and the dataset's frame rate
    chunk_size: int = 16  # an episode must keep at least this many frames (one action chunk)
    images: bool = False  # cameras as PNG images in the parquet instead of MP4 video
    video: VideoConfig = VideoConfig()
    skip_short: bool = False  # leave out (and report) episodes shorter than a chunk instead of failing

    def __post_init__(self) -> None:
        if not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps) and self.fps > 0
                and float(self.fps).is_integer()):
            raise ValueError(f"fps must be a positive whole number, got {self.fps!r}")
        object.__setattr__(self, "fps", int(self.fps))
        if not 1 <= self.chunk_size <= 10000:
            raise ValueError(f"chunk_size must be in 1..10000, got {self.chunk_size!r}")


@dataclass
class EpisodePlan:
    span: EpisodeSpan
    sync: SyncResult
    state: np.ndarray  # float32 [T, S]
    action: np.ndarray  # float32 [T, A]


@dataclass
class BagPlan:
    scan: BagScan
    cue: str
    episodes: list[EpisodePlan]
    skipped: list[dict] = field(default_factory=list)  # short episodes left out (skip_short)


def _cue_topic(scan: BagScan, cue: str) -> str:
    if cue == "events" and scan.events is not None:
        return scan.events.topic
    if cue == "instruction" and scan.instruction is not None:
        return scan.instruction.topic
    return scan.state.topic


def plan_bag(path: str | Path, mapping: DatasetMapping, cfg: ConvertConfig,
             progress: Progress | None = None) -> BagPlan:
    """Pass 1 for one bag: read, split, synchronise, check (raises RecordingError)."""
    name = Path(path).name
    scan = scan_bag(path, mapping, (lambda d, t: progress(f"read {name}", d, t)) if progress else None)
    spans, cue = split_episodes(scan, mapping.gap_s, mapping.task)
    streams = {STATE: scan.state.times, ACTION: scan.action.times}
    ages = {STATE: mapping.age_s(mapping.state), ACTION: mapping.age_s(mapping.action)}
    for c in mapping.cameras:
        streams[c.key] = scan.cameras[c.key].times
        ages[c.key] = mapping.age_s(c)
    max_age_ns = {k: int(round(v * 1e9)) for k, v in ages.items()}
    plans, skipped = [], []
    if not spans:
        raise RecordingError(scan.path, _cue_topic(scan, cue), None, f"no episode found (cue: {cue})")
    for i, span in enumerate(spans):
        s = synchronise(streams, max_age_ns, span.start_ns, span.end_ns, cfg.fps)
        if len(s.ticks) < cfg.chunk_size:
            stale = ", ".join(f"{_topic(mapping, k)} {n}" for k, n in s.stale.items() if n)
            never = [_topic(mapping, k) for k, n in s.stale.items() if s.total_ticks and n == s.total_ticks]
            problem = (f"episode {i} of this bag ({span.task!r}, {(span.end_ns - span.start_ns) * 1e-9:.2f} s) keeps "
                       f"{len(s.ticks)} of {s.total_ticks} ticks at {cfg.fps} fps, fewer than one chunk "
                       f"({cfg.chunk_size})" + (f"; stale ticks by stream: {stale}" if stale else "")
                       + (f" ({', '.join(never)} never had a sample within max_age_s: stamped on another clock? "
                          f"try clock: bag)" if never and mapping.clock == "header" else ""))
            if cfg.skip_short:
                skipped.append({"episode_in_bag": i, "start_ns": span.start_ns, "frames": len(s.ticks),
                                "reason": problem})
                continue
            raise RecordingError(scan.path, _cue_topic(scan, cue), span.start_ns, problem, scan.start_ns)
        plans.append(EpisodePlan(span, s, scan.state.values[s.index[STATE]].astype(np.float32),
                                 scan.action.values[s.index[ACTION]].astype(np.float32)))
    return BagPlan(scan, cue, plans, skipped)


def _topic(mapping: DatasetMapping, stream: str) -> str:
    if stream == STATE:
        return mapping.state.topic
    if stream == ACTION:
        return mapping.action.topic
    return next(c.topic for c in mapping.cameras if c.key == stream)


class _CameraWorker(threading.Thread):
    """Decodes one camera's frames and hands them to the writer, in order, on its own thread (the codecs
    release the GIL, so the cameras' JPEG decoding and video encoding run side by side)."""

    def __init__(self, key: str, writer: DatasetWriter, bag: str, bag_start_ns: int, stop: threading.Event):
        super().__init__(name=f"frames-{key}", daemon=True)
        self.key, self.writer, self.bag, self.bag_start_ns, self.stop = key, writer, bag, bag_start_ns, stop
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_FRAMES)
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                item = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is None:
                return
            topic, msgtype, raw, repeat = item
            try:
                rgb = decode_frame(msgtype, raw)
                for _ in range(repeat):
                    self.writer.add_frame(self.key, rgb)
                self.done += repeat
            except Exception as e:
                t = header_stamp_ns(raw) if len(raw) >= 12 else None
                self.error = RecordingError(self.bag, topic, t, f"camera frame for {self.key}: {e}", self.bag_start_ns)
                self.stop.set()
                return

    def put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


def _write_frames(plan: BagPlan, mapping: DatasetMapping, writer: DatasetWriter, progress: Progress | None,
                  done: int, total: int) -> int:
    """Pass 2 for one bag: decode the frames the ticks use and hand them to the writer, per camera in order."""
    key_of = {c.topic: c.key for c in mapping.cameras}
    needed = {c.key: np.concatenate([e.sync.index[c.key] for e in plan.episodes]) for c in mapping.cameras}
    pos = {k: 0 for k in needed}
    bag = plan.scan.path
    if sum(len(v) for v in needed.values()) == 0:
        return done
    stop = threading.Event()
    workers = {k: _CameraWorker(k, writer, bag, plan.scan.start_ns, stop) for k in needed}
    for w in workers.values():
        w.start()
    base = done
    try:
        with contextlib.closing(iter_camera_messages(bag, list(key_of))) as messages:  # closes the bag on break
            for topic, k, msgtype, raw in messages:
                if stop.is_set():
                    break
                key = key_of[topic]
                want, p = needed[key], pos[key]
                if p >= len(want) or want[p] != k:
                    continue
                while p < len(want) and want[p] == k:
                    p += 1
                workers[key].put((topic, msgtype, raw, p - pos[key]))
                pos[key] = p
                if progress is not None:
                    progress("frames", base + sum(w.done for w in workers.values()), total)
                if all(pos[x] == len(v) for x, v in needed.items()):
                    break
        for w in workers.values():
            w.put(None)
        while any(w.is_alive() for w in workers.values()):
            for w in workers.values():
                w.join(timeout=0.5)
            if progress is not None:
                progress("frames", base + sum(w.done for w in workers.values()), total)
    finally:
        if any(w.is_alive() for w in workers.values()):
            stop.set()
            for w in workers.values():
                w.join()
    errors = [w.error for w in workers.values() if w.error is not None]
    if errors:
        raise errors[0]
    short = {k: len(v) - pos[k] for k, v in needed.items() if pos[k] < len(v)}
    if short:
        raise RecordingError(bag, None, None, f"the second reading of the bag ended early (frames missing per "
                                              f"camera: {short}): the bag changed during the conversion?")
    return base + sum(w.done for w in workers.values())


def _partial_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial-{os.getpid()}"


def _remove_stale_partials(out: Path) -> None:
    """Partial directories of ``out`` whose converting process is gone (killed before it could clean up)."""
    for d in out.parent.glob(f".{out.name}.partial-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # another user's live process
            pass


def convert_bags(bags: Sequence[str | Path], out: str | Path, mapping: DatasetMapping = DatasetMapping(),
                 cfg: ConvertConfig = ConvertConfig(), progress: Progress | None = None) -> ConversionReport:
    """Convert ``bags`` (in order; episodes numbered across them) into a LeRobot v3.0 dataset at ``out``.

    Raises RecordingError for a bad recording and ValueError for bad arguments; either way ``out`` is not
    created. The report is also written to ``out/meta/conversion_report.json``."""
    out = Path(out)
    if not bags:
        raise ValueError("no bags to convert")
    if out.exists():
        raise ValueError(f"output {out} already exists; choose a new directory")
    if not out.parent.is_dir():
        raise ValueError(f"output's parent directory {out.parent} does not exist")
    plans = [plan_bag(b, mapping, cfg, progress) for b in bags]
    first = plans[0].scan
    names_s, names_a = first.state.names, first.action.names
    for p in plans[1:]:
        for what, got, want in (("state", p.scan.state.names, names_s), ("action", p.scan.action.names, names_a)):
            if got != want:
                topic = p.scan.state.topic if what == "state" else p.scan.action.topic
                raise RecordingError(p.scan.path, topic, None, f"{what} joints {list(got)} differ from the first "
                                                               f"bag's {list(want)}")
    if not any(p.episodes for p in plans):
        raise RecordingError(str(bags[0]), None, None, "every episode was shorter than a chunk: nothing to write")
    total = sum(len(e.sync.ticks) for p in plans for e in p.episodes) * len(mapping.cameras)
    report = ConversionReport(fps=cfg.fps, chunk_size=cfg.chunk_size, mapping=mapping.as_dict(),
                              cameras="images" if cfg.images else f"video ({cfg.video.vcodec})")
    _remove_stale_partials(out)
    tmp = _partial_dir(out)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    writer = None
    try:
        writer = DatasetWriter(tmp, fps=cfg.fps, state_names=names_s, action_names=names_a,
                               cameras=[c.key for c in mapping.cameras], images=cfg.images, video=cfg.video,
                               robot_type=mapping.robot_type)
        done = 0
        for p in plans:
            for e in p.episodes:
                writer.add_episode(e.state, e.action, e.span.task, {
                    "success": e.span.success, "outcome": e.span.outcome or "unknown", "task_name": e.span.task_name,
                    "seed": e.span.seed, "split_by": p.cue, "source_bag": str(p.scan.path),
                    "source_start_ns": e.span.start_ns, "source_end_ns": e.span.end_ns})
            done = _write_frames(p, mapping, writer, progress, done, total)
            report.bags.append(stream_report(p, mapping))
        writer.close()
        report.episodes, report.frames, report.tasks = len(writer.episodes), writer.frames, list(writer.tasks)
        report.write(tmp / "meta" / "conversion_report.json")
        os.rename(tmp, out)
    except BaseException:
        if writer is not None:
            writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report

"""The action node's state without ROS: chunks in (by joint name), one command per tick out, statistics.

Thread-safe: chunks arrive on the executor thread, ticks run on the control thread.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from edgefm_ros.control.commander import Command, Commander
from edgefm_ros.control.queue import ActionQueue, MergeResult, TickGrid
from edgefm_ros.control.request import QueueState, queue_state
from edgefm_ros.control.stats import RollingStats
from edgefm_ros.types import ActionChunk


@dataclass(frozen=True)
class CoreCounters:
    chunks: int  # chunks merged
    rejected_chunks: int  # chunks refused (joint names, shape, values)
    late_chunks: int  # chunks that arrived entirely in the past
    underruns: int  # ticks with an empty queue after the first action
    waiting_ticks: int  # ticks before the first action
    last_seq: int  # sequence of the last merged chunk
    last_chunk_time: float  # arrival time of the last merged chunk (NaN: none yet)
    stale_chunks: int = 0  # chunks from observations before the last episode start, dropped


class ControlCore:
    def __init__(self, period: float, aggregate: str = "weighted_average", threshold: float = 0.5,
                 joint_names: tuple[str, ...] = ()):
        queue_state(0, 0, threshold)  # validates the threshold
        self.period = period
        self.aggregate = aggregate
        self.threshold = threshold
        self.joint_names = tuple(joint_names)  # command order; adopted from the first chunk when empty
        self.lock = threading.Lock()
        self.arrival_latency = RollingStats()  # observation -> chunk arrival (s)
        self.frame_to_action = RollingStats()  # observation -> first tick commanding from its chunk (s)
        self.skipped_rows = RollingStats()  # rows of each chunk already in the past on arrival
        self.start(0.0)

    def start(self, origin: float) -> None:
        """Start the tick grid at ``origin`` (tick 0's time); drops the queue, keeps the last position."""
        with self.lock:
            last = getattr(self, "commander", None)
            self.grid = TickGrid(origin, self.period)
            self.queue = ActionQueue(self.grid, self.aggregate)
            self.commander = Commander(self.queue)
            if last is not None:
                self.commander.last = last.last
            self._chunk_ticks = 0
            self._pending: dict[int, float] = {}  # chunk seq -> observation stamp, until first commanded
            self.chunks = self.rejected = self.late = self.stale = 0
            self.cutoff = -float("inf")  # chunks observed before this (the episode start) are stale
            self.last_seq = 0
            self.last_chunk_time = float("nan")

    def _columns(self, chunk: ActionChunk) -> np.ndarray:
        """Chunk actions (n, d) reordered to the command joint order."""
        a = np.asarray(chunk.actions, dtype=np.float64)
        names = tuple(chunk.joint_names)
        if not self.joint_names:
            self.joint_names = names or tuple(f"joint_{i}" for i in range(a.shape[1]))
        if not names:
            if a.shape[1] != len(self.joint_names):
                raise ValueError(f"chunk without joint names has {a.shape[1]} columns for "
                                 f"{len(self.joint_names)} joints {list(self.joint_names)}")
            return a
        pos = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.joint_names if n not in pos]
        if missing:
            raise ValueError(f"chunk joint names {list(names)} lack {missing}")
        return a[:, [pos[n] for n in self.joint_names]]

    def reset(self, cutoff: float) -> None:
        """A new episode: the queue and the held position are dropped (nothing is commanded until the next
        chunk); chunks from observations stamped before ``cutoff`` belong to the old episode."""
        with self.lock:
            self.queue.clear()
            self.commander.last = None
            self._chunk_ticks = 0
            self._pending = {}
            self.cutoff = cutoff

    def merge(self, chunk: ActionChunk, now: float) -> MergeResult:
        """Merge an arriving chunk; ValueError (counted) when its joints do not match. A chunk observed before
        the episode start (``stale``) or whose rows are all past on arrival (late) is dropped but reported
        consumed (last_seq), so the producer goes on."""
        with self.lock:
            if chunk.stamp < self.cutoff:
                self.stale += 1
                self.last_seq = max(self.last_seq, chunk.seq)
                return MergeResult(0, chunk.actions.shape[0], 0, 0, now - chunk.stamp, -1, stale=True)
            try:
                cols = self._columns(chunk)
                r = self.queue.merge(cols, chunk.stamp, chunk.dt, now, chunk.seq)
            except ValueError:
                self.rejected += 1
                raise
            self.arrival_latency.add(r.latency_s)
            self.skipped_rows.add(r.skipped_rows)
            if r.scheduled == 0:  # every row already past: dropped, but reported consumed (last_seq) like a
                self.late += 1    # stale one, so the producer starts the next chunk now, not after its timeout
                self.last_seq = max(self.last_seq, chunk.seq)
                return r
            self.chunks += 1
            self.last_seq = chunk.seq
            self.last_chunk_time = now
            self._chunk_ticks = int(round((cols.shape[0] - 1) * chunk.dt / self.period)) + 1
            self._pending[chunk.seq] = chunk.stamp
            return r

    def tick(self, k: int) -> Command:
        with self.lock:
            cmd = self.commander.step(k)
            stamp = self._pending.pop(cmd.seq, None) if cmd.seq >= 0 else None
            if stamp is not None:
                self.frame_to_action.add(self.grid.time(k) - stamp)
                self._pending = {s: t for s, t in self._pending.items() if s > cmd.seq}
            return cmd

    def hold(self) -> Command:
        with self.lock:
            return self.commander.hold()

    def state(self) -> QueueState:
        with self.lock:
            return queue_state(len(self.queue), self._chunk_ticks, self.threshold)

    def counters(self) -> CoreCounters:
        with self.lock:
            c = self.commander
            return CoreCounters(self.chunks, self.rejected, self.late, c.underruns, c.waiting_ticks,
                                self.last_seq, self.last_chunk_time, self.stale)

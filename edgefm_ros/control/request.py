"""When to compute the next chunk (LeRobot async style): the queue below a threshold asks for one.

``queue_state`` is the action node's side (what QueueStatus says); ``ChunkRequester`` is the VLA node's
side: start a chunk when asked, never while one is being computed or has been published but not yet
merged (a lost chunk is forgotten after ``merge_timeout_s``); after a refused observation it waits
``retry_s`` before trying again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueState:
    queue_size: int  # ticks left in the queue
    chunk_size: int  # grid ticks the last chunk covered (0 before the first)
    fill_ratio: float  # queue_size / chunk_size (0 before the first chunk)
    request_chunk: bool  # fill_ratio < threshold (always before the first chunk)
    must_go: bool  # queue empty: request immediately


def queue_state(queue_size: int, chunk_size: int, threshold: float) -> QueueState:
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"chunk_size_threshold must be in [0, 1], got {threshold!r}")
    fill = queue_size / chunk_size if chunk_size > 0 else 0.0
    request = chunk_size == 0 or fill < threshold or threshold >= 1.0  # 1.0: infer continuously
    return QueueState(queue_size, chunk_size, fill, request, queue_size == 0)


class ChunkRequester:
    def __init__(self, merge_timeout_s: float = 1.0, retry_s: float = 0.05):
        if not (merge_timeout_s > 0 and math.isfinite(merge_timeout_s)):
            raise ValueError(f"merge_timeout_s must be a positive number, got {merge_timeout_s!r}")
        if not (retry_s >= 0 and math.isfinite(retry_s)):
            raise ValueError(f"retry_s must be a number >= 0, got {retry_s!r}")
        self.merge_timeout_s = merge_timeout_s
        self.retry_s = retry_s
        self._retry_at = -math.inf
        self.busy = False  # a chunk is being computed
        self.awaiting_seq = 0  # published, not yet reported merged (0: none)
        self._published_at = 0.0
        self.lost = 0  # chunks never reported merged within the timeout

    def should_start(self, request: bool, must_go: bool, last_merged_seq: int, now: float) -> bool:
        if self.busy or now < self._retry_at:
            return False
        if self.awaiting_seq:
            if last_merged_seq >= self.awaiting_seq:
                self.awaiting_seq = 0
            elif now - self._published_at > self.merge_timeout_s:
                self.awaiting_seq = 0
                self.lost += 1
            else:
                return False
        return request or must_go

    def started(self) -> None:
        self.busy = True

    def finished(self, published_seq: int, now: float) -> None:
        """The computation ended; ``published_seq`` 0 when nothing was published (refused or failed)."""
        self.busy = False
        if published_seq:
            self.awaiting_seq = published_seq
            self._published_at = now
        else:
            self._retry_at = now + self.retry_s

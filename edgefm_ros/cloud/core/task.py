"""What the server, the settings and the clients need of a task (tasks/vla.py, tasks/vqa.py).

A ``Task`` is static: names, its runtime config type, the loader, client defaults. ``Task.load(cfg)``
runs on the server's engine thread and returns the task's ``Served`` model (the warmed-up engine and
what it accepts); MLServer glue (server/runtime.py) is the same for every task.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

from edgefm_ros.cloud.core.protocol import Tensor
from edgefm_ros.cloud.core.timing import RequestClock


def config_from_extra(cls, extra: Mapping[str, Any] | None):
    """A runtime config dataclass from model-settings ``parameters.extra``; ValueError naming unknown keys."""
    extra = dict(extra or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"model-settings parameters.extra has unknown keys {unknown}; known: {sorted(known)}")
    return cls(**extra)


def check_at_least(cfg, names: Sequence[str], lo: int) -> None:
    """ValueError naming the first of ``cfg``'s fields ``names`` below ``lo``."""
    for k in names:
        if getattr(cfg, k) < lo:
            raise ValueError(f"{type(cfg).__name__}.{k} must be >= {lo}, got {getattr(cfg, k)!r}")


class Served(Protocol):
    """A task's loaded model on the server."""

    label: str  # the response's "model" and the log line's name

    def describe(self) -> str: ...  # the load log line's details

    def decode(self, request_id: str, params: Mapping[str, Any], inputs: Sequence[Tensor]) -> Any:
        """Checked request (has ``request_id`` and ``deadline_s``); ProtocolError naming the field."""

    def run(self, req: Any, clock: RequestClock, faults: Mapping[str, float],
            on_delta: Callable[[int, str], None] | None = None, cancel: threading.Event | None = None) -> dict:
        """Engine thread: the response's ``outputs`` and ``parameters``; ProtocolError (4xx/5xx) or
        ValueError (the engine's input checks: 400)."""

    def metadata(self) -> dict:
        """``inputs``, ``outputs`` (tensor_spec dicts) and ``parameters`` (request parameters) of the model."""


@dataclass(frozen=True)
class Task:
    name: str  # "vla" | "vqa"
    model_name: str  # default v2 model name
    implementation: str  # the MLServer runtime class serving it
    config_type: type  # its parameters.extra: from_extra(), decode_threads, fault_injection, mode
    load: Callable[[Any], Served]  # config -> warmed-up model (on the engine thread)
    model_extra: Callable[[Any, Mapping[str, Any]], dict]  # (ServeConfig, base extra) -> parameters.extra
    drills: tuple[tuple[str, float], ...] = (("fault_delay_s", 60.0),)  # fault parameters and their bounds (s)
    streams: bool = False  # predict_stream answers one event per token
    client_defaults: tuple[tuple[str, Any], ...] = ()  # ClientConfig fields that differ for this task

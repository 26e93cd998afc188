"""The engine modes: the one list that engines, dispatch tables, skills, the tuner and server settings check.

    reference  the reference implementations only (LeRobot's math in fp32)
    exact      + fp32 kernels that keep LeRobot parity, and the skills of exact mode
    fast       + reduced precision and compiled kernels, the skills of fast mode, this machine's tuned table

No torch, no ROS: settings modules (cloud/) import it without pulling the runtime in.
"""
from __future__ import annotations

from typing import Literal, get_args

Mode = Literal["exact", "fast", "reference"]
MODES: tuple[str, ...] = get_args(Mode)
TUNABLE: tuple[str, ...] = ("exact", "fast")  # modes with a choice to make: skills declare them, the tuner searches them


def check_mode(value: object, allowed: tuple[str, ...] = MODES, what: str = "mode") -> Mode:
    """``value`` when it is one of ``allowed``; else ValueError naming it."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
    return value  # type: ignore[return-value]


__all__ = ["Mode", "MODES", "TUNABLE", "check_mode"]

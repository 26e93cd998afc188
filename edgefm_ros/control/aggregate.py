"""How an arriving action merges with the one already queued for the same tick.

The four functions are LeRobot's async-inference aggregation functions (``old`` is the queued action,
``new`` the one from the chunk that just arrived), with the same names and weights. ``rtc`` is the merge
for real-time chunking: the new chunk, guided to continue the queued motion, replaces the queue from the
first tick not yet executed (ActionQueue counts those ticks as replaced, not aggregated).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

AggregateFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def weighted_average(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return 0.3 * old + 0.7 * new


def latest_only(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return new


def average(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return 0.5 * old + 0.5 * new


def conservative(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return 0.7 * old + 0.3 * new


def rtc(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return new


AGGREGATE_FUNCTIONS: dict[str, AggregateFn] = {
    "weighted_average": weighted_average,
    "latest_only": latest_only,
    "average": average,
    "conservative": conservative,
    "rtc": rtc,
}
REPLACING = frozenset({"rtc"})  # merges that replace queued ticks instead of blending them


def get_aggregate(name: str) -> AggregateFn:
    if name not in AGGREGATE_FUNCTIONS:
        raise ValueError(f"unknown aggregate function {name!r}; choose one of {sorted(AGGREGATE_FUNCTIONS)}")
    return AGGREGATE_FUNCTIONS[name]

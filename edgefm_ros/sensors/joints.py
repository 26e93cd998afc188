"""Joint-name order: a sensor_msgs/JointState's names mapped onto a fixed order (the model's state order)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


class JointOrder:
    """Reorders (names, positions) into ``names``' order; extra joints are ignored, missing ones rejected."""

    def __init__(self, names: Sequence[str]):
        names = tuple(names)
        if not names:
            raise ValueError("JointOrder needs at least one joint name")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate joint names in {list(names)}")
        self.names = names
        self._cache: dict[tuple[str, ...], np.ndarray] = {}  # incoming names -> index per target joint

    def index(self, incoming: Sequence[str]) -> np.ndarray:
        key = tuple(incoming)
        idx = self._cache.get(key)
        if idx is None:
            if len(set(key)) != len(key):
                raise ValueError(f"duplicate joint names in message: {list(key)}")
            pos = {n: i for i, n in enumerate(key)}
            missing = [n for n in self.names if n not in pos]
            if missing:
                raise ValueError(f"joint names {missing} missing from message names {list(key)}")
            idx = np.array([pos[n] for n in self.names], dtype=np.int64)
            if len(self._cache) < 64:
                self._cache[key] = idx
        return idx

    def reorder(self, incoming: Sequence[str], values: Sequence[float]) -> np.ndarray:
        """float32 (len(names),) in this order; ValueError on size mismatch, missing joints or NaN."""
        v = np.asarray(values, dtype=np.float64)
        if v.shape != (len(incoming),):
            raise ValueError(f"{len(incoming)} joint names but {v.shape[0] if v.ndim else 0} values")
        out = v[self.index(incoming)]
        bad = [n for n, x in zip(self.names, out) if not np.isfinite(x)]
        if bad:
            raise ValueError(f"non-finite values for joints {bad}")
        return out.astype(np.float32)

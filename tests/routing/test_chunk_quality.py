"""The action-chunk quality definition (the router's calibration label)."""
import math

import numpy as np
import pytest

from edgefm_ros.routing.chunk_quality import chunk_error, chunk_quality


def test_chunk_quality_definition():
    rng = np.random.default_rng()
    ref = rng.normal(0, 1, (50, 6)).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, 6)
    assert chunk_quality(ref, ref) == 1.0
    # an error of one scale unit on every entry: e = 1, scoring exp(-1) at tolerance 1
    off = ref + scale
    assert chunk_error(off, ref, scale) == pytest.approx(1.0)
    assert chunk_quality(off, ref, scale, tolerance=1.0) == pytest.approx(math.exp(-1))
    assert chunk_quality(off, ref, scale, tolerance=0.5) == pytest.approx(math.exp(-4))
    # larger errors score lower; only the executed horizon counts
    q = [chunk_quality(ref + k * rng.normal(0, 0.1, ref.shape), ref) for k in (0.5, 1, 2, 4)]
    assert all(a > b for a, b in zip(q, q[1:]))
    late = ref.copy()
    late[25:] += 10.0
    assert chunk_quality(late, ref, horizon=25) == 1.0 and chunk_quality(late, ref) < 1e-6


def test_chunk_quality_rejects_bad_input():
    rng = np.random.default_rng()
    a = rng.normal(0, 1, (10, 3))
    with pytest.raises(ValueError, match="shapes"):
        chunk_quality(a, a[:, :2])
    with pytest.raises(ValueError, match="scale"):
        chunk_quality(a, a, scale=np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="horizon"):
        chunk_quality(a, a, horizon=11)
    with pytest.raises(ValueError, match="non-finite"):
        chunk_quality(a * np.nan, a)

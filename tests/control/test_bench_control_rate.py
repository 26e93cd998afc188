"""benchmarks/bench_control_rate.py's checks from synthetic records: queue-empty ticks after the warm-up,
frame-to-action latency and late chunks, and the preset/option precedence."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_control_rate.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_control_rate", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_queue_empty_ticks_counts_only_the_window(bench):
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 10.0, 0.02)  # 50 Hz statuses
    holding = t < 2.0  # warm-up: empty before the first chunk
    late = rng.choice(np.flatnonzero(t > 4.0), 7, replace=False)
    holding[late] = True  # the queue ran dry 7 times after the warm-up
    assert bench.queue_empty_ticks(t, holding, 3.0, 9.0) == (int(np.sum(holding[(t >= 3.0) & (t <= 9.0)])),
                                                             int(np.sum((t >= 3.0) & (t <= 9.0))))
    assert bench.queue_empty_ticks(t, holding, 3.0, 9.0)[0] == int(np.sum(t[late] <= 9.0))
    assert bench.queue_empty_ticks(t, np.where(t < 2.0, True, False), 3.0, 9.0)[0] == 0


def test_frame_to_action_first_command_after_arrival_and_late_chunks(bench):
    period, dt, rows = 0.02, 0.02, 50  # chunk 50 at 50 Hz: rows cover 0.98 s
    cmd = 100.0 + np.arange(500) * period + 0.0003  # published just after each tick
    stamp = np.array([100.5, 101.5, 102.5, 103.0])
    # the second's first tick after arrival is its last row's (102.48); the third arrives after its last row: late
    lat = np.array([0.31, 0.97, 1.2, 0.05])
    got, late = bench.frame_to_action(stamp + lat, stamp, rows, dt, cmd, period)
    first = np.ceil((stamp + lat - 100.0) / period) * period + 100.0003  # first tick after arrival
    want = (first - stamp)[[0, 1, 3]]
    assert late == 1
    np.testing.assert_allclose(got, want, atol=1e-9)
    assert np.all(got >= lat[[0, 1, 3]])
    # a chunk arriving after the last command commands nothing: neither measured nor late
    got, late = bench.frame_to_action([111.0], [110.9], rows, dt, cmd, period)
    assert got.size == 0 and late == 0
    # every chunk past on arrival: nothing is ever commanded, all are late (a queue that never fills)
    got, late = bench.frame_to_action(stamp + 1.9, stamp, rows, dt, [], period)
    assert got.size == 0 and late == stamp.size


def test_preset_fills_unset_options_only(bench):
    a = bench.parse(["--preset", "realtime", "--checkpoint", "/ckpt", "--vlm", "/vlm"])
    assert (a.mode, a.chunk_size_threshold, a.duration, a.action_rate_hz) == ("fast", 0.5, 60.0, 50.0)
    a = bench.parse(["--preset", "realtime", "--checkpoint", "/ckpt", "--chunk-size-threshold", "0.7"])
    assert a.chunk_size_threshold == 0.7 and a.mode == "fast"
    a = bench.parse([])  # default use: as before the preset existed
    assert (a.mode, a.chunk_size_threshold, a.action_rate_hz, a.warmup) == ("exact", 1.0, 30.0, 1.0)
    with pytest.raises(SystemExit):
        bench.parse(["--preset", "realtime"])  # no checkpoint

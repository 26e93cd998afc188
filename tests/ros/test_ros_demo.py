"""edgefm-demo end to end on a short synthetic bag: summary numbers and the plot."""
from __future__ import annotations

import json

from replay_helpers import assert_demo_at_rate
from skips import require_module


def test_demo_runs_and_reports(ros, tmp_path, monkeypatch, ros_domain_id, capsys):
    require_module("matplotlib")
    from edgefm_ros.tools import demo

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the demo checkpoint is made afresh
    out = tmp_path / "out"
    rc = demo.main(["bag", "--out", str(out), "--duration", "5", "--width", "96", "--height", "72",
                    "--domain-id", str(ros_domain_id)])
    text = capsys.readouterr().out
    assert rc == 0, text
    s = json.loads((out / "summary.json").read_text())
    assert s["model"]["random_weights"] and "RANDOM WEIGHTS" in text
    assert "make-checkpoint" in s["model"]["origin"]
    assert s["chunks"] >= 3 and set(s["chunk_sources"]) <= {"edge", "edge-fallback"}
    assert_demo_at_rate(s, 50.0)
    o, pre, dec = s["observation_to_chunk_ms"], s["prefill_ms"], s["decode_ms"]
    # every chunk's observation->chunk time holds its prefill and its decode, so each quantile dominates theirs
    assert pre["p50"] > 0 and dec["p50"] > 0
    assert o["p50"] >= max(pre["p50"], dec["p50"]) and o["max"] >= max(pre["max"], dec["max"])
    assert o["p50"] <= o["p99"] <= o["max"]
    # one model, one chunk at a time: half the chunks each took at least p50, within the 5 s run (+1 s slack)
    assert o["p50"] * (s["chunks"] // 2) <= 6000.0, (o, s["chunks"])
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

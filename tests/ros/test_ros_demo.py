"""edgefm-demo end to end on a short synthetic bag: summary numbers and the plot."""
from __future__ import annotations

import json

import pytest


def test_demo_runs_and_reports(ros, tmp_path, monkeypatch, ros_domain_id, capsys):
    pytest.importorskip("matplotlib")
    from edgefm_ros.tools import demo

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the demo checkpoint is made afresh
    out = tmp_path / "out"
    rc = demo.main(["--bag", "--out", str(out), "--duration", "5", "--width", "96", "--height", "72",
                    "--domain-id", str(ros_domain_id)])
    text = capsys.readouterr().out
    assert rc == 0, text
    s = json.loads((out / "summary.json").read_text())
    assert s["model"]["random_weights"] and "RANDOM WEIGHTS" in text
    assert "make-checkpoint" in s["model"]["origin"]
    assert s["chunks"] >= 3 and set(s["chunk_sources"]) <= {"edge", "edge-fallback"}
    assert s["control_rate_hz"] == pytest.approx(50.0, rel=0.02)
    assert s["observation_to_chunk_ms"]["p50"] > 0
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

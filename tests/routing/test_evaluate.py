"""Evaluation baselines on a hand-built log, the plot, and the edgefm-router CLI end to end."""
import json
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.routing.config import DESIGN_NAMES, Candidate, LatencyModel, PolicyConfig, RouterConfig, \
    load_router_config
from edgefm_ros.routing.evaluate import evaluate, plot, weighted_quantile
from edgefm_ros.routing.log import LogRecord, read_log, write_records
from edgefm_ros.tools.router_cli import main

ROOT = Path(__file__).resolve().parents[2]


def cfg() -> RouterConfig:
    """Edge constant 0.5; cloud rises with blur: cloud wins (by far) when blur > 0.5."""
    ce = [0.0] * len(DESIGN_NAMES)
    cc = [0.0] * len(DESIGN_NAMES)
    cc[0], cc[1] = -4.0, 8.0
    edge = Candidate("edge", "m", "bf16", 256, "edge", 0.5, 0.7, latency=LatencyModel(0.2, 0, 0),
                     coefficients=tuple(ce))
    cloud = Candidate("cloud", "m", "fp32", 512, "cloud", 0.5, 0.7, latency=LatencyModel(0.05, 0, 0),
                      coefficients=tuple(cc))
    return RouterConfig(candidates=(edge, cloud), policy=PolicyConfig(edge_only="edge", cloud_only="cloud"))


# request: blur feature, (edge quality, latency, energy), (cloud quality, latency, energy)
TABLE = {
    "r1": (0.9, (1.0, 0.20, 3.0), (1.0, 0.10, 1.0)),
    "r2": (0.9, (0.0, 0.20, 3.0), (1.0, 0.30, 1.0)),
    "r3": (0.1, (1.0, 0.25, 3.0), (0.0, 0.10, 1.0)),
    "r4": (0.1, (0.0, 0.20, 3.0), (1.0, 0.50, 1.0)),
}


def hand_log(extra_random: bool = True) -> list[LogRecord]:
    rng = np.random.default_rng()
    out = []
    for i, (rid, (blur, e, c)) in enumerate(TABLE.items()):
        x = rng.uniform(0, 1, 10) if extra_random else np.zeros(10)
        x[0] = blur  # only blur matters to the coefficients above
        for name, placement, (q, lat, en) in (("edge", "edge", e), ("cloud", "cloud", c)):
            out.append(LogRecord(rid, name, tuple(x), q, lat, en, placement, stamp=float(i), bandwidth_mbps=100.0,
                                 rtt_s=0.02, deadline_s=1.0, upload_bytes=50_000 if placement == "cloud" else 0))
    # a request without the cloud baseline's result is skipped
    out.append(LogRecord("r5", "edge", tuple(rng.uniform(0, 1, 10)), 1.0, 0.2, 3.0, "edge", stamp=9.0))
    return out


def test_baselines_are_exact_on_a_hand_built_log():
    rep = evaluate(cfg(), hand_log())
    assert rep.n_requests == 4 and rep.n_skipped == 1
    e, c, o, r = rep.edge_only, rep.cloud_only, rep.oracle, rep.router
    assert (e.accuracy, e.cloud_share, e.energy_mean_j) == (0.5, 0.0, 3.0)
    assert e.latency_mean_s == pytest.approx(0.2125)
    assert (c.accuracy, c.cloud_share, c.energy_mean_j) == (0.75, 1.0, 1.0)
    assert c.latency_mean_s == pytest.approx(0.25)
    # oracle: r1 tie -> edge, r2 cloud, r3 edge, r4 cloud
    assert (o.accuracy, o.cloud_share) == (1.0, 0.5)
    assert o.latency_mean_s == pytest.approx((0.2 + 0.3 + 0.25 + 0.5) / 4) and o.energy_mean_j == 2.0
    # router: cloud on r1, r2 (blur 0.9), edge on r3, r4
    assert (r.accuracy, r.cloud_share) == (0.75, 0.5)
    assert rep.reasons == {"cloud_gain": 2, "edge_first": 2}
    assert rep.pgr == pytest.approx(1.0) and rep.oracle_gap_recovered == pytest.approx(0.5)
    # random at the router's cloud share (0.5): exact expectations
    assert rep.random.cloud_share == 0.5 and rep.random.accuracy == pytest.approx(0.625)
    assert rep.random.latency_mean_s == pytest.approx(0.5 * 0.2125 + 0.5 * 0.25)
    assert rep.random.energy_mean_j == pytest.approx(2.0)
    curve = sorted(rep.curve)  # by delta_min: the sweep spans every reachable cloud share
    shares = [s for _, s, _ in curve]
    assert shares[0] == 1.0 and shares[-1] == 0.0 and 0.5 in shares
    assert all(a >= b for a, b in zip(shares, shares[1:]))


def test_weighted_quantile():
    rng = np.random.default_rng()
    v = rng.uniform(0, 1, 101)
    assert weighted_quantile(v, np.ones(101), 0.5) == pytest.approx(np.median(v))
    w = np.zeros(101)
    w[7] = 1.0
    assert weighted_quantile(v, w, 0.95) == v[7]


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "q.png"
    plot(evaluate(cfg(), hand_log()), str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_log_round_trip_and_errors(tmp_path):
    recs = hand_log()
    path = tmp_path / "log.jsonl"
    with path.open("w") as f:
        write_records(recs, f)
    back = read_log(path)
    key = [(r.request_id, r.candidate, r.quality) for r in recs]
    assert [(r.request_id, r.candidate, r.quality) for r in back] == key
    np.testing.assert_allclose([r.features for r in back], [r.features for r in recs], atol=1e-6)
    bad = tmp_path / "bad.jsonl"
    line = json.loads(path.read_text().splitlines()[0])
    line["quality"] = 1.7
    bad.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1.*quality"):
        read_log(bad)


def test_cli_synth_calibrate_evaluate(tmp_path, capsys):
    config = str(ROOT / "config" / "router.yaml")
    log, out, png = tmp_path / "s.jsonl", tmp_path / "cal.yaml", tmp_path / "eval.png"
    assert main(["synth-log", "--out", str(log), "--requests", "600", "--config", config]) == 0
    assert main(["calibrate", "--log", str(log), "--out", str(out), "--config", config]) == 0
    text = capsys.readouterr().out
    assert "brier" in text and "disjoint" in text
    cal = load_router_config(out)
    assert all(c.coefficients is not None for c in cal.candidates)
    assert out.read_text().startswith("# Written by edgefm-router calibrate")
    assert main(["evaluate", "--log", str(log), "--config", str(out), "--split", "test", "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "performance gap recovered" in text and "oracle" in text
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["evaluate", "--log", str(tmp_path / "missing.jsonl"), "--config", config]) == 2
    assert "does not exist" in capsys.readouterr().err

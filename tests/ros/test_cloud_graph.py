"""The cloud tier in the ROS graph: the real server (``edgefm-cloud serve``: MLServer + nginx) on loopback,
the real vla_node / action_node / router_node processes, a replayed bag. Cloud chunks arrive and are
recorded; the server is killed mid-run and chunks keep coming from the edge while the control loop stays
on time; shadow mode's log holds exact-parity pairs that the calibration code reads (shadow mode on its own,
without ROS: tests/placement/test_shadow.py)."""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from replay_helpers import (COMMAND_TOPIC, assert_at_rate, assert_demo_at_rate, graph_nodes, node_params, realtime_applied,
                            realtime_expected, record_topics, with_router)

REPO = Path(__file__).resolve().parents[2]
ROUTER_DEMO = REPO / "config" / "router_demo.yaml"
sys.path.insert(0, str(REPO / "tests" / "cloud"))  # cloud_support: the server process helper


def test_vla_params_shadow_needs_cloud_and_log():
    from edgefm_ros.params.vla import VlaNodeConfig

    make_config = VlaNodeConfig.from_values

    base = dict(checkpoint="/m", camera_topics=["/c"], camera_keys=["k"], state_joint_names=["j"])
    with pytest.raises(ValueError, match="cloud_url"):
        make_config({**base, "shadow_fraction": 0.5, "shadow_log": "/tmp/x.jsonl"})
    with pytest.raises(ValueError, match="shadow_log"):
        make_config({**base, "shadow_fraction": 0.5, "cloud_url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="shadow_fraction"):
        make_config({**base, "shadow_fraction": 1.5})
    assert make_config(base).shadow_fraction == 0.0  # off by default


def _play_in_background(session, bag):
    stop = threading.Event()
    player = session.player(bag)
    th = threading.Thread(target=player.play, args=(stop,), daemon=True)
    th.start()
    return stop, th


def _count(session, key: str) -> int:
    return int(float(session.diagnostics("vla_node").get(key, 0)))


def test_cloud_chunks_then_server_killed_edge_takes_over(ros, tiny_model, short_bag, tmp_path, ros_domain_id):
    from cloud_support import ServerProcess, free_port, need_server_deps

    need_server_deps()
    if not with_router():
        pytest.skip("router_node is not installed (run scripts/setup.sh)")
    from edgefm_ros.routing.calibrate import calibrate
    from edgefm_ros.routing.config import load_router_config
    from edgefm_ros.routing.log import read_log
    from edgefm_ros.tools.bag.analyze import command_timing, read_run
    from edgefm_ros.tools.graph import ReplaySession

    ckpt, vlm = tiny_model
    router_cfg = load_router_config(ROUTER_DEMO)
    token = "graph-" + os.urandom(12).hex()
    (tmp_path / "token").write_text(token + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shadow_log = tmp_path / "shadow.jsonl"
    params = node_params(tiny_model, vla=dict(
        cloud_url=url, cloud_deadline_s=0.5, shadow_fraction=1.0, shadow_log=str(shadow_log),
        shadow_edge_candidate=router_cfg.edge_only, shadow_cloud_candidate=router_cfg.cloud_only))
    # delta_min 0: any predicted gain goes to the cloud (both instructions of the bag); a static fast link
    params["router_node"].update(config_path=str(ROUTER_DEMO), static_bandwidth_mbps=100.0, static_rtt_s=0.005,
                                 delta_min=0.0)
    srv = ServerProcess(["--checkpoint", ckpt, "--vlm", vlm, "--mode", "exact", "--device", "cpu", "--threads", "1",
                         "--port", str(port), "--token-file", str(tmp_path / "token")], tmp_path / "cloud.log")
    srv.start()  # loads while the nodes start
    try:
        with ReplaySession(tmp_path / "run", params, graph_nodes(), ros_domain_id, record_topics(),
                           node_env={"vla_node": {"EDGEFM_CLOUD_TOKEN": token}}) as s:
            srv.wait_ready(url, 90)
            s.wait_active(("vla_node", "action_node"), timeout=60)
            stop, th = _play_in_background(s, short_bag)
            assert s.wait_for(lambda: _count(s, "route_cloud") >= 4, 20), s.diagnostics("vla_node")
            t_kill = time.time()
            srv.kill()  # the whole server (supervisor, MLServer, nginx) dies at once
            n_kill = _count(s, "chunks")
            assert s.wait_for(lambda: _count(s, "chunks") >= n_kill + 8, 15), s.diagnostics("vla_node")
            t_end = time.time()
            time.sleep(0.3)
            diag = s.diagnostics("vla_node")
            realtime = realtime_applied(s)
            stop.set()
            th.join(5)
            assert all(s.alive(n) for n in graph_nodes())
    finally:
        srv.kill()
    run = read_run(str(s.record_path), COMMAND_TOPIC)
    src, recv = np.asarray(run.chunk_source), np.asarray(run.chunk_recv)

    # the cloud served chunks, and they were recorded as such
    assert int(np.sum((src == "cloud") & (recv < t_kill))) >= 3, Counter(run.chunk_source)
    # after the kill (+ the answer of a call already in flight): the edge, as a fallback of cloud routes
    after = src[recv > t_kill + 0.5]
    assert len(after) >= 6 and set(after) <= {"edge", "edge-fallback"}, Counter(after)
    assert "edge-fallback" in after and run.routes["cloud"] > 0
    # each failed call fell back to the edge until the failures opened router_node's breaker (its static link
    # still counts them: link.breaker_failures of the router's configuration); then it routes to the edge itself
    n_open = router_cfg.link.breaker_failures
    assert int(diag["route_edge-fallback"]) >= n_open and int(diag["shadow_skipped_cloud_failed"]) >= 1, diag
    assert "edge" in after, Counter(after)

    # the control loop never noticed: on rate, no tick missed, the queue never ran dry
    first = float(recv[0])
    timing = command_timing(run, 1 / 50, first + 0.5, t_end)
    assert_at_rate(timing, 50.0, realtime)
    t, holding = np.asarray(run.status_time), np.asarray(run.status_holding)
    window = (t > first + 1.0) & (t < t_end)
    assert first + 1.0 < t_kill < t_end - 2.0 and window.sum() > 100, (first, t_kill, t_end, window.sum())
    assert not holding[window].any(), f"queue ran empty {holding[window].sum()} times"

    # shadow mode: pairs (served, shadow) of edge and cloud on the same observation and noise; in exact mode
    # with raw images they agree exactly (a pairing with different noise scores ~1e-4 on this model)
    recs = read_log(str(shadow_log))
    by_req: dict[str, list] = {}
    for r in recs:
        by_req.setdefault(r.request_id, []).append(r)
    assert len(by_req) >= 3 and int(diag["shadow_logged"]) == len(by_req)
    assert any(r.served and r.placement == "cloud" for r in recs)
    for rid, pair in by_req.items():
        assert sorted(r.placement for r in pair) == ["cloud", "edge"], rid
        # served as routed: mostly the cloud; the edge while a slow first link sample holds the guard
        assert sum(r.served for r in pair) == 1, rid
        assert {r.candidate for r in pair} == {router_cfg.edge_only, router_cfg.cloud_only}
        q = {r.placement: r.quality for r in pair}
        assert q["cloud"] == 1.0 and q["edge"] > 0.999, (rid, q)
        assert pair[0].features == pair[1].features and all(math.isfinite(x) for x in pair[0].features)
        assert all(r.latency_s > 0 for r in pair) and [r.upload_bytes > 0 for r in pair] == \
            [r.placement == "cloud" for r in pair]
    res = calibrate(router_cfg, recs, test_fraction=0.3)
    assert {r.name for r in res.reports} == {router_cfg.edge_only, router_cfg.cloud_only}
    assert res.n_calib_requests + res.n_test_requests == len(by_req)


def test_demo_with_the_cloud(ros, tiny_model, tmp_path, ros_domain_id, capsys):
    """`edgefm-demo bag --cloud --shadow F`: the long instruction goes to the cloud, the short one stays on
    the edge (config/router_demo.yaml); the summary says where the cloud ran and its round trip."""
    pytest.importorskip("matplotlib")
    from cloud_support import need_server_deps

    need_server_deps()
    if not with_router():
        pytest.skip("router_node is not installed (run scripts/setup.sh)")
    from edgefm_ros.tools import demo

    out = tmp_path / "out"
    rc = demo.main(["bag", "--cloud", "--shadow", "0.5", "--checkpoint", tiny_model[0], "--vlm", tiny_model[1],
                    "--out", str(out), "--duration", "6", "--width", "96", "--height", "72",
                    "--domain-id", str(ros_domain_id)])
    text = capsys.readouterr().out
    assert rc == 0, text
    s = json.loads((out / "summary.json").read_text())
    src, c = s["chunk_sources"], s["cloud"]
    assert set(src) == {"cloud", "edge", "edge-fallback"} and src["cloud"] >= 2 and src["edge"] >= 2, src
    assert s["routes"].get("cloud", 0) > 0 and s["routes"].get("edge", 0) > 0, s["routes"]
    assert c["url"].startswith("http://127.0.0.1:") and "loopback" in c["where"]
    assert 0 < c["round_trip_ms"]["p50"] <= c["round_trip_ms"]["max"] < 500, c  # within vla_node's deadline
    assert int(c["client"]["cloud"]) >= src["cloud"] and "cloud" in c["observation_to_chunk_ms"]
    assert c["shadow"]["requests"] >= 1 and c["shadow"]["edge_quality_mean"] > 0.999, c["shadow"]
    assert s["realtime"] == realtime_expected(), s["realtime"]
    assert_demo_at_rate(s, 50.0)
    assert math.isfinite(s["loop_missed_ticks"]), s  # the loop's own count came through its diagnostics
    assert ("real-time scheduling" if s["realtime"] else "normal scheduling") in text
    assert "cloud trip" in text and c["url"] in text

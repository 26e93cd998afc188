"""The soak's verdict on made-up runs: a steady run passes; a leak of memory, file descriptors, threads or
shared-memory files, a control loop off its period and a drop in success each fail the rule they break."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from edgefm_ros.housekeeping.soak import SoakRules, growth, judge, proc_sample, slope_per_hour, svg

RNG = np.random.default_rng()
PERIOD = 0.05


def steady_run(minutes=60, rss=(600.0, 360.0, 115.0)):
    rows = []
    for m in range(1, minutes + 1):
        nodes = {n: {"rss_mb": base + RNG.normal(0, 0.3), "fds": 37.0, "threads": 20.0}
                 for n, base in zip(("sim_node", "vla_node", "action_node"), rss)}
        rows.append({"t_min": float(m), "nodes": nodes, "shm_files": 50, "shm_mb": 179.0, "rate_hz": 20.0,
                     "period_error_p99_ms": 0.1, "latency_p50_ms": 25.0, "episodes_done": 20,
                     "episodes_success": 19 + int(RNG.integers(0, 2))})
    return rows


def errors(n=20000):
    return np.abs(RNG.normal(0, 0.05, n)).tolist()  # ms


def failed(v):
    return sorted(k for k, (ok, _) in v.items() if not ok)


def test_steady_hour_passes_every_rule():
    v = judge(steady_run(), SoakRules(), PERIOD, errors())
    assert failed(v) == [], v
    g = growth(steady_run(), SoakRules())
    assert all(abs(m["rss_pct_per_h"]) < 1.0 for m in g["nodes"].values())


@pytest.mark.parametrize("node", ["vla_node", "action_node"])
def test_rss_leak_of_a_few_percent_per_hour_fails_its_node(node):
    rows = steady_run()
    for r in rows:
        r["nodes"][node]["rss_mb"] *= 1 + 0.04 * r["t_min"] / 60.0  # 4 %/h
    v = judge(rows, SoakRules(), PERIOD, errors())
    assert failed(v) == [f"{node} RSS"], v


def test_fd_thread_and_shm_leaks_fail():
    rows = steady_run()
    rows[-1]["nodes"]["vla_node"]["fds"] += 1
    rows[-2]["nodes"]["sim_node"]["threads"] += 2
    rows[40]["shm_files"] += 3
    v = judge(rows, SoakRules(), PERIOD, errors())
    assert failed(v) == ["/dev/shm files", "sim_node threads", "vla_node fds"], v
    stale = steady_run()
    stale[30]["shm_stale_new"] = 2  # files no process uses appeared (a participant that died unclean)
    assert failed(judge(stale, SoakRules(), PERIOD, errors())) == ["/dev/shm files"]


def test_period_error_and_success_drop_fail():
    rows = steady_run()
    for r in rows[-10:]:
        r["episodes_success"] = 12  # 60 % against ~97 %
    bad = errors() + [8.0] * 400  # 2 % of the ticks 8 ms off: p99 beyond 10 % of 50 ms
    v = judge(rows, SoakRules(), PERIOD, bad)
    assert failed(v) == ["control p99 period error", "success first vs last"], v


def test_short_run_judged_by_total_growth_and_warmup_ignored():
    rows = steady_run(minutes=3)
    rows[0]["nodes"]["vla_node"]["rss_mb"] += 200  # the warm-up: model load
    rules = SoakRules(warmup_min=1.5)
    assert failed(judge(rows, rules, PERIOD, errors())) == []
    leak = copy.deepcopy(rows)
    leak[-1]["nodes"]["action_node"]["rss_mb"] *= 1.05
    assert failed(judge(leak, rules, PERIOD, errors())) == ["action_node RSS"]


def test_rules_refuse_bad_values_and_helpers_answer():
    with pytest.raises(ValueError, match="warmup_min.*-1"):
        SoakRules(warmup_min=-1)
    assert math.isnan(slope_per_hour([1.0], [2.0]))
    assert slope_per_hour([0.0, 60.0], [1.0, 3.0]) == pytest.approx(2.0)
    me = proc_sample(__import__("os").getpid())
    assert me["rss_mb"] > 1 and me["fds"] >= 3 and me["threads"] >= 1
    assert math.isnan(proc_sample(2 ** 22 + 12345)["rss_mb"])
    text = svg(steady_run(5), "t <1>")
    assert text.startswith("<svg") and text.count("<polyline") == 3 * 3 + 4 and "t &lt;1&gt;" in text

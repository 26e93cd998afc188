"""The cloud server failing mid-run in the routed closed loop (``edgefm-sim route-eval --exec ros --cloud-outage``):
door-close episodes under dark cameras, which router_node sends to the cloud, through the real nodes and
``edgefm-cloud serve`` on loopback. During episode 2 the server's whole process group is

- killed with SIGKILL (a crash); a second later it is started again on the same port and token;
- or stopped with SIGSTOP (a hang: connections are accepted and never answered); 6 s later SIGCONT lets it go on.

Requests fall back to the edge while it is down (at once on a refused connection, at the client's deadline on a
hang), the arm's queue never runs dry, every episode ends, and once the server answers again the circuit breakers
(vla_node's client's, and router_node's, fed by the client's failed calls) let a trial call through and the
episodes go back to the cloud."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from skips import require_material, require_module

REPO = Path(__file__).resolve().parents[2]
EDGE, CLOUD = REPO / "checkpoints" / "smolvla-edge", REPO / "checkpoints" / "smolvla-cloud"
ROUTER = REPO / "config" / "router_sim.yaml"
# door-close seeds that the mixed set draws dark: both policies close the door in the dark, and the router sends
# these episodes to the cloud by their exposure (tests/ros/test_routed_loop.py). About 3 s each on the wall clock
DARK = (1005, 1007, 1012, 1017, 1036, 1037, 1044, 1049, 1061, 1064, 1108, 1133)
KILL_DURING = 2
OUTAGE_S = {"crash": 1.0, "hang": 6.0}  # a hang long enough for three calls to miss the deadline
CLOUD_DEADLINE_S = 1.0  # vla_node's cloud_deadline_s in the routed run (tools/route_ros.routed_params)
BREAKER_COOLDOWN_S = 5.0  # vla_node's cloud client: open this long before a trial call (cloud/breaker.py default)
# router_node's own breaker (config/router_sim.yaml link.breaker_cooldown_s), opened by the client's failed calls:
# while it is open the router sends every request to the edge, so the way back waits for the slower of the two
ROUTER_COOLDOWN_S = 10.0


@pytest.mark.parametrize("kind", ["crash", "hang"])
def test_cloud_failing_mid_run_falls_back_to_the_edge_and_routing_resumes(ros, tmp_path, ros_domain_id, kind):
    require_module("metaworld", "the simulator (metaworld, mujoco) is not installed")
    require_module("mlserver", "the cloud tier needs MLServer (scripts/setup.sh installs it)")
    for p in (EDGE, CLOUD, ROUTER):
        require_material(p.exists(), f"{p} is missing")
    from edgefm_ros.sim.route_eval import RouteEvalConfig
    from edgefm_ros.tools.cloud_outage import CloudOutage, format_outage
    from edgefm_ros.tools.route_ros import run_route_ros

    cfg = RouteEvalConfig(edge=str(EDGE), cloud=str(CLOUD), router=str(ROUTER), tasks=("door-close",), seeds=DARK,
                          conditions="mixed", phrasings="varied", placements=("router",))
    t0 = time.monotonic()
    rep = run_route_ros(cfg, out_dir=tmp_path / "run", domain_id=ros_domain_id, progress=print,
                        fault=CloudOutage(KILL_DURING, OUTAGE_S[kind], kind=kind))
    took = time.monotonic() - t0
    f = rep["fault"]
    print(format_outage(f))

    # the schedule ran: killed during episode 2, ready again on the same port
    assert f["error"] is None, f
    assert math.isfinite(f["killed_at"]) and math.isfinite(f["ready_at"]), f
    phases = [e["phase"] for e in f["episodes"]]
    assert phases[:KILL_DURING] == ["before"] * KILL_DURING, phases  # the kill fell after episode 1 ended

    # the run completed: every episode ended with an outcome, and most closed the door (all 12 on an idle machine)
    eps = rep["episodes"]["router"]
    assert [e["seed"] for e in eps] == list(DARK), eps
    assert sum(e["success"] for e in eps) >= len(DARK) - 2, eps

    # before the kill the dark episodes went to the cloud
    assert f["chunks"]["before"]["cloud"] >= 1, f["chunks"]
    # the fault was seen as what it was and opened vla_node's breaker: a crash fails calls on the connection, a
    # hang only at the client's deadline
    client = f["cloud_client"]
    seen = "fail_connection" if kind == "crash" else "fail_deadline"
    assert int(client.get(seen, 0)) >= 1 and int(client.get("breaker_opened", 0)) >= 1, client
    assert f["kind"] == kind

    # while it was down, chunks kept coming from the edge: each request that was meant for the cloud fell back
    # (a refused connection or an open breaker fails at once, a hung server at the deadline), and every chunk
    # arrived within the queue's slack, so the arm never ran out of actions
    during = f["chunks"]["during"]
    assert during["edge-fallback"] + during["edge"] >= 2, during
    assert during["longest_request_s"] < min(f["slack_s"], CLOUD_DEADLINE_S + 1.0), (during, f["slack_s"])
    # the arm holds only when its queue runs dry: after each episode's first chunk it never waited more than a
    # few control ticks (0 on an idle machine), far below the slack
    assert 0.5 < f["slack_s"], f["slack_s"]
    assert f["longest_hold_s"] <= 0.5, [(e["seed"], e["longest_hold_s"]) for e in f["episodes"]]
    # an episode's first request that meets a hung server waits for the deadline before the edge answers: there
    # the wait is the deadline plus the edge's own first chunk (itself within the slack, as in the crash)
    first_bound = f["slack_s"] if kind == "crash" else CLOUD_DEADLINE_S + f["slack_s"]
    assert max(e["first_chunk_s"] for e in f["episodes"]) < first_bound, \
        [(e["seed"], e["phase"], e["first_chunk_s"]) for e in f["episodes"]]

    # after the restart: the breaker's trial call found the server and closed it; the cloud serves again
    assert client.get("breaker") == "closed", client
    after = [e for e in f["episodes"] if e["phase"] == "after"]
    assert len(after) >= 2, phases
    assert sum(e["chunks"]["cloud"] for e in after) > 0, after
    assert f["first_cloud_after_ready_s"] <= max(BREAKER_COOLDOWN_S, ROUTER_COOLDOWN_S) + f["slack_s"] + 2.0, f
    assert took < 150, f"the run took {took:.0f} s"

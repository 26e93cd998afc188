"""A bandwidth-limited link moves the link estimate and flips the router's bandwidth guard.

The server runs in a network namespace the test creates, reached over a veth pair; a token bucket
(tc tbf) on the robot side's veth limits the upload. Needs root, iproute2 and the sch_tbf qdisc:
skipped otherwise. The estimator and the guard are the router's own (routing.link, routing.router).
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess

import numpy as np
import pytest

from cloud_support import TOKEN, ServerProcess, need_server_deps, random_observation
from edgefm_ros.cloud import CloudPolicy, Encoding

LIMIT_MBIT = 16
GUARD_MBPS, HYSTERESIS_MBPS = 40.0, 10.0


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def netns():
    """(namespace, host-side veth, server address): a /30 link between this namespace and a new one."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root with iproute2 (ip, tc) to build a network namespace")
    tag = f"{os.getpid() % 100000}"
    ns, host_if, ns_if = f"edgefm-bw{tag}", f"efb{tag}h", f"efb{tag}n"
    subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 250)}"
    if _ip("netns", "add", ns).returncode != 0:
        pytest.skip("cannot create a network namespace here (ip netns add failed)")
    try:
        steps = [("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns),
                 ("addr", "add", f"{subnet}.1/30", "dev", host_if), ("link", "set", host_if, "up"),
                 ("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/30", "dev", ns_if),
                 ("netns", "exec", ns, "ip", "link", "set", ns_if, "up"),
                 ("netns", "exec", ns, "ip", "link", "set", "lo", "up")]
        for step in steps:
            r = _ip(*step)
            if r.returncode != 0:
                pytest.skip(f"network namespace set-up failed: ip {' '.join(step)}: {r.stderr.strip()}")
        yield ns, host_if, f"{subnet}.2"
    finally:
        _ip("link", "del", host_if)
        _ip("netns", "del", ns)


def _limit(dev: str, mbit: int | None) -> None:
    if mbit is None:
        subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
        return
    r = subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit", "burst", "32kbit",
                        "latency", "400ms"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"tc tbf qdisc unavailable: {r.stderr.strip()}")


@pytest.fixture(scope="module")
def ns_server(netns, tiny_dirs, tmp_path_factory):
    need_server_deps()
    ns, _, addr = netns
    d = tmp_path_factory.mktemp("cloud-bw")
    (d / "token").write_text(TOKEN)
    port = 18000 + random.randint(0, 999)  # its own namespace: nothing else listens there
    srv = ServerProcess(["--checkpoint", str(tiny_dirs[0]), "--vlm", str(tiny_dirs[1]), "--host", addr,
                         "--port", str(port), "--token-file", str(d / "token")], d / "server.log",
                        prefix=["ip", "netns", "exec", ns])
    srv.url = f"http://{addr}:{port}"
    srv.start().wait_ready(srv.url)
    yield srv
    srv.stop()


def test_bandwidth_limit_moves_estimate_and_flips_guard(netns, ns_server, local_engine, rng):
    from edgefm_ros.routing.link import LinkEstimator
    from edgefm_ros.routing.router import BandwidthGuard

    _, host_if, _ = netns
    link = LinkEstimator()
    guard = BandwidthGuard(GUARD_MBPS, HYSTERESIS_MBPS)
    cloud = CloudPolicy(ns_server.url, TOKEN, link=link)
    obs = random_observation(local_engine.spec, rng, size=(256, 256))  # 2 cameras raw: ~0.5 MB a request

    def calls(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            assert cloud.predict(obs, 10.0, Encoding("raw")).source == "cloud"
            r = cloud.last
            samples.append(r.upload_bytes * 8 / r.upload_s / 1e6)
        return samples

    fast = calls(5)
    now = cloud.clock()
    assert guard.update(link.bandwidth_mbps(now)) is False, (fast, link.bandwidth_mbps(now))
    assert link.bandwidth_mbps(now) > 3 * LIMIT_MBIT

    _limit(host_if, LIMIT_MBIT)
    try:
        slow = calls(5)
    finally:
        _limit(host_if, None)
    now = cloud.clock()
    # each call measured the limited link (to within the token bucket's burst and TCP's ramp-up)
    assert all(0.5 * LIMIT_MBIT <= s <= 1.5 * LIMIT_MBIT for s in slow), slow
    assert link.bandwidth_mbps(now) < GUARD_MBPS
    assert guard.update(link.bandwidth_mbps(now)) is True

    calls(6)  # limit lifted: the estimate recovers above guard + hysteresis and the guard releases
    now = cloud.clock()
    assert link.bandwidth_mbps(now) > GUARD_MBPS + HYSTERESIS_MBPS
    assert guard.update(link.bandwidth_mbps(now)) is False
    assert np.isfinite(link.rtt_s(now))


def test_link_probes_measure_the_limited_link(netns, ns_server):
    """/edgefm/probe uploads (cloud/probe.py) over the token bucket: each measures the limit, and the
    first one turns the unknown estimate into it, before any inference call."""
    from edgefm_ros.cloud.probe import MAX_PROBE_BYTES, probe_link
    from edgefm_ros.cloud.transport import HttpTransport
    from edgefm_ros.routing.link import LinkEstimator

    _, host_if, _ = netns
    link, http = LinkEstimator(), HttpTransport(ns_server.url, TOKEN)
    _limit(host_if, LIMIT_MBIT)
    try:
        samples = []
        for _ in range(4):
            r = probe_link(http, MAX_PROBE_BYTES, 10.0)
            assert r.ok, r
            link.observe(r.upload_bytes, r.upload_s, r.rtt_s, 0.0)
            samples.append(r.mbps)
    finally:
        _limit(host_if, None)
        http.close()
    assert all(0.5 * LIMIT_MBIT <= s <= 1.5 * LIMIT_MBIT for s in samples), samples
    assert 0.5 * LIMIT_MBIT <= link.bandwidth_mbps(0.0) <= 1.5 * LIMIT_MBIT

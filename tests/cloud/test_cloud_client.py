"""Client behaviour against a scripted HTTP stub (stdlib): retries, deadlines, breaker, hedging, link
feed. The real server is exercised in test_cloud_server.py; here each failure mode is forced exactly."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from edgefm_ros.cloud import (BreakerConfig, CircuitBreaker, ClientConfig, CloudDeadlineExceeded, CloudPolicy,
                              CloudRejected, CloudUnavailable, Encoding)
from edgefm_ros.cloud.tasks.vla import encode_response
from edgefm_ros.types import ActionChunk, Observation

SLACK_S = 0.2  # scheduling slack on a shared 2-core machine; the scripted delays are 1 s and more


class Stub:
    """Answers each POST with the next scripted (delay_s, status) and records the bodies it read."""

    def __init__(self, actions: np.ndarray):
        self.script: list[tuple[float, int]] = []
        self.bodies: list[dict] = []
        self.actions = actions
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, b"")

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stub.bodies.append(json.loads(body))
                delay, status = stub.script.pop(0) if stub.script else (0.0, 200)
                time.sleep(delay)
                if status == 200:
                    out = encode_response(stub.actions, "stub", 0, {"server_s": 0.001, "prefill_s": 0.0005})
                    self._send(200, json.dumps(out).encode())
                else:
                    self._send(status, json.dumps({"error": f"scripted {status}"}).encode())

            def _send(self, status, data):
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Recorder:
    """Anything with the LinkEstimator's two report methods."""

    def __init__(self):
        self.ok, self.failures = [], []

    def observe(self, upload_bytes, upload_s, rtt_s, now):
        self.ok.append((upload_bytes, upload_s, rtt_s, now))

    def observe_failure(self, now):
        self.failures.append(now)


@pytest.fixture
def stub(rng):
    s = Stub(rng.standard_normal((8, 6)).astype(np.float32))
    yield s
    s.close()


@pytest.fixture
def obs(rng):
    return Observation({"cam": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)},
                       rng.standard_normal(6).astype(np.float32), "fold the towel", stamp=12.5)


def test_success_feeds_the_link_and_builds_the_chunk(stub, obs):
    link = Recorder()
    cloud = CloudPolicy(stub.url, "t" * 20, link=link, joint_names=tuple(f"j{i}" for i in range(6)))
    chunk = cloud.predict(obs, 2.0, Encoding("raw"), seq=5, dt=0.02)
    np.testing.assert_array_equal(chunk.actions, stub.actions)
    assert (chunk.source, chunk.seq, chunk.dt, chunk.stamp, chunk.model) == ("cloud", 5, 0.02, 12.5, "stub")
    assert chunk.joint_names[0] == "j0" and chunk.prefill_s == 0.0005
    (nbytes, upload_s, rtt_s, _), = link.ok
    assert nbytes > obs.images["cam"].nbytes and upload_s > 0 and rtt_s >= 0
    assert stub.bodies[0]["parameters"]["deadline_s"] <= 2.0 and stub.bodies[0]["parameters"]["seq"] == 5
    assert cloud.healthy()


def test_retry_on_503_only_while_the_deadline_allows(stub, obs):
    link = Recorder()
    cloud = CloudPolicy(stub.url, link=link, config=ClientConfig(latency_alpha=1.0))  # typical = the last call
    stub.script = [(0.0, 503), (0.0, 200)]
    assert cloud.predict(obs, 2.0).source == "cloud" and cloud.last.attempts == 2
    assert len(stub.bodies) == 2 and not link.failures
    # a typical call now takes >= 0.2 s: after a slow 503 there is no time left for another try
    stub.script = [(0.2, 200)]
    cloud.predict(obs, 2.0)
    stub.script = [(0.2, 503), (0.0, 200)]
    with pytest.raises(CloudUnavailable) as e:
        cloud.predict(obs, 0.3)
    assert e.value.reason == "server_error" and e.value.status == 503
    assert len(stub.bodies) == 4 and len(link.failures) == 1
    # with room for it, the same failure is retried
    stub.script = [(0.2, 503), (0.0, 200)]
    assert cloud.predict(obs, 1.0).source == "cloud" and cloud.last.attempts == 2


def test_4xx_is_not_retried_and_does_not_trip_the_breaker(stub, obs):
    cloud = CloudPolicy(stub.url, config=ClientConfig(breaker=BreakerConfig(failures=1)))
    stub.script = [(0.0, 400)] * 3
    for _ in range(3):
        with pytest.raises(CloudRejected, match="scripted 400"):
            cloud.predict(obs, 2.0)
    assert len(stub.bodies) == 3 and cloud.stats()["breaker"] == "closed"


def test_deadline_is_kept_and_the_call_aborted(stub, obs):
    link = Recorder()
    cloud = CloudPolicy(stub.url, link=link)
    stub.script = [(1.5, 200)]
    t0 = time.monotonic()
    with pytest.raises(CloudDeadlineExceeded):
        cloud.predict(obs, 0.2)
    assert 0.2 <= time.monotonic() - t0 <= 0.2 + SLACK_S
    assert len(link.failures) == 1 and cloud.stats()["fail_deadline"] == 1
    with pytest.raises(CloudDeadlineExceeded):
        cloud.predict(obs, 0.0)  # no budget: not even sent
    assert len(stub.bodies) == 1


def test_breaker_opens_probes_and_closes(stub, obs):
    now = [100.0]
    cfg = ClientConfig(max_attempts=1, breaker=BreakerConfig(failures=2, cooldown_s=5.0))
    cloud = CloudPolicy(stub.url, config=cfg, clock=lambda: now[0])
    stub.script = [(0.0, 503)] * 3
    for _ in range(2):
        with pytest.raises(CloudUnavailable):
            cloud.predict(obs, 2.0)
    with pytest.raises(CloudUnavailable) as e:
        cloud.predict(obs, 2.0)
    assert e.value.reason == "breaker_open" and len(stub.bodies) == 2  # not sent
    now[0] += 5.0
    with pytest.raises(CloudUnavailable) as e:  # the probe fails: open again
        cloud.predict(obs, 2.0)
    assert e.value.reason == "server_error" and cloud.stats()["breaker"] == "open"
    now[0] += 5.0
    assert cloud.predict(obs, 2.0).source == "cloud"  # the probe succeeds: closed
    assert cloud.stats()["breaker"] == "closed" and cloud.breaker.opened == 2 and cloud.breaker.closed_again == 1


def test_breaker_state_machine():
    b = CircuitBreaker(BreakerConfig(failures=3, cooldown_s=2.0))
    b.record_failure(0.0)
    b.record_failure(0.1)
    b.record_success()  # consecutive failures only
    b.record_failure(0.2)
    b.record_failure(0.3)
    assert b.allow(0.3) and b.state(0.3) == "closed"
    b.record_failure(0.4)
    assert b.state(0.5) == "open" and not b.allow(2.3)
    assert b.state(2.4) == "half_open" and b.allow(2.4) and not b.allow(2.5)  # one probe only
    b.record_success()
    assert b.state(2.6) == "closed" and b.allow(2.6)
    with pytest.raises(ValueError, match="cooldown_s"):
        BreakerConfig(cooldown_s=0)
    with pytest.raises(ValueError, match="failures"):
        BreakerConfig(failures=0)


def _edge_chunk(rng) -> ActionChunk:
    return ActionChunk(actions=rng.standard_normal((8, 6)).astype(np.float32), dt=0.02, stamp=12.5, source="edge")


def test_fallback_and_hedging(stub, obs, rng):
    cloud = CloudPolicy(stub.url)
    edge_calls = []
    local = _edge_chunk(rng)

    def edge():
        edge_calls.append(time.monotonic())
        time.sleep(0.05)
        return local

    # hedged, cloud in time: the cloud chunk wins although the edge ran too
    assert cloud.predict_or_edge(obs, 1.0, edge, hedge=True).source == "cloud" and len(edge_calls) == 1
    # not hedged, cloud in time: the edge does not run
    assert cloud.predict_or_edge(obs, 1.0, edge).source == "cloud" and len(edge_calls) == 1
    # not hedged, cloud late: the cloud gets deadline - reserve, then the edge runs
    stub.script = [(1.0, 200)]
    t0 = time.monotonic()
    chunk = cloud.predict_or_edge(obs, 0.3, edge, edge_reserve_s=0.1)
    assert chunk.source == "edge-fallback" and np.array_equal(chunk.actions, local.actions)
    assert 0.2 <= edge_calls[-1] - t0 <= 0.2 + SLACK_S, edge_calls[-1] - t0
    # hedged, cloud late: the edge started at once
    stub.script = [(1.0, 200)]
    t0 = time.monotonic()
    chunk = cloud.predict_or_edge(obs, 0.3, edge, hedge=True)
    assert chunk.source == "edge-fallback" and edge_calls[-1] - t0 < SLACK_S, edge_calls[-1] - t0
    assert time.monotonic() - t0 <= 0.3 + SLACK_S, time.monotonic() - t0
    st = cloud.stats()
    assert st["cloud"] == 2 and st["edge-fallback"] == 2 and st["fallback_deadline"] == 2, st


def test_bad_inputs_are_value_errors(stub, obs):
    with pytest.raises(ValueError, match="cloud url"):
        CloudPolicy("ftp://x")
    with pytest.raises(ValueError, match="deadline_s"):
        CloudPolicy(stub.url).predict(obs, float("nan"))
    with pytest.raises(ValueError, match="max_attempts"):
        ClientConfig(max_attempts=0)

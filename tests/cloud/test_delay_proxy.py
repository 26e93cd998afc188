"""The delaying TCP proxy (cloud/delay_proxy.py) between real sockets: a stdlib HTTP server on loopback and
clients through the proxy. Timing bounds are lower bounds from the link model (what the proxy must at least
add) and loose upper bounds (what a pipeline allows and holding each chunk for the delay would exceed)."""
from __future__ import annotations

import http.client
import logging
import os
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgefm_ros.cloud.cli import main as cloud_main
from edgefm_ros.cloud.delay_proxy import ByteCounts, DelayProxy, LinkShape

DOWNLOAD_BYTES = 4_000_000


class Handler(BaseHTTPRequestHandler):
    """POST echoes the body; GET /big answers DOWNLOAD_BYTES; GET / answers 'ok'. Keep-alive (HTTP/1.1)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes: no 40 ms delayed-ACK stall between them

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802 (http.server's name)
        self._answer(self.rfile.read(int(self.headers["Content-Length"])))

    def do_GET(self):  # noqa: N802
        self._answer(b"\x5a" * DOWNLOAD_BYTES if self.path == "/big" else b"ok")

    def log_message(self, *args):
        pass


def start_server(port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def server():
    s = start_server()
    yield s
    s.shutdown()
    s.server_close()


def url_of(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    conn.request(method, path, body=body)
    data = conn.getresponse().read()
    return time.perf_counter() - t0, data


def connection(proxy: DelayProxy) -> http.client.HTTPConnection:
    host, port = proxy.address
    return http.client.HTTPConnection(host, port, timeout=10)


def median_round_trip(proxy: DelayProxy, n: int = 5) -> float:
    conn = connection(proxy)
    try:
        request(conn, "GET", "/")  # opens the connection
        return statistics.median(request(conn, "GET", "/")[0] for _ in range(n))
    finally:
        conn.close()


def test_round_trip_grows_by_the_configured_rtt(server):
    rtt = 0.060
    with DelayProxy(url_of(server), LinkShape(rtt_ms=0)) as plain:
        base = median_round_trip(plain)
    with DelayProxy(url_of(server), LinkShape(rtt_ms=rtt * 1e3)) as delayed:
        slow = median_round_trip(delayed)
    added = slow - base
    assert added >= 0.9 * rtt, (base, slow)
    assert added <= 1.5 * rtt + 0.02, (base, slow)  # loose: a shared machine


def test_paced_upload_takes_its_size_over_the_rate(server):
    n, rate = 400_000, 20.0
    body = os.urandom(n)
    with DelayProxy(url_of(server), LinkShape(rtt_ms=0, rate_mbps=rate)) as proxy:
        conn = connection(proxy)
        request(conn, "GET", "/")
        elapsed, echoed = request(conn, "POST", "/", body)
        conn.close()
    assert echoed == body  # order and content kept through the chunks
    serial = n * 8 / (rate * 1e6)  # 160 ms up; the echo comes back at the same rate
    assert elapsed >= 2 * serial, elapsed
    assert elapsed <= 2 * serial + 0.5, elapsed


@pytest.mark.parametrize("rate", [None, 40.0])
def test_pipeline_keeps_throughput(server, rate):
    """A 4 MB download with 100 ms RTT: about the delay plus size/rate, not one delay per chunk (the proxy reads
    at most 64 KiB at once unpaced, 10 kB paced at 40 Mbit/s: 60 / 400 chunks, 3 s / 20 s if each waited)."""
    rtt = 0.100
    with DelayProxy(url_of(server), LinkShape(rtt_ms=rtt * 1e3, rate_mbps=rate)) as proxy:
        conn = connection(proxy)
        request(conn, "GET", "/")
        elapsed, data = request(conn, "GET", "/big")
        conn.close()
    assert len(data) == DOWNLOAD_BYTES
    expected = rtt + (0.0 if rate is None else DOWNLOAD_BYTES * 8 / (rate * 1e6))
    assert elapsed >= expected, elapsed
    assert elapsed <= expected + 0.8, elapsed


def test_byte_counts_are_exact(server):
    body = os.urandom(123_457)
    req = (f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    received = []
    with DelayProxy(url_of(server), LinkShape(rtt_ms=10, rate_mbps=100)) as proxy:
        assert proxy.counts() == ByteCounts()
        for _ in range(2):
            with socket.create_connection(proxy.address, timeout=10) as s:
                s.sendall(req)
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            received.append(b"".join(chunks))
        counts = proxy.counts()
    assert all(r.endswith(body) for r in received)
    assert counts.up == 2 * len(req)
    assert counts.down == sum(len(r) for r in received)
    assert (counts.connections, counts.refused) == (2, 0)


@pytest.mark.parametrize("kwargs, bad", [({"rtt_ms": -1.0}, "-1.0"), ({"rtt_ms": float("nan")}, "nan"),
                                         ({"rtt_ms": "40"}, "'40'"), ({"rate_mbps": 0.0}, "0.0"),
                                         ({"rate_mbps": -20}, "-20"), ({"rate_mbps": float("inf")}, "inf")])
def test_bad_link_shape_names_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))} .*got {bad}"):
        LinkShape(**kwargs)


@pytest.mark.parametrize("target, port, bad", [("ftp://127.0.0.1:21", 0, "ftp"), ("http://", 0, "http://"),
                                               ("127.0.0.1", 0, "127.0.0.1"), ("http://127.0.0.1:80", 70000, "70000")])
def test_bad_proxy_arguments_name_the_value(target, port, bad):
    with pytest.raises(ValueError, match=bad):
        DelayProxy(target, LinkShape(), port=port)


def test_cli_rejects_a_bad_value_in_one_line(capsys):
    assert cloud_main(["delay-proxy", "--target", "http://127.0.0.1:8080", "--rtt-ms", "-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgefm-cloud delay-proxy: error:") and "-5" in err and "\n" not in err


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_stop_closes_every_socket_and_joins_the_thread():
    target = socket.create_server(("127.0.0.1", 0))  # connections wait in its backlog: no fd of ours
    threads, fds = set(threading.enumerate()), open_fds()
    proxy = DelayProxy(f"127.0.0.1:{target.getsockname()[1]}", LinkShape(rtt_ms=20)).start()
    address = proxy.address
    client = socket.create_connection(address, timeout=5)
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")  # in flight at stop
    deadline = time.monotonic() + 5
    while proxy.counts().connections < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.counts().connections == 1
    proxy.stop()
    assert set(threading.enumerate()) == threads
    try:
        assert client.recv(10) == b""  # the proxy closed its side
    except ConnectionResetError:
        pass
    client.close()
    assert open_fds() == fds
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5).close()
    proxy.stop()  # again: nothing to do
    target.close()


def test_a_refused_target_closes_the_client_and_the_proxy_keeps_serving(caplog):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # nothing listens there once closed
    caplog.set_level(logging.WARNING, logger="edgefm_ros.cloud.delay_proxy")
    with DelayProxy(f"http://127.0.0.1:{port}", LinkShape(rtt_ms=10)) as proxy:
        with socket.create_connection(proxy.address, timeout=5) as c:
            try:
                c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert c.recv(10) == b""
            except (ConnectionResetError, BrokenPipeError):
                pass
        assert proxy.counts().refused == 1
        assert "did not accept" in caplog.text
        server = start_server(port)  # the target comes up: the same proxy forwards to it
        try:
            conn = connection(proxy)
            assert request(conn, "GET", "/")[1] == b"ok"
            conn.close()
        finally:
            server.shutdown()
            server.server_close()
        assert proxy.counts().connections == 1


def test_handshake_charges_one_round_trip_per_new_connection(server):
    rtt = 0.060
    with DelayProxy(url_of(server), LinkShape(rtt_ms=rtt * 1e3, handshake=True)) as proxy:
        firsts, laters = [], []
        for _ in range(3):
            conn = connection(proxy)
            firsts.append(request(conn, "GET", "/")[0])  # a new connection: handshake + request
            laters += [request(conn, "GET", "/")[0] for _ in range(3)]  # keep-alive: the request only
            conn.close()
    first, later = statistics.median(firsts), statistics.median(laters)
    assert later >= 0.9 * rtt and first >= later + 0.9 * rtt, (firsts, laters)
    assert first <= 2 * rtt + 0.5 * rtt + 0.03, firsts


def test_jitter_spreads_round_trips_and_keeps_the_order(server):
    jitter = 0.080
    with DelayProxy(url_of(server), LinkShape(rtt_ms=0, jitter_ms=jitter * 1e3)) as proxy:
        conn = connection(proxy)
        request(conn, "GET", "/")
        trips = [request(conn, "GET", "/")[0] for _ in range(16)]
        body = os.urandom(600_000)  # ten chunks or more, each with its own delay: still in order
        _, echoed = request(conn, "POST", "/", body)
        conn.close()
    assert echoed == body
    # each small round trip adds two draws in [0, jitter]: mean jitter, spread well above a loopback's
    assert 0.4 * jitter <= statistics.mean(trips) <= 1.6 * jitter + 0.02, trips
    assert max(trips) - min(trips) >= 0.25 * jitter, trips
    assert max(trips) <= 2 * jitter + 0.05, trips


def test_lost_chunks_arrive_one_retransmission_late(server):
    shape = LinkShape(rtt_ms=10, loss=0.5, seed=int.from_bytes(os.urandom(4), "little"))
    with DelayProxy(url_of(server), shape) as proxy:
        conn = connection(proxy)
        trips = [request(conn, "GET", "/") for _ in range(12)]
        body = os.urandom(300_000)
        _, echoed = request(conn, "POST", "/", body)
        conn.close()
        counts = proxy.counts()
    assert all(data == b"ok" for _, data in trips) and echoed == body
    slow = sum(t >= shape.retransmit_s for t, _ in trips)
    fast = sum(t < shape.retransmit_s * 0.9 for t, _ in trips)
    assert slow + fast == len(trips), [t for t, _ in trips]  # one or the other, nothing half-late
    # each slow request lost at least one chunk; at 50% of two chunks or more, most requests lose one
    assert 3 <= slow <= counts.lost, (slow, counts)
    assert max(t for t, _ in trips) <= 3 * shape.retransmit_s + 0.1


@pytest.mark.parametrize("kwargs, bad", [({"jitter_ms": -1.0}, "-1.0"), ({"jitter_ms": float("nan")}, "nan"),
                                         ({"loss": 1.0}, "1.0"), ({"loss": -0.1}, "-0.1"), ({"loss": "0.1"}, "'0.1'"),
                                         ({"handshake": 1}, "1"), ({"seed": 1.5}, "1.5")])
def test_bad_impairment_names_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))} .*got {bad}"):
        LinkShape(**kwargs)

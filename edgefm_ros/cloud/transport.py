"""HTTP/1.1 (optionally TLS) to the cloud server, with kept-alive connections and link measurements.

Each exchange reports what the link estimator needs: bytes sent, when the body was handed to the
kernel, when the response head arrived, and the kernel's RTT of the connection (TCP_INFO, Linux): the
minimum RTT seen, i.e. the path without queueing; the smoothed RTT would count the queue our own
upload builds on a slow link as round-trip time, not as upload time. A call in flight can be aborted
from another thread (the deadline), which closes its socket.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

# struct tcp_info (linux/tcp.h): 8 one-byte fields, then u32s: tcpi_rtt (us) at 68, tcpi_min_rtt (us, Linux 4.6+) at 148
TCPI_RTT_OFFSET, TCPI_MIN_RTT_OFFSET = 68, 148


@dataclass(frozen=True)
class Exchange:
    status: int
    body: bytes
    sent_bytes: int  # request line + headers + body
    send_s: float  # start -> body handed to the kernel
    head_s: float  # start -> response status line and headers read
    total_s: float  # start -> response body read
    tcp_rtt_s: float | None  # the kernel's minimum (else smoothed) RTT of this connection (None: not available)


def tcp_rtt_s(sock: socket.socket | None) -> float | None:
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    if len(info) >= TCPI_MIN_RTT_OFFSET + 4:
        min_rtt = struct.unpack_from("I", info, TCPI_MIN_RTT_OFFSET)[0]
        if 0 < min_rtt < 0xFFFFFFFF:
            return min_rtt * 1e-6
    if len(info) < TCPI_RTT_OFFSET + 4:
        return None
    return struct.unpack_from("I", info, TCPI_RTT_OFFSET)[0] * 1e-6


class Call:
    """One exchange in flight; ``abort()`` from any thread closes its connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self.aborted = False

    def attach(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self.aborted:
                raise ConnectionAbortedError("call aborted before it was sent")
            self._conn = conn

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HttpTransport:
    def __init__(self, url: str, token: str | None = None, ca_file: str | None = None, max_idle: int = 4):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cloud url must be http(s)://host[:port], got {url!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.max_idle = max_idle
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        if self._ssl is not None:
            return http.client.HTTPSConnection(self.host, self.port, context=self._ssl)
        return http.client.HTTPConnection(self.host, self.port)  # request() sets the timeout per call

    def _release(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        with self._lock:
            if reusable and len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def request(self, method: str, path: str, body: bytes | None, timeout_s: float, call: Call | None = None,
                content_type: str = "application/json") -> Exchange:
        """One HTTP exchange; raises OSError/http.client.HTTPException on transport failure."""
        conn = self._connect()
        if call is not None:
            call.attach(conn)
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = content_type
        ok = False
        try:
            conn.timeout = max(timeout_s, 1e-3)
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
            t0 = time.perf_counter()
            conn.request(method, self.prefix + path, body=body, headers=headers)
            t_sent = time.perf_counter()
            resp = conn.getresponse()
            t_head = time.perf_counter()
            data = resp.read()
            t_done = time.perf_counter()
            rtt = tcp_rtt_s(conn.sock)
            ok = not resp.will_close
            head_bytes = len(method) + len(path) + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 64
            return Exchange(resp.status, data, head_bytes + len(body or b""), t_sent - t0, t_head - t0,
                            t_done - t0, rtt)
        finally:
            self._release(conn, ok and not (call is not None and call.aborted))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

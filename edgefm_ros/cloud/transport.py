"""HTTP/1.1 (optionally TLS) to the cloud server, with kept-alive connections and link measurements.

Each exchange reports what the link estimator needs: bytes sent, when the body was handed to the
kernel, when the response head arrived, and the kernel's RTT of the connection (TCP_INFO, Linux): the
minimum RTT seen, i.e. the path without queueing; the smoothed RTT would count the queue our own
upload builds on a slow link as round-trip time, not as upload time. A call in flight can be aborted
from another thread (the deadline), which closes its socket.

``request`` reads the whole response; ``stream`` returns at the response head and hands out the body's
Server-Sent Events one at a time (``Streamed.events``), for answers that arrive token by token.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Iterator
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

    def _send(self, method: str, path: str, body: bytes | None, timeout_s: float, call: Call | None,
              content_type: str, accept: str | None):
        """Sends a request on a kept-alive (or new) connection and reads the response head.
        -> (conn, resp, sent_bytes, send_s, head_s); on failure the connection is closed and the error raised."""
        conn = self._connect()
        try:
            if call is not None:
                call.attach(conn)
            headers = dict(self._headers)
            if body is not None:
                headers["Content-Type"] = content_type
            if accept:
                headers["Accept"] = accept
            conn.timeout = max(timeout_s, 1e-3)
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
            t0 = time.perf_counter()
            conn.request(method, self.prefix + path, body=body, headers=headers)
            t_sent = time.perf_counter()
            resp = conn.getresponse()
            t_head = time.perf_counter()
        except BaseException:
            conn.close()
            raise
        head_bytes = len(method) + len(path) + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 64
        return conn, resp, head_bytes + len(body or b""), t_sent - t0, t_head - t0

    def request(self, method: str, path: str, body: bytes | None, timeout_s: float, call: Call | None = None,
                content_type: str = "application/json") -> Exchange:
        """One HTTP exchange; raises OSError/http.client.HTTPException on transport failure."""
        t0 = time.perf_counter()
        conn, resp, sent, send_s, head_s = self._send(method, path, body, timeout_s, call, content_type, None)
        ok = False
        try:
            data = resp.read()
            t_done = time.perf_counter()
            rtt = tcp_rtt_s(conn.sock)
            ok = not resp.will_close
            return Exchange(resp.status, data, sent, send_s, head_s, t_done - t0, rtt)
        finally:
            self._release(conn, ok and not (call is not None and call.aborted))

    def stream(self, method: str, path: str, body: bytes | None, timeout_s: float, call: Call | None = None,
               content_type: str = "application/json") -> "Streamed":
        """Sends the request and returns at the response head; read the body with ``Streamed.events()``
        (or ``read()``), then ``close()``. ``timeout_s`` bounds each socket read, not the whole stream."""
        conn, resp, sent, send_s, head_s = self._send(method, path, body, timeout_s, call, content_type,
                                                      "text/event-stream")
        return Streamed(self, conn, resp, call, sent, send_s, head_s, tcp_rtt_s(conn.sock))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


class Streamed:
    """A response being read: the head is in (``status``, timings as in Exchange), the body follows."""

    def __init__(self, transport: HttpTransport, conn, resp, call: Call | None, sent_bytes: int, send_s: float,
                 head_s: float, rtt: float | None):
        self._transport, self._conn, self._resp, self._call = transport, conn, resp, call
        self.status, self.sent_bytes, self.send_s, self.head_s, self.tcp_rtt_s = resp.status, sent_bytes, send_s, \
            head_s, rtt
        self._closed = False

    def read(self) -> bytes:
        """The whole (remaining) body, e.g. the error text of a non-200 answer."""
        return self._resp.read()

    def events(self) -> Iterator[bytes]:
        """The ``data`` of each Server-Sent Event as it arrives (multi-line data joined by newlines);
        ends when the body ends. A body cut off mid-event raises http.client.IncompleteRead/OSError."""
        data: list[bytes] = []
        while True:
            line = self._resp.readline(1 << 24)
            if not line:
                if data:
                    raise http.client.IncompleteRead(b"\n".join(data))
                return
            line = line.rstrip(b"\r\n")
            if not line:  # blank line: the event is complete
                if data:
                    yield b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # other fields (event:, id:, retry:) and comments (":...") are not used

    def close(self) -> None:
        """Releases the connection: kept alive only when the body was read to its end."""
        if self._closed:
            return
        self._closed = True
        done = self._resp.isclosed() and not self._resp.will_close
        self._transport._release(self._conn, done and not (self._call is not None and self._call.aborted))

"""A TCP proxy that gives a loopback connection a link's round trip and rate (this kernel has no ``netem``).

    with DelayProxy("http://127.0.0.1:8080", LinkShape(rtt_ms=40, rate_mbps=20)) as proxy:
        policy = CloudPolicy(proxy.url, token)   # each request/response: +40 ms, each direction at 20 Mbit/s
        ...
        proxy.counts()                           # ByteCounts(up=..., down=..., connections=..., refused=...)

It listens on 127.0.0.1 (port 0: a free port) and opens one connection to the target per accepted connection.
Each direction is a pipeline: a chunk read at ``t`` is written at ``t + rtt/2`` while the next chunks are
read, so the delay adds latency without cutting throughput. With a rate, each direction is also a serialising
link (a token bucket without burst): a chunk of ``n`` bytes leaves ``n * 8 / rate`` after the previous one
left, or after it was read if the link was idle, then travels ``rtt/2``. A 400 kB upload at 20 Mbit/s thus
takes 160 ms plus the one-way delay. Up to ``QUEUE_CHUNKS`` chunks wait per direction (the link's buffer);
beyond that the proxy stops reading, and TCP holds the sender back.

Optional impairments (``LinkShape``), drawn from the proxy's own seeded generator:

- ``handshake``: a new connection's first bytes wait one extra round trip, as TCP's SYN / SYN-ACK would make
  the client wait before it could send (once per connection; HTTP keep-alive pays it once);
- ``jitter_ms``: each chunk's one-way delay grows by a uniform draw in [0, jitter]. Delivery stays in order, as
  TCP's is: a chunk never overtakes the one before it, so a message waits for its slowest chunk so far;
- ``loss``: each chunk is lost with this probability and arrives one retransmission timeout later
  (``RTO_MIN_S``, Linux's 200 ms floor, plus the round trip), holding the chunks behind it. This is TCP's
  recovery seen from the application, not a packet-level model: no congestion window, no fast retransmit.

The client's kernel sees a loopback peer, so TCP_INFO's RTT of a proxied connection stays the loopback's.

Bytes are counted when the proxy forwards them, up (client -> target) and down, per proxy, readable from any
thread (``counts()``). A connection the target refuses is closed on the client's side and logged; the proxy
keeps serving. The event loop runs on a daemon thread between ``start()`` and ``stop()`` (or the ``with``
block); ``stop()`` closes the listening socket and every connection and joins the thread.

``edgefm-cloud delay-proxy --target URL --rtt-ms 40 [--rate-mbps 20]`` runs one by hand (cloud/cli.py).
"""
from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

QUEUE_CHUNKS = 64  # chunks held per direction before the proxy stops reading (backpressure)
MAX_CHUNK = 64 * 1024  # bytes read at once
PACED_CHUNK_S = 0.002  # with a rate: read at most this much of the link's time at once (smooth pacing)
CONNECT_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
DEFAULT_PORTS = {"http": 80, "https": 443}
RTO_MIN_S = 0.2  # Linux's minimum TCP retransmission timeout: what a lost segment costs at least


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class LinkShape:
    """The link the proxy imposes: round trip added (ms, split evenly between the directions) and each
    direction's rate (Mbit/s; None: not paced)."""

    rtt_ms: float = 0.0
    rate_mbps: float | None = None
    jitter_ms: float = 0.0  # extra one-way delay per chunk, uniform in [0, jitter_ms]
    loss: float = 0.0  # probability that a chunk is lost and retransmitted after RTO_MIN_S + the round trip
    handshake: bool = False  # a new connection's first bytes wait one more round trip
    seed: int | None = None  # the jitter and loss draws (None: from the OS)

    def __post_init__(self) -> None:
        if not (_number(self.rtt_ms) and self.rtt_ms >= 0):
            raise ValueError(f"rtt_ms must be a finite number of ms >= 0, got {self.rtt_ms!r}")
        if self.rate_mbps is not None and not (_number(self.rate_mbps) and self.rate_mbps > 0):
            raise ValueError(f"rate_mbps must be a finite number of Mbit/s > 0 or None, got {self.rate_mbps!r}")
        if not (_number(self.jitter_ms) and self.jitter_ms >= 0):
            raise ValueError(f"jitter_ms must be a finite number of ms >= 0, got {self.jitter_ms!r}")
        if not (_number(self.loss) and 0 <= self.loss < 1):
            raise ValueError(f"loss must be a probability in [0, 1), got {self.loss!r}")
        if not isinstance(self.handshake, bool):
            raise ValueError(f"handshake must be a bool, got {self.handshake!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and not isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")

    @property
    def retransmit_s(self) -> float:
        """What a lost chunk adds: the retransmission timeout's floor plus the round trip."""
        return RTO_MIN_S + self.rtt_ms / 1e3

    def describe(self) -> str:
        rate = "unpaced" if self.rate_mbps is None else f"{self.rate_mbps:g} Mbit/s"
        text = f"rtt {self.rtt_ms:g} ms, rate {rate}"
        if self.jitter_ms:
            text += f", jitter {self.jitter_ms:g} ms"
        if self.loss:
            text += f", loss {self.loss:.2%}"
        if self.handshake:
            text += ", handshake"
        return text

    @property
    def one_way_delay_s(self) -> float:
        return self.rtt_ms / 2e3

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.rate_mbps is None else self.rate_mbps * 1e6 / 8.0

    @property
    def chunk_bytes(self) -> int:
        """Bytes read at once: up to 2 ms of the link's time when paced (at least 1 kB), else MAX_CHUNK."""
        bps = self.bytes_per_s
        return MAX_CHUNK if bps is None else max(1024, min(MAX_CHUNK, int(bps * PACED_CHUNK_S)))


@dataclass(frozen=True)
class ByteCounts:
    """Bytes forwarded so far: up (client -> target) and down; connections forwarded and refused by the target."""

    up: int = 0
    down: int = 0
    connections: int = 0
    refused: int = 0
    lost: int = 0  # chunks held back one retransmission timeout (LinkShape.loss)


def add_impairment_args(parser, prefix: str = "") -> None:
    """``--jitter-ms``, ``--loss`` and ``--handshake`` (LinkShape's impairments) on an argparse parser, their
    help text after ``prefix`` (a CLI where only some runs have a proxy says which)."""
    parser.add_argument("--jitter-ms", type=float, default=0.0, help=f"{prefix}extra one-way delay per chunk, "
                        "uniform in [0, JITTER], delivered in order (default 0)")
    parser.add_argument("--loss", type=float, default=0.0, help=f"{prefix}probability that a chunk is lost and "
                        "arrives one retransmission timeout (200 ms + RTT) late, as TCP recovers it (default 0)")
    parser.add_argument("--handshake", action="store_true", help=f"{prefix}a new connection's first bytes wait "
                        "one more RTT (TCP's handshake)")


def split_target(target: str) -> tuple[str, str, int]:
    """``http(s)://host:port[/path]`` or ``host:port`` -> (scheme or '', host, port); ValueError naming it."""
    text = target if "://" in target else f"//{target}"
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    scheme = parts.scheme if "://" in target else ""
    if scheme and scheme not in DEFAULT_PORTS:
        raise ValueError(f"target {target!r}: the scheme must be http or https, got {scheme!r}")
    port = port if port is not None else DEFAULT_PORTS.get(scheme)
    if not host or port is None:
        raise ValueError(f"target {target!r}: expected http(s)://HOST[:PORT] or HOST:PORT")
    return scheme, host, port


class DelayProxy:
    """See the module's docstring. ``target``: the URL (or ``host:port``) to forward to."""

    def __init__(self, target: str, shape: LinkShape = LinkShape(), host: str = "127.0.0.1", port: int = 0):
        if not isinstance(shape, LinkShape):
            raise ValueError(f"shape must be a LinkShape, got {shape!r}")
        if not (isinstance(port, int) and 0 <= port <= 65535):
            raise ValueError(f"port must be 0 (a free port) to 65535, got {port!r}")
        self.target = target
        self.scheme, self.target_host, self.target_port = split_target(target)
        self.shape = shape
        self.host, self._port = host, port
        self._lock = threading.Lock()
        self._up = self._down = self._connections = self._refused = self._lost = 0
        self._rng = random.Random(shape.seed)  # used on the loop's thread only
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._address: tuple[str, int] | None = None
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------------------------------- public

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the proxy listens on (after ``start()``)."""
        if self._address is None:
            raise RuntimeError("the delay proxy is not running")
        return self._address

    @property
    def url(self) -> str:
        """The target's URL with the proxy's address (same scheme and path): what a client should use."""
        host, port = self.address
        if not self.scheme:
            return f"{host}:{port}"
        parts = urlsplit(self.target)
        return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, parts.query, parts.fragment))

    def counts(self) -> ByteCounts:
        with self._lock:
            return ByteCounts(self._up, self._down, self._connections, self._refused, self._lost)

    def start(self) -> "DelayProxy":
        if self._thread is not None:
            raise RuntimeError("the delay proxy is already running")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=f"delay-proxy->{self.target_host}:{self.target_port}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:  # e.g. the port is taken
            self._thread.join()
            self._thread = None
            raise self._error
        log.info("delay proxy %s:%d -> %s:%d (%s)", *self._address, self.target_host, self.target_port,
                 self.shape.describe())
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection, and join the loop's thread (idempotent)."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop already ended
                pass
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"the delay proxy's thread did not end within {STOP_TIMEOUT_S:g} s")
        self._thread = self._loop = self._stopping = None
        self._address = None

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --------------------------------------------------------------------------------------- the loop

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001 -- handed to start() (before ready) or logged
            if not self._ready.is_set():
                self._error = e
            else:
                log.exception("delay proxy: the event loop failed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.host, self._port)
        self._address = server.sockets[0].getsockname()[:2]
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    def _count(self, direction: str, n: int) -> None:
        with self._lock:
            if direction == "up":
                self._up += n
            else:
                self._down += n

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        peer = cwriter.get_extra_info("peername")
        twriter = None
        stopped = False
        try:
            try:
                treader, twriter = await asyncio.wait_for(
                    asyncio.open_connection(self.target_host, self.target_port), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as e:
                with self._lock:
                    self._refused += 1
                log.warning("delay proxy: %s:%d did not accept the connection from %s (%s); closed it",
                            self.target_host, self.target_port, peer, str(e) or type(e).__name__)
                return
            with self._lock:
                self._connections += 1
            up_q: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
            down_q: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
            # with a handshake, the client could not have sent before SYN and SYN-ACK went both ways
            opened = asyncio.get_running_loop().time() + (self.shape.rtt_ms / 1e3 if self.shape.handshake else 0.0)
            parts = [asyncio.create_task(self._read(creader, up_q, opened)),
                     asyncio.create_task(self._deliver(up_q, twriter, "up")),
                     asyncio.create_task(self._read(treader, down_q)),
                     asyncio.create_task(self._deliver(down_q, cwriter, "down"))]
            try:  # each part ends on its own: a direction ends at its end of stream or its peer's failure
                await asyncio.gather(*parts)
            finally:
                for t in parts:
                    t.cancel()
                await asyncio.gather(*parts, return_exceptions=True)
        except asyncio.CancelledError:
            # only stop() cancels a connection; ending normally keeps asyncio's server callback (3.11) from
            # logging the cancelled task as an error
            stopped = True
        finally:
            for w in (twriter, cwriter):
                if w is None:
                    continue
                if stopped:  # at once: close() would wait for the peer to read what is still buffered
                    w.transport.abort()
                else:
                    w.close()
            self._tasks.discard(task)

    async def _read(self, src: asyncio.StreamReader, queue: asyncio.Queue, not_before: float = 0.0) -> None:
        """Read chunks and queue each with its due time; the last item is (due, b'') for the end of stream.
        Nothing is sent before ``not_before`` (loop time: the handshake)."""
        loop = asyncio.get_running_loop()
        shape = self.shape
        delay, bps, size = shape.one_way_delay_s, shape.bytes_per_s, shape.chunk_bytes
        link_free = not_before  # when this direction's link has sent everything read so far
        last_due = 0.0  # in order: no chunk is due before the one before it
        while True:
            try:
                data = await src.read(size)
            except (ConnectionError, OSError) as e:  # a reset ends the stream like a close
                log.debug("delay proxy: read failed: %r", e)
                data = b""
            now = loop.time()
            if bps is not None:
                link_free = max(now, link_free) + len(data) / bps
                sent = link_free
            else:
                sent = max(now, link_free)
            due = sent + delay
            if data and shape.jitter_ms:
                due += self._rng.uniform(0.0, shape.jitter_ms / 1e3)
            if data and shape.loss and self._rng.random() < shape.loss:
                due += shape.retransmit_s
                with self._lock:
                    self._lost += 1
            last_due = max(last_due, due)
            await queue.put((last_due, data))
            if not data:
                return

    async def _deliver(self, queue: asyncio.Queue, dst: asyncio.StreamWriter, direction: str) -> None:
        """Write each chunk at its due time, in order; at the end of stream half-close ``dst``. Once ``dst``
        fails, the rest of the stream is dropped (the reader is not blocked; the other direction carries on)."""
        loop = asyncio.get_running_loop()
        failed = False
        while True:
            due, data = await queue.get()
            if failed:
                if not data:
                    return
                continue
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                self._count(direction, len(data))  # before the write: a reader of counts() never sees fewer
                dst.write(data)
                await dst.drain()
            except (ConnectionError, OSError) as e:
                log.debug("delay proxy: %s write failed: %r", direction, e)
                failed = True
                if not data:
                    return

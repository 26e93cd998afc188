"""Link probe: measure the path to the cloud before (or between) real calls, so the router's link
estimate is known without a static link setting.

The router's bandwidth guard keeps every request on the edge while the link estimate is unknown (NaN),
and only successful cloud calls feed the estimate: without a probe the cloud is never tried. A probe
uploads ``nbytes`` random (incompressible) bytes to ``/edgefm/probe`` on the cloud's nginx (same bearer
token as the API), which answers 204 once the whole body arrived (config/cloud/nginx.conf.in). Upload
time and RTT come from the exchange as for a real call (transport.py: the kernel's minimum RTT, the
head's arrival minus that RTT), with no server time to subtract.

    prober = LinkProber(HttpTransport(url, token), router.link, ProbeConfig(period_s=5.0))
    prober.poll()   # call often from the thread that owns the link estimator (a timer, a worker loop)

``poll`` never blocks: it applies a finished probe to the estimator (``observe`` / ``observe_failure``,
in the caller's thread: the estimator is not thread-safe) and starts a new one on a background thread
when the estimate is unknown or about to go stale (calls or probes refresh it) and the last probe
started at least ``period_s`` ago.
"""
from __future__ import annotations

import http.client
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from edgefm_ros.cloud.client.base import measure, read_token
from edgefm_ros.cloud.transport import Call, HttpTransport

PROBE_PATH = "/edgefm/probe"
MAX_PROBE_BYTES = 256 * 1024  # nginx refuses larger probe bodies (413)


@dataclass(frozen=True)
class ProbeConfig:
    period_s: float = 5.0  # at most one probe per period; 0: never probe
    nbytes: int = 128 * 1024  # upload size: >= the estimator's min_sample_bytes to count as a throughput sample
    timeout_s: float = 3.0  # a probe not answered by then is aborted and counted as a failure

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period_s) and self.period_s >= 0):
            raise ValueError(f"ProbeConfig.period_s must be a finite number >= 0, got {self.period_s!r}")
        if not (isinstance(self.nbytes, int) and 1 <= self.nbytes <= MAX_PROBE_BYTES):
            raise ValueError(f"ProbeConfig.nbytes must be an int in [1, {MAX_PROBE_BYTES}], got {self.nbytes!r}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"ProbeConfig.timeout_s must be a positive number, got {self.timeout_s!r}")


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    upload_bytes: int  # request line + headers + body
    upload_s: float  # transfer time: response head - RTT (NaN when not ok)
    rtt_s: float  # the connection's minimum RTT (NaN when not ok)
    total_s: float  # start -> answer (or failure)
    error: str = ""  # why not ok: "connection: ...", "rejected: 401 ...", "timeout: ..."

    @property
    def mbps(self) -> float:
        return self.upload_bytes * 8 / self.upload_s / 1e6 if self.ok and self.upload_s > 0 else math.nan


def probe_link(transport: HttpTransport, nbytes: int, timeout_s: float, call: Call | None = None) -> ProbeResult:
    """One probe: uploads ``nbytes`` random bytes; never raises for network or server trouble."""
    body = os.urandom(nbytes)
    t0 = time.perf_counter()
    try:
        ex = transport.request("POST", PROBE_PATH, body, timeout_s, call, content_type="application/octet-stream")
    except TimeoutError as e:
        return ProbeResult(False, 0, math.nan, math.nan, time.perf_counter() - t0, f"timeout: {e}")
    except (OSError, http.client.HTTPException) as e:
        return ProbeResult(False, 0, math.nan, math.nan, time.perf_counter() - t0,
                           f"connection: {type(e).__name__}: {e}")
    if ex.status not in (200, 204):
        kind = "server_error" if ex.status >= 500 else "rejected"
        return ProbeResult(False, ex.sent_bytes, math.nan, math.nan, ex.total_s,
                           f"{kind}: {ex.status} {ex.body[:120].decode('utf-8', 'replace')}")
    upload, rtt = measure(ex, 0.0)  # nginx's sink answers at once: no server time
    return ProbeResult(True, ex.sent_bytes, upload, rtt, ex.total_s)


class LinkProber:
    """Background probes for a link estimator (``observe``/``observe_failure``/``snapshot``/``cfg``)."""

    def __init__(self, transport: HttpTransport, link, config: ProbeConfig = ProbeConfig(),
                 clock: Callable[[], float] = time.monotonic):
        self.transport, self.link, self.cfg, self.clock = transport, link, config, clock
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgefm-probe")
        self._pending: tuple[Future, Call, float] | None = None  # (future, call, started)
        self._last_start = -math.inf
        self.sent = self.ok = self.failed = self.rejected = 0
        self.last: ProbeResult | None = None

    def needed(self, now: float) -> bool:
        """The estimate is unknown (no bandwidth sample) or goes stale within a period (no success for
        stale_after_s - period_s: a probe every period keeps it from decaying)."""
        snap = self.link.snapshot(now)
        return math.isnan(snap.bandwidth_mbps) or snap.age_s >= max(self.link.cfg.stale_after_s - self.cfg.period_s,
                                                                     0.0)

    def poll(self) -> ProbeResult | None:
        """Applies a finished probe (returned) and starts one if due; never blocks."""
        if self.cfg.period_s <= 0:
            return None
        now = self.clock()
        done = self._collect(now)
        if self._pending is None and now - self._last_start >= self.cfg.period_s and self.needed(now):
            call = Call()
            self._pending = (self._pool.submit(probe_link, self.transport, self.cfg.nbytes, self.cfg.timeout_s, call),
                             call, now)
            self._last_start = now
            self.sent += 1
        return done

    def _collect(self, now: float) -> ProbeResult | None:
        if self._pending is None:
            return None
        fut, call, started = self._pending
        if not fut.done():
            if now - started <= self.cfg.timeout_s + 0.5:
                return None
            call.abort()  # stuck past its timeout (the socket timeout is per read): a failure
            r = ProbeResult(False, 0, math.nan, math.nan, now - started, "timeout: no answer to the probe")
        else:
            try:
                r = fut.result()
            except Exception as e:  # a bug in the probe: a failure, never a crash of the caller
                r = ProbeResult(False, 0, math.nan, math.nan, now - started, f"client_error: {e}")
        self._pending = None
        self._apply(r, now)
        return r

    def _apply(self, r: ProbeResult, now: float) -> None:
        self.last = r
        if r.ok:
            self.ok += 1
            self.link.observe(int(r.upload_bytes), float(r.upload_s), float(r.rtt_s), now)
        elif r.error.startswith("rejected"):  # the cloud answered (e.g. a wrong token): not a link failure
            self.rejected += 1
        else:
            self.failed += 1
            self.link.observe_failure(now)

    def stats(self) -> dict:
        out = {"probes": self.sent, "probe_ok": self.ok, "probe_failed": self.failed,
               "probe_rejected": self.rejected}
        if self.last is not None:
            out["probe_last_mbps"] = self.last.mbps
            out["probe_last_error"] = self.last.error
        return out

    def close(self) -> None:
        if self._pending is not None:
            self._pending[1].abort()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.transport.close()


def make_prober(url: str, token: str | None, link, config: ProbeConfig, ca_file: str | None = None) -> LinkProber:
    """A prober of ``url``'s nginx feeding ``link`` (its own connection, not the API client's)."""
    return LinkProber(HttpTransport(url, token, ca_file, max_idle=1), link, config)


def prober_for(url: str, token_file: str, ca_file: str, period_s: float, nbytes: int, link) -> LinkProber | None:
    """A node's link prober from its parameters (cloud_url, cloud_token_file, cloud_ca_file, probe_period_s,
    probe_bytes): None without a URL, a link estimate to feed or a period; the bearer token from ``token_file``,
    else $EDGEFM_CLOUD_TOKEN. ValueError naming a token file that cannot be read."""
    if not url or link is None or period_s <= 0:
        return None
    try:
        token = read_token(token_file)
    except OSError as e:
        raise ValueError(f"cloud_token_file {token_file!r} cannot be read: {e}") from None
    return make_prober(url, token, link, ProbeConfig(period_s=period_s, nbytes=nbytes), ca_file or None)

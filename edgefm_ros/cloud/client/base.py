"""What every cloud client shares (policy.py: CloudPolicy, vqa.py: VqaClient): the errors, the one
ClientConfig (defaults per task), admission (budget, circuit breaker), POSTs retried while the deadline
allows, the call in flight (PendingCall), the link measurement of an exchange, and the caller-thread
bookkeeping (breaker, link observer, per-key EWMA of call times, counters, stats).

A client implements ``_value(result)`` (what a successful call returns to the caller); its results have
``upload_bytes``, ``upload_s``, ``rtt_s``, ``total_s``.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from edgefm_ros.cloud.breaker import BreakerConfig, CircuitBreaker
from edgefm_ros.cloud.tasks import get_task
from edgefm_ros.cloud.transport import Call, Exchange, HttpTransport

RETRYABLE_STATUS = (500, 502, 503, 504)
SOCKET_GRACE_S = 0.25  # socket timeouts trail the deadline by this much
TOKEN_ENV = "EDGEFM_CLOUD_TOKEN"


class CloudError(RuntimeError):
    """The cloud gave no answer; ``reason`` says why (used as a diagnostics counter key)."""

    reason = "error"

    def __init__(self, message: str, reason: str | None = None, status: int | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        self.status = status


class CloudDeadlineExceeded(CloudError):
    reason = "deadline"


class CloudUnavailable(CloudError):
    """Breaker open, connection failed, or the server answered 5xx."""

    reason = "connection"


class CloudRejected(CloudError):
    """The server refused the request (4xx): a client or configuration problem, never retried."""

    reason = "rejected"


@dataclass(frozen=True)
class ClientConfig:
    """One config for every client; the defaults are task vla's, ``for_task`` gives another task's."""

    model_name: str = "smolvla"
    max_attempts: int = 2  # 1 + retries, each only if the deadline leaves room for it
    retry_margin_s: float = 0.005  # a retry needs the typical call time plus this left
    breaker: BreakerConfig = BreakerConfig()
    latency_alpha: float = 0.3  # EWMA weight of the newest successful call time (retry decisions)
    send_deadline: bool = True  # tell the server the budget, so it drops requests that queued too long
    threads: int = 4  # calls in flight at once (a call abandoned at its deadline finishes in the background)
    request_parameters: tuple[tuple[str, object], ...] = ()  # extra v2 request parameters, e.g.
    #   (("fault_delay_s", 0.5),) for drills against a server started with --fault-injection

    def __post_init__(self) -> None:
        if not (isinstance(self.max_attempts, int) and self.max_attempts >= 1):
            raise ValueError(f"ClientConfig.max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not (math.isfinite(self.retry_margin_s) and self.retry_margin_s >= 0):
            raise ValueError(f"ClientConfig.retry_margin_s must be a finite number >= 0, got {self.retry_margin_s!r}")
        if not 0 < self.latency_alpha <= 1:
            raise ValueError(f"ClientConfig.latency_alpha must be in (0, 1], got {self.latency_alpha!r}")
        if self.threads < 1:
            raise ValueError(f"ClientConfig.threads must be >= 1, got {self.threads!r}")

    @classmethod
    def for_task(cls, task: str, **overrides) -> "ClientConfig":
        """Task ``task``'s defaults (tasks/: model name, retry margin, threads), then ``overrides``."""
        return cls(**{**dict(get_task(task).client_defaults), **overrides})


def read_token(token_file: str = "") -> str | None:
    """The endpoint's bearer token: ``token_file``'s content, else $EDGEFM_CLOUD_TOKEN (None: no token).
    An unreadable file raises OSError."""
    if token_file:
        with open(os.path.expanduser(token_file)) as f:
            return f.read().strip() or None
    return os.environ.get(TOKEN_ENV) or None


def measure(ex, server_s: float) -> tuple[float, float]:
    """(upload_s, rtt_s) of an exchange: the kernel RTT if known, else what the server time leaves."""
    rtt = ex.tcp_rtt_s if ex.tcp_rtt_s is not None else max(ex.head_s - server_s - ex.send_s, 0.0)
    upload = max(ex.head_s - server_s - rtt, ex.send_s, 1e-6)
    return upload, rtt


def error_text(body: bytes) -> str:
    """The ``error`` of a JSON error body, else the body's start."""
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


def ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


class ClientBase:
    def __init__(self, url: str, token: str | None, config: ClientConfig, link, ca_file: str | None,
                 clock: Callable[[], float], thread_name: str):
        self.cfg, self.link, self.clock = config, link, clock
        self.breaker = CircuitBreaker(config.breaker)
        self._http = HttpTransport(url, token, ca_file, max_idle=config.threads)
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix=thread_name)
        self._path = f"/v2/models/{config.model_name}/infer"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._latency: dict[Hashable, float] = {}  # EWMA of successful call times per key (the client's)
        self.last = None

    # ---------------------------------------------------------------- one call (worker thread)

    def _typical(self, key: Hashable) -> float:
        with self._lock:
            return self._latency.get(key, 0.0)

    def _retrying(self, send: Callable[[], Any], deadline: float, call: Call, key: Hashable, what: str,
                  refusal: Callable[[Any], str] | None = None) -> tuple[Any, int]:
        """``send()`` until it answers 200 -> (that response, attempts). Connection failures and 5xx are
        retried while the deadline leaves the typical call time (of ``key``) + ``retry_margin_s``; a 4xx
        is CloudRejected at once. ``refusal(response)``: the text of a non-200 answer (default: its JSON
        ``error``)."""
        typical = self._typical(key)
        attempt, last_err = 0, None
        while attempt < self.cfg.max_attempts and not call.aborted:
            if attempt > 0 and deadline - time.monotonic() < typical + self.cfg.retry_margin_s:
                break  # no time for another try
            attempt += 1
            try:
                r = send()
            except TimeoutError:
                raise CloudDeadlineExceeded("no answer from the cloud before the deadline") from None
            except (OSError, http.client.HTTPException) as e:
                last_err = CloudUnavailable(f"cloud call failed: {type(e).__name__}: {e}", "connection")
                continue
            if r.status == 200:
                return r, attempt
            msg = refusal(r) if refusal is not None else error_text(r.body)
            if r.status in RETRYABLE_STATUS:
                last_err = CloudUnavailable(f"server answered {r.status}: {msg}", "server_error", r.status)
                continue
            raise CloudRejected(f"server refused the {what} ({r.status}): {msg}", "rejected", r.status)
        raise last_err or CloudDeadlineExceeded("no time left for an attempt")

    def _post(self, body: bytes, deadline: float, call: Call, key: Hashable, what: str) -> tuple[Exchange, int]:
        # the socket timeout is a backstop only: the caller aborts the call at the deadline itself
        return self._retrying(lambda: self._http.request("POST", self._path, body,
                                                         deadline - time.monotonic() + SOCKET_GRACE_S, call),
                              deadline, call, key, what)

    def _request_parameters(self, deadline: float) -> dict:
        """The extra v2 request parameters of a call starting now: the config's, and the budget left."""
        extra = dict(self.cfg.request_parameters)
        if self.cfg.send_deadline:
            extra["deadline_s"] = max(deadline - time.monotonic(), 0.0)
        return extra

    # ---------------------------------------------------------------- bookkeeping (caller thread)

    def _admit(self, deadline_s: float) -> tuple[float, CloudError | None]:
        """(deadline, None) when a call may go out now, else (deadline, why not: no budget, breaker open);
        ValueError for a deadline_s that is not a finite number."""
        if not (isinstance(deadline_s, (int, float)) and not isinstance(deadline_s, bool)
                and math.isfinite(deadline_s)):
            raise ValueError(f"deadline_s must be a finite number of seconds, got {deadline_s!r}")
        deadline = time.monotonic() + deadline_s
        if deadline_s <= 0:
            return deadline, CloudDeadlineExceeded(f"no budget left ({deadline_s:.3f} s): not sent", "no_budget")
        if not self.breaker.allow(self.clock()):
            return deadline, CloudUnavailable("circuit breaker open", "breaker_open")
        return deadline, None

    def _start(self, deadline: float, key: Hashable, worker: Callable, *args) -> "PendingCall":
        """``worker(*args, deadline, call)`` on the client's pool."""
        call = Call()
        fut = self._pool.submit(worker, *args, deadline, call)
        self._count("sent")
        return PendingCall(self, fut, call, deadline, key)

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def _value(self, result):
        """What a successful call hands to the caller (default: the result itself)."""
        return result

    def record_success(self, result, key: Hashable):
        """A call that answered: latency EWMA of ``key``, breaker, link sample, counters -> its value."""
        with self._lock:
            self._latency[key] = ewma(self._latency.get(key), result.total_s, self.cfg.latency_alpha)
        self.breaker.record_success()
        self.last = result
        self._count("cloud")
        if self.link is not None:
            self.link.observe(int(result.upload_bytes), float(result.upload_s), float(result.rtt_s), self.clock())
        return self._value(result)

    def record_failure(self, err: CloudError) -> CloudError:
        """A call that failed: counters, and (when something was sent) the breaker and the link."""
        self._count(f"fail_{err.reason}")
        if isinstance(err, CloudRejected):  # the server is up and answering: not a link or server failure
            self.breaker.record_success()
        elif err.reason not in ("breaker_open", "no_budget"):  # something was sent
            now = self.clock()
            self.breaker.record_failure(now)
            if self.link is not None and err.reason != "client_error":
                self.link.observe_failure(now)
        return err

    # ---------------------------------------------------------------- public API

    def healthy(self, timeout_s: float = 1.0) -> bool:
        """The server answers ready for this model (loaded and warmed up)."""
        try:
            ex = self._http.request("GET", f"/v2/models/{self.cfg.model_name}/ready", None, timeout_s)
        except (OSError, http.client.HTTPException):
            return False
        return ex.status == 200

    def stats(self) -> dict:
        """Counters: sent, cloud, fail_<reason>; CloudPolicy: edge-fallback, fallback_<reason>; VqaClient:
        abandoned. Breaker state and times opened."""
        with self._lock:
            out = dict(self._counts)
        out["breaker"] = self.breaker.state(self.clock())
        out["breaker_opened"] = self.breaker.opened
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()


class PendingCall:
    """A cloud call in flight (``CloudPolicy.submit``, ``VqaClient.ask``); ``result()`` settles it once
    in the caller's thread (breaker, link, counters)."""

    def __init__(self, client: ClientBase, fut: Future | None, call: Call | None, deadline: float,
                 key: Hashable = None, error: CloudError | None = None):
        self._client, self._fut, self._call = client, fut, call
        self.deadline, self._key, self._error = deadline, key, error
        self._settled = False

    @classmethod
    def failed(cls, client: ClientBase, error: CloudError, deadline: float) -> "PendingCall":
        return cls(client, None, None, deadline, None, error)

    def done(self) -> bool:
        return self._fut is None or self._fut.done()

    def result(self):
        """Waits at most until the deadline; then aborts the call and raises CloudDeadlineExceeded."""
        if self._fut is None:
            return self._fail(self._error)
        try:
            r = self._fut.result(timeout=max(self.deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            self._call.abort()
            return self._fail(CloudDeadlineExceeded("no answer from the cloud before the deadline"))
        except CloudError as e:
            return self._fail(e)
        except Exception as e:  # a bug or a surprise in a worker: a failed call, never a crash of the caller
            return self._fail(CloudError(f"cloud call failed: {type(e).__name__}: {e}", "client_error"))
        if self._settled:
            return self._client._value(r)
        self._settled = True
        return self._client.record_success(r, self._key)

    def _fail(self, err: CloudError):
        if not self._settled:
            self._settled = True
            self._client.record_failure(err)
        raise err

"""What the robot's cloud clients (client.py: CloudPolicy, vqa_client.py: VqaClient) share: the errors,
admission (budget, circuit breaker), POSTs retried while the deadline allows, the link measurement of
an exchange, and the caller-thread bookkeeping (breaker, link observer, counters, stats).

A client's config has ``model_name``, ``max_attempts``, ``retry_margin_s``, ``breaker``, ``threads``;
its results have ``upload_bytes``, ``upload_s``, ``rtt_s``. Requests and responses are the client's own.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from edgefm_ros.cloud.breaker import CircuitBreaker
from edgefm_ros.cloud.transport import Call, Exchange, HttpTransport

RETRYABLE_STATUS = (500, 502, 503, 504)
SOCKET_GRACE_S = 0.25  # socket timeouts trail the deadline by this much


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


def check_client_config(cfg) -> None:
    """ValueError naming the first bad retry / EWMA / thread setting of a client config."""
    name = type(cfg).__name__
    if not (isinstance(cfg.max_attempts, int) and cfg.max_attempts >= 1):
        raise ValueError(f"{name}.max_attempts must be an int >= 1, got {cfg.max_attempts!r}")
    if not (math.isfinite(cfg.retry_margin_s) and cfg.retry_margin_s >= 0):
        raise ValueError(f"{name}.retry_margin_s must be a finite number >= 0, got {cfg.retry_margin_s!r}")
    if not 0 < cfg.latency_alpha <= 1:
        raise ValueError(f"{name}.latency_alpha must be in (0, 1], got {cfg.latency_alpha!r}")
    if cfg.threads < 1:
        raise ValueError(f"{name}.threads must be >= 1, got {cfg.threads!r}")


TOKEN_ENV = "EDGEFM_CLOUD_TOKEN"


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
    def __init__(self, url: str, token: str | None, config, link, ca_file: str | None, clock: Callable[[], float],
                 thread_name: str):
        self.cfg, self.link, self.clock = config, link, clock
        self.breaker = CircuitBreaker(config.breaker)
        self._http = HttpTransport(url, token, ca_file, max_idle=config.threads)
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix=thread_name)
        self._path = f"/v2/models/{config.model_name}/infer"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self.last = None

    # ---------------------------------------------------------------- one call (worker thread)

    def _retrying(self, send: Callable[[], Any], deadline: float, call: Call, typical: float, what: str,
                  refusal: Callable[[Any], str] | None = None) -> tuple[Any, int]:
        """``send()`` until it answers 200 -> (that response, attempts). Connection failures and 5xx are
        retried while the deadline leaves ``typical + retry_margin_s``; a 4xx is CloudRejected at once.
        ``refusal(response)``: the text of a non-200 answer (default: its JSON ``error``)."""
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

    def _post(self, body: bytes, deadline: float, call: Call, typical: float, what: str) -> tuple[Exchange, int]:
        # the socket timeout is a backstop only: the caller aborts the call at the deadline itself
        return self._retrying(lambda: self._http.request("POST", self._path, body,
                                                         deadline - time.monotonic() + SOCKET_GRACE_S, call),
                              deadline, call, typical, what)

    # ---------------------------------------------------------------- bookkeeping (caller thread)

    def _admit(self, deadline_s: float) -> tuple[float, CloudError | None]:
        """(deadline, None) when a call may go out now, else (deadline, why not: no budget, breaker open);
        ValueError for a deadline_s that is not a finite number."""
        if not (isinstance(deadline_s, (int, float)) and math.isfinite(deadline_s)):
            raise ValueError(f"deadline_s must be a finite number of seconds, got {deadline_s!r}")
        deadline = time.monotonic() + deadline_s
        if deadline_s <= 0:
            return deadline, CloudDeadlineExceeded(f"no budget left ({deadline_s:.3f} s): not sent", "no_budget")
        if not self.breaker.allow(self.clock()):
            return deadline, CloudUnavailable("circuit breaker open", "breaker_open")
        return deadline, None

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def _record_success(self, result) -> None:
        self.breaker.record_success()
        self.last = result
        self._count("cloud")
        if self.link is not None:
            self.link.observe(int(result.upload_bytes), float(result.upload_s), float(result.rtt_s), self.clock())

    def _failed(self, err: CloudError) -> CloudError:
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

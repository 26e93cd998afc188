"""The robot's client for the cloud scene-question endpoint (vqa_runtime.py): a deadline on every call,
retries only when the deadline allows, the circuit breaker, link measurements for the router.

    vqa = VqaClient("http://10.0.0.5:8080", token, link=router.link)
    try:
        answer = vqa.ask("what is on the table?", [rgb], deadline_s=5.0, encoding=Encoding("jpeg", 85, 512))
    except CloudError as e:  # e.reason: deadline, no_budget, breaker_open, connection, server_error, rejected, ...
        ...  # answer on the edge

``ask`` returns or raises by ``deadline_s`` from now, whatever the server and the network do (the
call is aborted and its socket closed). The errors are client.py's: CloudDeadlineExceeded,
CloudUnavailable (breaker open, connection failed, 5xx), CloudRejected (4xx: never retried, does not
trip the breaker). ``link``: ``observe(upload_bytes, upload_s, rtt_s, now)`` / ``observe_failure(now)``
(routing.link.LinkEstimator), called from the caller's thread. Use one VqaClient from one thread.
"""
from __future__ import annotations

import http.client
import json
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from edgefm_ros.cloud.breaker import BreakerConfig, CircuitBreaker
from edgefm_ros.cloud.client import (RETRYABLE_STATUS, SOCKET_GRACE_S, CloudDeadlineExceeded, CloudError,
                                     CloudRejected, CloudUnavailable, _error_text, _measure)
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.protocol import request_body
from edgefm_ros.cloud.transport import Call, Exchange, HttpTransport
from edgefm_ros.cloud.vqa_protocol import decode_vqa_response, encode_vqa_request


@dataclass(frozen=True)
class VqaClientConfig:
    model_name: str = "vqa"
    max_attempts: int = 2  # 1 + retries, each only if the deadline leaves room for it
    retry_margin_s: float = 0.05  # a retry needs the typical call time plus this left
    breaker: BreakerConfig = BreakerConfig()
    latency_alpha: float = 0.3  # EWMA weight of the newest successful call time (retry decisions)
    send_deadline: bool = True  # tell the server the budget: it drops a request that queued too long
    threads: int = 2  # calls in flight (one abandoned at its deadline finishes in the background)
    request_parameters: tuple[tuple[str, object], ...] = ()  # extra v2 request parameters (drills)

    def __post_init__(self) -> None:
        if not (isinstance(self.max_attempts, int) and self.max_attempts >= 1):
            raise ValueError(f"VqaClientConfig.max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not (math.isfinite(self.retry_margin_s) and self.retry_margin_s >= 0):
            raise ValueError(f"VqaClientConfig.retry_margin_s must be a finite number >= 0, got "
                             f"{self.retry_margin_s!r}")
        if not 0 < self.latency_alpha <= 1:
            raise ValueError(f"VqaClientConfig.latency_alpha must be in (0, 1], got {self.latency_alpha!r}")
        if self.threads < 1:
            raise ValueError(f"VqaClientConfig.threads must be >= 1, got {self.threads!r}")


@dataclass(frozen=True)
class VqaAnswer:
    text: str
    tokens: tuple[int, ...]  # generated ids
    model: str
    stop_reason: str  # eos | stop_string | length
    total_s: float  # ask -> answer, including encode_s
    encode_s: float  # image encoding and request serialisation on the robot
    upload_bytes: int
    upload_s: float
    rtt_s: float
    attempts: int
    server: dict  # the server's seconds: queue_s, prefill_s (time to first token), decode_s, server_s, ...


class VqaClient:
    def __init__(self, url: str, token: str | None = None, *, config: VqaClientConfig = VqaClientConfig(),
                 link=None, ca_file: str | None = None, clock: Callable[[], float] = time.monotonic):
        self.cfg, self.link, self.clock = config, link, clock
        self.breaker = CircuitBreaker(config.breaker)
        self._http = HttpTransport(url, token, ca_file, max_idle=config.threads)
        self._pool = ThreadPoolExecutor(config.threads, thread_name_prefix="edgefm-vqa-cloud")
        self._path = f"/v2/models/{config.model_name}/infer"
        self._lock = threading.Lock()
        self._typical: float | None = None  # EWMA of successful call times
        self._counts: dict[str, int] = {}
        self.last: VqaAnswer | None = None

    # ---------------------------------------------------------------- one call (worker thread)

    def _exchange(self, body: bytes, deadline: float, call: Call) -> tuple[Exchange, int]:
        """POST with retries while the deadline allows; -> (the 200 exchange, attempts) or CloudError."""
        typical = self._typical or 0.0
        attempt, last_err = 0, None
        while attempt < self.cfg.max_attempts and not call.aborted:
            if attempt > 0 and deadline - time.monotonic() < typical + self.cfg.retry_margin_s:
                break  # no time for another try
            attempt += 1
            try:
                ex = self._http.request("POST", self._path, body, deadline - time.monotonic() + SOCKET_GRACE_S, call)
            except TimeoutError:
                raise CloudDeadlineExceeded("no answer from the cloud before the deadline") from None
            except (OSError, http.client.HTTPException) as e:
                last_err = CloudUnavailable(f"cloud call failed: {type(e).__name__}: {e}", "connection")
                continue
            if ex.status == 200:
                return ex, attempt
            msg = _error_text(ex.body)
            if ex.status in RETRYABLE_STATUS:
                last_err = CloudUnavailable(f"server answered {ex.status}: {msg}", "server_error", ex.status)
                continue
            raise CloudRejected(f"server refused the question ({ex.status}): {msg}", "rejected", ex.status)
        raise last_err or CloudDeadlineExceeded("no time left for an attempt")

    def _worker(self, request: dict, deadline: float, call: Call) -> VqaAnswer:
        t0 = time.monotonic()
        if self.cfg.send_deadline:
            request["parameters"]["deadline_s"] = max(deadline - t0, 0.0)
        body = request_body(request)
        encode_s = time.monotonic() - t0
        ex, attempts = self._exchange(body, deadline, call)
        try:
            text, tokens, params = decode_vqa_response(json.loads(ex.body))
        except (ValueError, TypeError, AttributeError) as e:
            raise CloudError(f"malformed response from the server: {e}", "bad_response") from None
        server = {k: float(v) for k, v in params.items() if k.endswith("_s") and isinstance(v, (int, float))}
        upload_s, rtt_s = _measure(ex, server.get("server_s", 0.0))
        return VqaAnswer(text, tokens, str(params.get("model", "")), str(params.get("stop_reason", "")),
                         time.monotonic() - t0, encode_s, ex.sent_bytes, upload_s, rtt_s, attempts, server)

    # ---------------------------------------------------------------- bookkeeping (caller thread)

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def _succeeded(self, a: VqaAnswer) -> VqaAnswer:
        self.breaker.record_success()
        alpha = self.cfg.latency_alpha
        self._typical = a.total_s if self._typical is None else (1 - alpha) * self._typical + alpha * a.total_s
        self.last = a
        self._count("cloud")
        if self.link is not None:
            self.link.observe(int(a.upload_bytes), float(a.upload_s), float(a.rtt_s), self.clock())
        return a

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

    def ask(self, question: str, images: Sequence[np.ndarray] = (), deadline_s: float = 5.0, *,
            encoding: Encoding = Encoding(), system: str | None = None, max_new_tokens: int = 64,
            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
            request_id: str | None = None) -> VqaAnswer:
        """The cloud's answer within ``deadline_s`` seconds, or CloudError saying why not.

        ``images``: uint8 (H, W, 3) RGB or float32 (3, H, W) in [0, 1], in prompt order."""
        if not (isinstance(deadline_s, (int, float)) and math.isfinite(deadline_s)):
            raise ValueError(f"deadline_s must be a finite number of seconds, got {deadline_s!r}")
        deadline = time.monotonic() + deadline_s
        if deadline_s <= 0:
            raise self._failed(CloudDeadlineExceeded(f"no budget left ({deadline_s:.3f} s): not sent", "no_budget"))
        if not self.breaker.allow(self.clock()):
            raise self._failed(CloudUnavailable("circuit breaker open", "breaker_open"))
        try:  # encoding errors (bad image, bad sampling value) are the caller's: raised as ValueError
            request = encode_vqa_request(question, list(images), encoding, request_id=request_id or uuid.uuid4().hex,
                                         system=system, max_new_tokens=max_new_tokens, temperature=temperature,
                                         top_k=top_k, top_p=top_p, seed=seed, extra=dict(self.cfg.request_parameters))
        except (TypeError, OverflowError) as e:
            raise ValueError(f"cannot encode the question: {e}") from None
        call = Call()
        fut = self._pool.submit(self._worker, request, deadline, call)
        self._count("sent")
        try:
            answer = fut.result(timeout=max(deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            call.abort()
            raise self._failed(CloudDeadlineExceeded("no answer from the cloud before the deadline")) from None
        except CloudError as e:
            raise self._failed(e) from None
        except Exception as e:  # a surprise in a worker: a failed call, never a crash of the caller
            raise self._failed(CloudError(f"cloud call failed: {type(e).__name__}: {e}", "client_error")) from None
        return self._succeeded(answer)

    def healthy(self, timeout_s: float = 1.0) -> bool:
        """The server answers ready for this model (loaded and warmed up)."""
        try:
            ex = self._http.request("GET", f"/v2/models/{self.cfg.model_name}/ready", None, timeout_s)
        except (OSError, http.client.HTTPException):
            return False
        return ex.status == 200

    def stats(self) -> dict:
        """Counters: sent, cloud, fail_<reason>; breaker state and times opened."""
        with self._lock:
            out = dict(self._counts)
        out["breaker"] = self.breaker.state(self.clock())
        out["breaker_opened"] = self.breaker.opened
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

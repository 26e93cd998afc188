"""The robot's client for the cloud tier: a deadline on every call, retries only when the deadline
allows, a circuit breaker, optional hedging with the edge, and link measurements for the router.

    cloud = CloudPolicy("http://10.0.0.5:8080", token, link=link_estimator, joint_names=names)
    try:
        chunk = cloud.predict(obs, deadline_s=0.25, encoding=Encoding("jpeg", 85, 256))  # source "cloud"
    except CloudError as e:  # e.reason: deadline, no_budget, breaker_open, connection, server_error, rejected, ...
        chunk = edge.predict(obs)
    # or, fallback (and hedging) done here, chunk.source "cloud" or "edge-fallback":
    chunk = cloud.predict_or_edge(obs, 0.25, lambda: edge.predict(obs), hedge=True)

``deadline_s`` is the time budget from now (seconds): by then ``predict`` has returned or raised,
whatever the server and the network do. Use a CloudPolicy from one thread (the node's inference
thread): the HTTP exchanges run on the client's own worker threads, the bookkeeping on the caller's.
``link`` is any object with ``observe(upload_bytes, upload_s, rtt_s, now)`` and
``observe_failure(now)`` (routing.link.LinkEstimator); ``now`` is ``clock()`` (default time.monotonic),
which also times the breaker's cool-down. Deadlines always run on time.monotonic.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Callable

import numpy as np

from edgefm_ros.cloud.breaker import BreakerConfig
from edgefm_ros.cloud.client_base import (RETRYABLE_STATUS, SOCKET_GRACE_S, ClientBase, CloudDeadlineExceeded,
                                          CloudError, CloudRejected, CloudUnavailable, check_client_config, ewma,
                                          measure)
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.protocol import decode_response, encode_request, request_body
from edgefm_ros.cloud.transport import Call, Exchange
from edgefm_ros.types import ActionChunk, Observation

__all__ = ["RETRYABLE_STATUS", "SOCKET_GRACE_S", "CallResult", "ClientConfig", "CloudDeadlineExceeded", "CloudError",
           "CloudPolicy", "CloudRejected", "CloudUnavailable", "PendingCall"]


@dataclass(frozen=True)
class ClientConfig:
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
        check_client_config(self)


@dataclass(frozen=True)
class CallResult:
    chunk: ActionChunk
    upload_bytes: int
    upload_s: float  # transfer time estimate: response head time - server time - RTT
    rtt_s: float
    total_s: float  # submit -> chunk ready, including encode_s
    encode_s: float  # image encoding and request serialisation on the robot
    attempts: int
    server: dict  # the server's timing parameters (queue_s, prefill_s, decode_s, server_s, ...)


class CloudPolicy(ClientBase):
    """Errors, retries, breaker and link bookkeeping: client_base.py; the action-chunk request here."""

    def __init__(self, url: str, token: str | None = None, *, config: ClientConfig = ClientConfig(), link=None,
                 ca_file: str | None = None, joint_names: tuple[str, ...] = (),
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(url, token, config, link, ca_file, clock, "edgefm-cloud")
        self.joint_names = tuple(joint_names)
        self._latency: dict[tuple, float] = {}  # EWMA of successful call time per encoding
        self.last: CallResult | None = None

    # ---------------------------------------------------------------- one exchange (worker thread)

    def _worker(self, obs: Observation, enc: Encoding, deadline: float, call: Call, noise, seq: int,
                dt: float, request_id: str) -> CallResult:
        t0 = time.monotonic()
        extra = dict(self.cfg.request_parameters)
        if self.cfg.send_deadline:
            extra["deadline_s"] = max(deadline - t0, 0.0)
        body = request_body(encode_request(obs, enc, request_id=request_id, dt=dt, seq=seq, noise=noise, extra=extra))
        encode_s = time.monotonic() - t0
        ex, attempts = self._post(body, deadline, call, self._latency.get(self._key(enc), 0.0), "request")
        return self._result(ex, obs, dt, seq, attempts, time.monotonic() - t0, encode_s)

    def _result(self, ex: Exchange, obs: Observation, dt: float, seq: int, attempts: int, total: float,
                encode_s: float) -> CallResult:
        try:
            actions, params = decode_response(json.loads(ex.body))
            server = {k: float(v) for k, v in params.items() if k.endswith("_s")}
            chunk = ActionChunk(actions=actions, dt=dt, stamp=obs.stamp, source="cloud",
                                model=str(params.get("model", "")), joint_names=self.joint_names, seq=seq,
                                inference_s=total, prefill_s=server.get("prefill_s", 0.0),
                                decode_s=server.get("decode_s", 0.0))
        except (ValueError, TypeError) as e:
            raise CloudError(f"malformed response from the server: {e}", "bad_response") from None
        upload_s, rtt_s = measure(ex, server.get("server_s", 0.0))
        return CallResult(chunk, ex.sent_bytes, upload_s, rtt_s, total, encode_s, attempts, server)

    @staticmethod
    def _key(enc: Encoding) -> tuple:
        return (enc.format, enc.jpeg_quality if enc.format == "jpeg" else 0, enc.resolution)

    # ---------------------------------------------------------------- bookkeeping (caller thread)

    def _succeeded(self, r: CallResult, enc: Encoding) -> None:
        key = self._key(enc)
        with self._lock:
            self._latency[key] = ewma(self._latency.get(key), r.total_s, self.cfg.latency_alpha)
        self._record_success(r)

    # ---------------------------------------------------------------- public API

    def submit(self, obs: Observation, deadline_s: float, encoding: Encoding = Encoding(), *,
               noise: np.ndarray | None = None, seq: int = 0, dt: float = 1 / 30,
               request_id: str | None = None) -> "PendingCall":
        """Starts a call in the background; ``PendingCall.result()`` returns the chunk or raises CloudError.

        Call ``result()`` on every PendingCall: it does the bookkeeping (breaker, link, counters) in the
        caller's thread, so the link estimator is only ever touched from there."""
        deadline, err = self._admit(deadline_s)
        if err is not None:
            return PendingCall.failed(self, err, deadline, encoding)
        call = Call()
        fut = self._pool.submit(self._worker, obs, encoding, deadline, call, noise, seq, dt,
                                request_id or uuid.uuid4().hex[:16])
        self._count("sent")
        return PendingCall(self, fut, call, deadline, encoding)

    def predict(self, obs: Observation, deadline_s: float, encoding: Encoding = Encoding(), *,
                noise: np.ndarray | None = None, seq: int = 0, dt: float = 1 / 30,
                request_id: str | None = None) -> ActionChunk:
        """A chunk from the cloud (source "cloud") within ``deadline_s`` seconds, or CloudError."""
        return self.submit(obs, deadline_s, encoding, noise=noise, seq=seq, dt=dt, request_id=request_id).result()

    def predict_or_edge(self, obs: Observation, deadline_s: float, edge: Callable[[], ActionChunk],
                        encoding: Encoding = Encoding(), *, hedge: bool = False, edge_reserve_s: float = 0.0,
                        noise: np.ndarray | None = None, seq: int = 0, dt: float = 1 / 30) -> ActionChunk:
        """The cloud's chunk, else ``edge()``'s marked ``edge-fallback``.

        Without hedging the cloud gets ``deadline_s - edge_reserve_s`` and the edge runs only after
        it failed (reserve the edge's inference time); with hedging the edge runs at once, in
        parallel, and the cloud has the whole budget.
        """
        budget = deadline_s if hedge else deadline_s - edge_reserve_s
        pending = self.submit(obs, budget, encoding, noise=noise, seq=seq, dt=dt)
        edge_chunk = edge() if hedge else None
        try:
            return pending.result()
        except CloudError as e:
            self._count(f"fallback_{e.reason}")
            chunk = edge_chunk if edge_chunk is not None else edge()
            self._count("edge-fallback")
            return dataclasses.replace(chunk, source="edge-fallback")

    def expected_latency_s(self, encoding: Encoding) -> float | None:
        """EWMA of successful call times with this encoding (None before the first)."""
        with self._lock:
            return self._latency.get(self._key(encoding))


class PendingCall:
    """A cloud call in flight (from ``CloudPolicy.submit``)."""

    def __init__(self, policy: CloudPolicy, fut: Future | None, call: Call | None, deadline: float, enc: Encoding,
                 error: CloudError | None = None):
        self._policy, self._fut, self._call = policy, fut, call
        self.deadline, self._enc, self._error = deadline, enc, error
        self._settled = False

    @classmethod
    def failed(cls, policy: CloudPolicy, error: CloudError, deadline: float, enc: Encoding) -> "PendingCall":
        return cls(policy, None, None, deadline, enc, error)

    def done(self) -> bool:
        return self._fut is None or self._fut.done()

    def result(self) -> ActionChunk:
        """Waits at most until the deadline; then aborts the call and raises CloudDeadlineExceeded."""
        if self._fut is None:
            return self._settle(self._error)
        try:
            r = self._fut.result(timeout=max(self.deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            self._call.abort()
            return self._settle(CloudDeadlineExceeded("no answer from the cloud before the deadline"))
        except CloudError as e:
            return self._settle(e)
        except Exception as e:  # a bug or a surprise in encoding: report it as a failed call, never crash the caller
            return self._settle(CloudError(f"cloud call failed: {type(e).__name__}: {e}", "client_error"))
        if not self._settled:
            self._settled = True
            self._policy._succeeded(r, self._enc)
        return r.chunk

    def _settle(self, err: CloudError):
        if not self._settled:
            self._settled = True
            self._policy._failed(err)
        raise err

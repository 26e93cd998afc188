"""The robot's client for task vla (action chunks): a deadline on every call, retries only when the
deadline allows, a circuit breaker, optional hedging with the edge, and link measurements for the router.

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

``RemotePolicy`` is what vla_node needs of a remote policy (CloudPolicy is one; tests pass their own).
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from edgefm_ros.cloud.client.base import ClientBase, ClientConfig, CloudError, PendingCall, measure
from edgefm_ros.cloud.core.protocol import request_body, server_seconds
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.tasks.vla import decode_response, encode_request
from edgefm_ros.cloud.transport import Call, Exchange
from edgefm_ros.types import ActionChunk, Observation

DEFAULT_DT = 1 / 30


@runtime_checkable
class RemotePolicy(Protocol):
    """A policy that runs elsewhere: a chunk for ``obs`` within ``deadline_s`` seconds, or an exception.

    ``encoding``: how images travel (the router's choice); ``noise``: float32 (chunk_size, max_action_dim)
    start noise (shadow comparisons), ``seq``/``dt``: the chunk's sequence number and control period."""

    def predict(self, obs: Observation, deadline_s: float, encoding: Encoding = Encoding(), *,
                noise: np.ndarray | None = None, seq: int = 0, dt: float = DEFAULT_DT,
                request_id: str | None = None, rtc_prefix: np.ndarray | None = None,
                rtc_delay: int = 0) -> ActionChunk: ...

    def stats(self) -> dict: ...

    def close(self) -> None: ...


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


def encoding_key(enc: Encoding) -> tuple:
    """Encodings that cost the same on the wire share a latency estimate."""
    return (enc.format, enc.jpeg_quality if enc.format == "jpeg" else 0, enc.resolution)


class CloudPolicy(ClientBase):
    """Errors, retries, breaker, pending calls and link bookkeeping: base.py; the action-chunk request here."""

    def __init__(self, url: str, token: str | None = None, *, config: ClientConfig = ClientConfig(), link=None,
                 ca_file: str | None = None, joint_names: tuple[str, ...] = (),
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(url, token, config, link, ca_file, clock, "edgefm-cloud")
        self.joint_names = tuple(joint_names)
        self.last: CallResult | None = None
        self._served_shape: tuple[int, int] | None = None  # the served model's (chunk_size, max_action_dim)
        self._shape_retry_at = -float("inf")  # a failed metadata query is not repeated before this (clock)

    def served_shape(self, timeout_s: float = 1.0) -> tuple[int, int] | None:
        """The served model's noise shape (chunk_size, max_action_dim) from its metadata, asked once (None while
        the server does not say)."""
        if self._served_shape is None and self.clock() >= self._shape_retry_at:
            self._shape_retry_at = self.clock() + 10.0
            try:
                ex = self._http.request("GET", f"/v2/models/{self.cfg.model_name}", None, timeout_s)
                meta = json.loads(ex.body) if ex.status == 200 else {}
                spec = next(t for t in meta.get("inputs", []) if t.get("name") == "noise")
                shape = tuple(int(v) for v in spec["shape"])
                if len(shape) == 2 and min(shape) > 0:
                    self._served_shape = shape
            except (OSError, ValueError, TypeError, KeyError, StopIteration, AttributeError):
                return None
        return self._served_shape

    def fit_to_served(self, noise: np.ndarray | None, rtc_prefix: np.ndarray | None,
                      rtc_delay: int) -> tuple[np.ndarray | None, np.ndarray | None, int]:
        """A robot whose own model has another chunk length than the served one: its noise is not the server's
        to use (dropped: the server draws its own), and of its continuation the served chunk can continue
        only the first chunk_size rows (cut; the delay capped there)."""
        shape = self.served_shape() if noise is not None or rtc_prefix is not None else None
        if shape is None:
            return noise, rtc_prefix, rtc_delay
        if noise is not None and tuple(np.shape(noise)) != shape:
            noise = None
        if rtc_prefix is not None and len(rtc_prefix) > shape[0]:
            rtc_prefix = np.asarray(rtc_prefix)[:shape[0]]
        return noise, rtc_prefix, min(int(rtc_delay), shape[0])

    # ---------------------------------------------------------------- one exchange (worker thread)

    def _worker(self, obs: Observation, enc: Encoding, noise, seq: int, dt: float, request_id: str, rtc,
                deadline: float, call: Call) -> CallResult:
        t0 = time.monotonic()
        request = encode_request(obs, enc, request_id=request_id, dt=dt, seq=seq, noise=noise,
                                 extra=self._request_parameters(deadline), rtc_prefix=rtc[0], rtc_delay=rtc[1])
        body = request_body(request)
        encode_s = time.monotonic() - t0
        ex, attempts = self._post(body, deadline, call, encoding_key(enc), "request")
        return self._result(ex, obs, dt, seq, attempts, time.monotonic() - t0, encode_s)

    def _result(self, ex: Exchange, obs: Observation, dt: float, seq: int, attempts: int, total: float,
                encode_s: float) -> CallResult:
        try:
            actions, params = decode_response(json.loads(ex.body))
            server = server_seconds(params)
            chunk = ActionChunk(actions=actions, dt=dt, stamp=obs.stamp, source="cloud",
                                model=str(params.get("model", "")), joint_names=self.joint_names, seq=seq,
                                inference_s=total, prefill_s=server.get("prefill_s", 0.0),
                                decode_s=server.get("decode_s", 0.0))
        except (ValueError, TypeError, AttributeError) as e:
            raise CloudError(f"malformed response from the server: {e}", "bad_response") from None
        upload_s, rtt_s = measure(ex, server.get("server_s", 0.0))
        return CallResult(chunk, ex.sent_bytes, upload_s, rtt_s, total, encode_s, attempts, server)

    def _value(self, result: CallResult) -> ActionChunk:
        return result.chunk

    # ---------------------------------------------------------------- public API

    def submit(self, obs: Observation, deadline_s: float, encoding: Encoding = Encoding(), *,
               noise: np.ndarray | None = None, seq: int = 0, dt: float = DEFAULT_DT,
               request_id: str | None = None, rtc_prefix: np.ndarray | None = None,
               rtc_delay: int = 0) -> PendingCall:
        """Starts a call in the background; ``PendingCall.result()`` returns the chunk or raises CloudError.

        Call ``result()`` on every PendingCall: it does the bookkeeping (breaker, link, counters) in the
        caller's thread, so the link estimator is only ever touched from there."""
        deadline, err = self._admit(deadline_s)
        if err is not None:
            return PendingCall.failed(self, err, deadline)
        noise, rtc_prefix, rtc_delay = self.fit_to_served(noise, rtc_prefix, rtc_delay)
        return self._start(deadline, encoding_key(encoding), self._worker, obs, encoding, noise, seq, dt,
                           request_id or uuid.uuid4().hex[:16], (rtc_prefix, rtc_delay))

    def predict(self, obs: Observation, deadline_s: float, encoding: Encoding = Encoding(), *,
                noise: np.ndarray | None = None, seq: int = 0, dt: float = DEFAULT_DT,
                request_id: str | None = None, rtc_prefix: np.ndarray | None = None,
                rtc_delay: int = 0) -> ActionChunk:
        """A chunk from the cloud (source "cloud") within ``deadline_s`` seconds, or CloudError.
        ``rtc_prefix`` (n, action_dim) raw units and ``rtc_delay`` ticks: real-time chunking on the server."""
        return self.submit(obs, deadline_s, encoding, noise=noise, seq=seq, dt=dt, request_id=request_id,
                           rtc_prefix=rtc_prefix, rtc_delay=rtc_delay).result()

    def predict_or_edge(self, obs: Observation, deadline_s: float, edge: Callable[[], ActionChunk],
                        encoding: Encoding = Encoding(), *, hedge: bool = False, edge_reserve_s: float = 0.0,
                        noise: np.ndarray | None = None, seq: int = 0, dt: float = DEFAULT_DT) -> ActionChunk:
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

"""The robot's client for task vqa (scene questions, tasks/vqa.py): a deadline on every call,
retries only when the deadline allows, the circuit breaker, link measurements for the router.

    vqa = VqaClient("http://10.0.0.5:8080", token, link=router.link)
    try:
        answer = vqa.ask("what is on the table?", [rgb], deadline_s=5.0, encoding=Encoding("jpeg", 85, 512))
    except CloudError as e:  # e.reason: deadline, no_budget, breaker_open, connection, server_error, rejected, ...
        ...  # answer on the edge

``ask`` returns or raises by ``deadline_s`` from now, whatever the server and the network do (the
call is aborted and its socket closed). ``ask_stream`` (``infer_stream``: Server-Sent Events) hands the
answer so far to ``on_partial(text)`` as tokens arrive, in the caller's thread, with the same deadline
and breaker; ``stream`` is the same as an iterator of texts so far (its return value, and ``last``, is
the answer). A stream that breaks or stalls past the deadline raises CloudError like a failed ``ask``,
whatever was already handed out: the partial text is never an answer.

    answer = vqa.ask_stream("what is on the table?", [rgb], 5.0, on_partial=show_text_so_far)

The errors, retries, pending call and bookkeeping are base.py's (shared with policy.py): CloudDeadlineExceeded,
CloudUnavailable (breaker open, connection failed, 5xx, a stream broken mid-answer), CloudRejected
(4xx: never retried, does not trip the breaker).
``link``: ``observe(upload_bytes, upload_s, rtt_s, now)`` / ``observe_failure(now)``
(routing.link.LinkEstimator), called from the caller's thread. Use one VqaClient from one thread.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import math
import queue
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from edgefm_ros.cloud.client.base import (SOCKET_GRACE_S, ClientBase, ClientConfig, CloudDeadlineExceeded, CloudError,
                                          CloudRejected, CloudUnavailable, error_text, measure)
from edgefm_ros.cloud.core.protocol import request_body, server_seconds
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.tasks.vqa import decode_vqa_event, decode_vqa_response, encode_vqa_request
from edgefm_ros.cloud.transport import Call

VQA_DEFAULTS = ClientConfig.for_task("vqa")


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
    first_text_s: float = math.nan  # streamed: ask -> the first partial text in the caller's hands


class VqaClient(ClientBase):
    def __init__(self, url: str, token: str | None = None, *, config: ClientConfig = VQA_DEFAULTS,
                 link=None, ca_file: str | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(url, token, config, link, ca_file, clock, "edgefm-vqa-cloud")
        self._stream_path = f"/v2/models/{config.model_name}/infer_stream"
        self.last: VqaAnswer | None = None

    # ---------------------------------------------------------------- one call (worker thread)

    def _encode(self, request: dict, deadline: float) -> tuple[bytes, float, float]:
        """The request body (with the time left when the server should know it) -> (body, t0, encode_s)."""
        t0 = time.monotonic()
        request["parameters"].update(self._request_parameters(deadline))
        body = request_body(request)
        return body, t0, time.monotonic() - t0

    def _worker(self, request: dict, deadline: float, call: Call) -> VqaAnswer:
        body, t0, encode_s = self._encode(request, deadline)
        ex, attempts = self._post(body, deadline, call, None, "question")
        try:
            text, tokens, params = decode_vqa_response(json.loads(ex.body))
        except (ValueError, TypeError, AttributeError) as e:
            raise CloudError(f"malformed response from the server: {e}", "bad_response") from None
        server = server_seconds(params)
        upload_s, rtt_s = measure(ex, server.get("server_s", 0.0))
        return VqaAnswer(text, tokens, str(params.get("model", "")), str(params.get("stop_reason", "")),
                         time.monotonic() - t0, encode_s, ex.sent_bytes, upload_s, rtt_s, attempts, server)

    def _open_stream(self, body: bytes, deadline: float, call: Call):
        """POST to infer_stream with retries (before any answer text) -> (the 200 stream, attempts)."""
        return self._retrying(lambda: self._http.stream("POST", self._stream_path, body,
                                                        deadline - time.monotonic() + SOCKET_GRACE_S, call),
                              deadline, call, None, "question", _refusal_text)

    def _stream_worker(self, request: dict, out: queue.Queue, deadline: float, call: Call) -> None:
        """Reads the answer stream: puts ("delta", text) per token, then ("final", VqaAnswer) or ("error", e)."""
        try:
            out.put(("final", self._read_stream(request, deadline, call, out)))
        except CloudError as e:
            out.put(("error", e))
        except Exception as e:  # a surprise: a failed call, never a crash of the caller
            out.put(("error", CloudError(f"cloud stream failed: {type(e).__name__}: {e}", "client_error")))

    def _read_stream(self, request: dict, deadline: float, call: Call, out: queue.Queue) -> VqaAnswer:
        body, t0, encode_s = self._encode(request, deadline)
        st, attempts = self._open_stream(body, deadline, call)
        streamed, n = [], 0
        try:
            for data in st.events():
                try:
                    ev = decode_vqa_event(json.loads(data))
                except (ValueError, TypeError) as e:
                    raise CloudError(f"malformed stream event from the server: {e}", "bad_response") from None
                if ev.kind == "delta":
                    n += 1
                    if ev.text:
                        streamed.append(ev.text)
                        out.put(("delta", ev.text))
                    continue
                if ev.kind == "error":
                    cls, reason = (CloudUnavailable, "server_error") if ev.status >= 500 else (CloudRejected,
                                                                                               "rejected")
                    raise cls(f"server stopped the answer after {n} tokens ({ev.status}): {ev.error}", reason,
                              ev.status)
                so_far = "".join(streamed)
                if ev.text != so_far:  # answered in one piece (or deltas lost): hand out the rest
                    if not ev.text.startswith(so_far):
                        raise CloudError(f"the streamed text {so_far[:40]!r} is not the start of the answer "
                                         f"{ev.text[:40]!r}", "bad_response")
                    out.put(("delta", ev.text[len(so_far):]))
                server = server_seconds(ev.params)
                upload_s, rtt_s = measure(st, 0.0)  # the head came before generation: no server time in it
                _drain(st)
                return VqaAnswer(ev.text, ev.tokens, str(ev.params.get("model", "")),
                                 str(ev.params.get("stop_reason", "")), time.monotonic() - t0, encode_s,
                                 st.sent_bytes, upload_s, rtt_s, attempts, server)
        except (OSError, http.client.HTTPException) as e:
            if isinstance(e, TimeoutError):
                raise CloudDeadlineExceeded(f"the answer stream stalled after {n} tokens") from None
            raise CloudUnavailable(f"the answer stream broke after {n} tokens: {type(e).__name__}: {e}",
                                   "connection") from None
        finally:
            st.close()
        raise CloudUnavailable(f"the answer stream ended after {n} tokens without a final answer", "connection")

    # ---------------------------------------------------------------- public API

    def _prepare(self, question: str, images: Sequence[np.ndarray], deadline_s: float, encoding: Encoding,
                 request_id: str | None, **sampling) -> tuple[float, dict]:
        """(deadline, request dict), or CloudError (no budget, breaker open) / ValueError (bad input)."""
        deadline, err = self._admit(deadline_s)
        if err is not None:
            raise self.record_failure(err)
        try:  # encoding errors (bad image, bad sampling value) are the caller's: raised as ValueError
            request = encode_vqa_request(question, list(images), encoding, request_id=request_id or uuid.uuid4().hex,
                                         **sampling)
        except (TypeError, OverflowError) as e:
            raise ValueError(f"cannot encode the question: {e}") from None
        return deadline, request

    def ask(self, question: str, images: Sequence[np.ndarray] = (), deadline_s: float = 5.0, *,
            encoding: Encoding = Encoding(), system: str | None = None, max_new_tokens: int = 64,
            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
            request_id: str | None = None) -> VqaAnswer:
        """The cloud's answer within ``deadline_s`` seconds, or CloudError saying why not.

        ``images``: uint8 (H, W, 3) RGB or float32 (3, H, W) in [0, 1], in prompt order."""
        deadline, request = self._prepare(question, images, deadline_s, encoding, request_id, system=system,
                                          max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                          top_p=top_p, seed=seed)
        return self._start(deadline, None, self._worker, request).result()

    def stream(self, question: str, images: Sequence[np.ndarray] = (), deadline_s: float = 5.0, *,
               encoding: Encoding = Encoding(), system: str | None = None, max_new_tokens: int = 64,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
               request_id: str | None = None) -> Iterator[str]:
        """Yields the answer text so far as tokens arrive; returns the VqaAnswer (also ``last``), or raises
        CloudError by ``deadline_s`` from now (time the caller spends between items counts). Closing the
        iterator early abandons the call (counted as ``abandoned``, not as a failure)."""
        deadline, request = self._prepare(question, images, deadline_s, encoding, request_id, system=system,
                                          max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                          top_p=top_p, seed=seed)
        return self._stream(deadline, request)

    def _stream(self, deadline: float, request: dict) -> Iterator[str]:
        call, events = Call(), queue.Queue()
        t0 = time.monotonic()
        self._pool.submit(self._stream_worker, request, events, deadline, call)
        self._count("sent")
        text, first = "", math.nan
        try:
            while True:
                try:
                    kind, value = events.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    call.abort()
                    raise self.record_failure(CloudDeadlineExceeded(
                        f"the answer stream did not finish before the deadline ({len(text)} characters in)")) from None
                if kind == "delta":
                    text += value
                    if math.isnan(first):
                        first = time.monotonic() - t0
                    yield text
                elif kind == "error":
                    raise self.record_failure(value)
                else:
                    break
        except GeneratorExit:
            call.abort()
            self._count("abandoned")
            raise
        return self.record_success(dataclasses.replace(value, first_text_s=first), None)

    def ask_stream(self, question: str, images: Sequence[np.ndarray] = (), deadline_s: float = 5.0, *,
                   on_partial: Callable[[str], None] | None = None, **kw) -> VqaAnswer:
        """``ask`` with the answer streamed: ``on_partial(text_so_far)`` in this thread as tokens arrive
        (``stream``'s keyword arguments). Returns the whole answer or raises CloudError by the deadline."""
        it = self.stream(question, images, deadline_s, **kw)
        try:
            while True:
                try:
                    text = next(it)
                except StopIteration as done:
                    return done.value
                if on_partial is not None:
                    on_partial(text)
        finally:
            it.close()  # on_partial raised: abandon the call now


def _refusal_text(st) -> str:
    """The error text of a stream the server refused (its body read, the stream closed)."""
    try:
        msg = error_text(st.read())
    except (OSError, http.client.HTTPException):
        msg = "(no body)"
    st.close()
    return msg


def _drain(st) -> None:
    """Reads the stream's end after the final event, so its connection can be kept alive."""
    try:
        for _ in st.events():
            pass
    except (OSError, http.client.HTTPException):
        pass  # the answer is complete; the connection is just not reused

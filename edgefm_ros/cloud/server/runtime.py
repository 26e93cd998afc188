"""MLServer custom runtime for every task: model-settings.json names ``VlaRuntime`` or ``VqaRuntime``
(this module) as ``implementation`` and gives ``parameters.extra`` (the task's runtime config).

``load`` builds the task's model on the engine thread and warms it up, so MLServer reports the model
ready only when a request can be served at full speed. Requests are decoded (base64, JPEG) on a small
thread pool, then run one at a time on that single engine thread (``queue_s`` is the wait for it). The
client's budget (``deadline_s``) counts from receipt (core/timing.py): a request whose budget ran out
before the model ran is answered 504 without running. Any refusal is a ProtocolError with its status;
the engine's own input checks (ValueError) answer 400; anything else 500 with the reason.

Streaming (``predict_stream``, REST ``/v2/models/<name>/infer_stream``, Server-Sent Events), for a task
that streams: one "delta" event per generated token, then one "final" event or an "error" event with the
status the plain call would have answered (the stream's HTTP status is already 200 when generation
starts). A client that goes away stops its generation at the next token. Other tasks answer a stream
in one piece. ``GET /v2/models/<name>`` declares every input, output and request parameter.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import (InferenceRequest, InferenceResponse, MetadataModelResponse, MetadataTensor, Parameters,
                            ResponseOutput)

from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor
from edgefm_ros.cloud.core.task import Task
from edgefm_ros.cloud.core.timing import RequestClock
from edgefm_ros.cloud.tasks import TASKS

log = logging.getLogger("edgefm_ros.cloud.server.runtime")


def request_tensors(payload: InferenceRequest) -> list[Tensor]:
    out = []
    for i in payload.inputs:
        params = i.parameters.model_dump(exclude_none=True) if i.parameters is not None else {}
        datatype = getattr(i.datatype, "value", i.datatype)  # an enum or its value, by pydantic config
        out.append(Tensor(i.name, str(datatype), list(i.shape), params, i.data.root))
    return out


def request_parameters(payload: InferenceRequest) -> dict:
    return payload.parameters.model_dump(exclude_none=True) if payload.parameters is not None else {}


def drill_seconds(name: str, value, limit: float) -> float:
    """A drill request parameter in seconds: a number in [0, limit], else 400 naming it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= limit
    if not ok:
        raise ProtocolError(f"parameter {name!r} must be a number of seconds in [0, {limit:g}], got {value!r}")
    return float(value)


def server_error(e: Exception) -> MLServerError:
    """What a request's failure answers: a refusal its status, the engine's input checks 400, else 500."""
    if isinstance(e, MLServerError):
        return e
    if isinstance(e, ProtocolError):
        return MLServerError(str(e), e.status)
    if isinstance(e, ValueError):
        return MLServerError(f"rejected by the engine: {e}", 400)
    return MLServerError(f"internal error: {type(e).__name__}: {e}", 500)


class TaskRuntime(MLModel):
    task: Task

    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self._cfg = self.task.config_type.from_extra(extra)
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix=f"edgefm-{self.task.name}")
        self._decoders = ThreadPoolExecutor(self._cfg.decode_threads,
                                            thread_name_prefix=f"edgefm-{self.task.name}-decode")
        t0 = time.perf_counter()
        self._served = await self._on_engine(self.task.load, self._cfg)
        log.info("edgefm %s model %s (%s) loaded and warmed up in %.2f s", self.task.name, self._served.label,
                 self._served.describe(), time.perf_counter() - t0)
        return True

    async def unload(self) -> bool:
        self._engine_thread.shutdown(wait=False, cancel_futures=True)
        self._decoders.shutdown(wait=False, cancel_futures=True)
        return True

    async def metadata(self) -> MetadataModelResponse:
        m = self._served.metadata()
        return MetadataModelResponse(name=self.name, platform=self.settings.platform or f"edgefm-{self.task.name}",
                                     versions=self.settings.versions,
                                     inputs=[MetadataTensor(**t) for t in m["inputs"]],
                                     outputs=[MetadataTensor(**t) for t in m["outputs"]],
                                     parameters=Parameters(**m["parameters"]))

    async def _on_engine(self, fn: Callable, *args):
        """``fn(*args)`` on the engine thread (one request at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self._engine_thread, fn, *args)

    async def _decode(self, payload: InferenceRequest) -> tuple[Any, dict]:
        """(the checked request, its fault delays) on the decode pool; ProtocolError naming the field."""
        params = request_parameters(payload)
        faults = {}
        for name, limit in self.task.drills:
            value = params.pop(name, 0.0)
            faults[name] = drill_seconds(name, value, limit) if self._cfg.fault_injection else 0.0
        req = await asyncio.get_running_loop().run_in_executor(
            self._decoders, self._served.decode, payload.id or "", params, request_tensors(payload))
        return req, faults

    def _response(self, payload: InferenceRequest, body: dict) -> InferenceResponse:
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 parameters=Parameters(**body["parameters"]),
                                 outputs=[ResponseOutput(**o) for o in body["outputs"]])

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        clock = RequestClock()
        try:
            req, faults = await self._decode(payload)
            clock.mark_decoded()
            body = await self._on_engine(self._served.run, req, clock, faults)
        except Exception as e:  # answered with its status and reason instead of dropping the connection
            err = server_error(e)
            if err.status_code >= 500 and err.status_code != 504:
                log.exception("request %r failed", payload.id)
            raise err from None
        return self._response(payload, body)

    async def predict_stream(self, payloads: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """One request in; a "delta" event per generated token, then "final" (or "error")."""
        if not self.task.streams:
            async for payload in payloads:
                yield await self.predict(payload)
            return
        payload = await payloads.__anext__()
        clock = RequestClock()
        cancel = threading.Event()  # set when this generator is closed early: the client went away
        served = self._served
        try:
            req, faults = await self._decode(payload)
            clock.mark_decoded()
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()

            def on_delta(tok: int, delta: str) -> None:  # engine thread
                loop.call_soon_threadsafe(events.put_nowait, (tok, delta))

            job = loop.run_in_executor(self._engine_thread, served.run, req, clock, faults, on_delta, cancel)

            def done(f) -> None:  # runs on the loop after every delta was queued (same thread, in order)
                if not f.cancelled():
                    f.exception()  # retrieved here: a client that went away never awaits it
                events.put_nowait(None)

            job.add_done_callback(done)
            index = 0
            while (item := await events.get()) is not None:
                yield self._response(payload, served.delta(item[0], item[1], index))
                index += 1
            last = served.final(await job)
        except Exception as e:  # reported in the stream: the HTTP status is already 200
            err = server_error(e)
            if err.status_code >= 500 and err.status_code != 504:
                log.exception("stream %r failed", payload.id)
            last = served.error(err.status_code, str(err))
        finally:
            cancel.set()  # no-op once generation ended; stops it when the client has gone
        yield self._response(payload, last)


class VlaRuntime(TaskRuntime):
    task = TASKS["vla"]


class VqaRuntime(TaskRuntime):
    task = TASKS["vqa"]

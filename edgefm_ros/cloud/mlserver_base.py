"""What our MLServer runtimes (runtime.py, vqa_runtime.py) share: the config from ``parameters.extra``,
payloads decoded on a small thread pool then one engine thread, request parameters and fault delays,
any unexpected exception answered 500 with its reason, responses built from a protocol body.

A subclass sets ``config_type`` (a config with ``from_extra`` and ``decode_threads``), the two thread
names and ``_build(cfg)`` (runs on the engine thread, returns the warmed-up engine), and implements
``_loaded(load_s)`` (limits, the log line) and ``_predict(payload)``. Names stay off MLModel's own
(``decode``, ``ready``, ...).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput

from edgefm_ros.cloud.protocol import ProtocolError, Tensor


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
    """A drill request parameter in seconds (``fault_delay_s``, ``fault_token_delay_s``): a number in
    [0, limit], else 400 naming it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= limit
    if not ok:
        raise MLServerError(f"parameter {name} must be a number of seconds in [0, {limit:g}], got {value!r}", 400)
    return float(value)


def queue_deadline_error(request_id: str, queue_s: float, deadline_s: float) -> MLServerError:
    """504 for a request whose client budget ran out while it waited for the engine thread."""
    return MLServerError(f"request {request_id!r} waited {queue_s:.3f} s in the queue, past its deadline of "
                         f"{deadline_s:.3f} s; not run", 504)


class EngineRuntime(MLModel):
    config_type: Any = None  # has from_extra(extra) and decode_threads
    engine_thread_name = "edgefm-engine"
    decode_thread_name = "edgefm-decode"

    @staticmethod
    def _build(cfg):
        raise NotImplementedError

    def _loaded(self, load_s: float) -> None:
        """After the engine is built: limits, names, the log line."""

    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self._cfg = self.config_type.from_extra(extra)
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix=self.engine_thread_name)
        self._decoders = ThreadPoolExecutor(self._cfg.decode_threads, thread_name_prefix=self.decode_thread_name)
        t0 = time.perf_counter()
        self._engine = await self._on_engine(self._build, self._cfg)
        self._loaded(time.perf_counter() - t0)
        return True

    async def unload(self) -> bool:
        self._engine_thread.shutdown(wait=False, cancel_futures=True)
        self._decoders.shutdown(wait=False, cancel_futures=True)
        return True

    async def _on_engine(self, fn: Callable, *args):
        """``fn(*args)`` on the engine thread (one request at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self._engine_thread, fn, *args)

    async def _decode_on_pool(self, decoder: Callable, payload: InferenceRequest, params: dict):
        """``decoder(request_id, params, tensors, limits)`` on the decode pool; ProtocolError -> its 4xx."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._decoders, decoder, payload.id or "", params, request_tensors(payload), self._limits)
        except ProtocolError as e:
            raise MLServerError(str(e), e.status) from None

    def _response(self, payload: InferenceRequest, body: dict) -> InferenceResponse:
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 parameters=Parameters(**body["parameters"]),
                                 outputs=[ResponseOutput(**o) for o in body["outputs"]])

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        try:
            return await self._predict(payload)
        except MLServerError:
            raise
        except Exception as e:  # answer 500 with the reason instead of dropping the connection
            logging.getLogger(type(self).__module__).exception("request %r failed", payload.id)
            raise MLServerError(f"internal error: {type(e).__name__}: {e}", 500) from None

    async def _predict(self, payload: InferenceRequest) -> InferenceResponse:
        raise NotImplementedError

"""MLServer custom runtime: serves the edgefm Engine over the Open Inference Protocol (REST and gRPC).

model-settings.json names ``edgefm_ros.cloud.runtime.EdgeFMRuntime`` as ``implementation`` and gives
``parameters.extra`` (RuntimeConfig's fields). ``load`` builds the engine and warms it up, so MLServer
reports the model ready only when a chunk can be served at full speed.

Concurrency: requests are decoded (base64, JPEG) on a small thread pool, then run one at a time on a
single engine thread (the runtime is one-request-at-a-time, end to end); ``queue_s`` is the wait for
that thread. More throughput per host: MLServer's ``parallel_workers`` (one engine per worker process)
or more replicas behind KServe. A request whose client budget (``deadline_s``) ran out while it waited
is answered 504 without running the model.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput

from edgefm_ros.cloud.protocol import (DecodedRequest, ProtocolError, RequestLimits, Tensor, decode_request,
                                       encode_response)
from edgefm_ros.cloud.serving import RuntimeConfig

log = logging.getLogger("edgefm_ros.cloud.runtime")


def build_engine(cfg: RuntimeConfig):
    import torch

    from edgefm_ros.runtime.engine import Engine

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    engine = Engine.from_checkpoint(cfg.checkpoint, vlm_dir=cfg.vlm, mode=cfg.mode, threads=cfg.threads,
                                    device=device)
    engine.warmup()
    return engine


def limits_for(spec, cfg: RuntimeConfig) -> RequestLimits:
    return RequestLimits(camera_keys=tuple(spec.camera_keys), state_dim=int(spec.state_dim),
                         noise_shape=(int(spec.chunk_size), int(spec.max_action_dim)),
                         max_side=cfg.max_side, max_image_bytes=cfg.max_image_bytes)


def _tensors(payload: InferenceRequest) -> list[Tensor]:
    out = []
    for i in payload.inputs:
        params = i.parameters.model_dump(exclude_none=True) if i.parameters is not None else {}
        datatype = getattr(i.datatype, "value", i.datatype)  # an enum or its value, by pydantic config
        out.append(Tensor(i.name, str(datatype), list(i.shape), params, i.data.root))
    return out


def _fault_delay(value) -> float:
    try:
        delay = float(value or 0.0)
    except (TypeError, ValueError):
        delay = -1.0
    if not 0.0 <= delay <= 60.0:
        raise MLServerError(f"parameter fault_delay_s must be a number of seconds in [0, 60], got {value!r}", 400)
    return delay


class EdgeFMRuntime(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self._cfg = RuntimeConfig.from_extra(extra)
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="edgefm-engine")
        self._decoders = ThreadPoolExecutor(self._cfg.decode_threads, thread_name_prefix="edgefm-decode")
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        self._engine = await loop.run_in_executor(self._engine_thread, build_engine, self._cfg)
        self._limits = limits_for(self._engine.spec, self._cfg)
        self._runs = 0  # chunks computed (only the engine thread writes it)
        log.info("edgefm engine %s (%s) loaded and warmed up in %.2f s", self._engine.spec.name, self._cfg.mode,
                 time.perf_counter() - t0)
        return True

    async def unload(self) -> bool:
        self._engine_thread.shutdown(wait=False, cancel_futures=True)
        self._decoders.shutdown(wait=False, cancel_futures=True)
        return True

    def _run(self, req: DecodedRequest, received: float, fault_delay_s: float) -> tuple[Any, dict]:
        started = time.perf_counter()
        queue_s = started - received
        if req.deadline_s is not None and queue_s > req.deadline_s:
            raise MLServerError(f"request {req.request_id!r} waited {queue_s:.3f} s in the queue, past its "
                                f"deadline of {req.deadline_s:.3f} s; not run", 504)
        if fault_delay_s > 0:
            time.sleep(fault_delay_s)
        t0 = time.perf_counter()
        try:
            chunk = self._engine.predict(req.obs, noise=req.noise, dt=req.dt, seq=req.seq, source="cloud")
        except ValueError as e:  # the engine's input checks
            raise MLServerError(f"rejected by the engine: {e}", 400) from None
        engine_s = time.perf_counter() - t0
        t = self._engine.last_timings
        self._runs += 1
        return chunk, {"queue_s": queue_s, "engine_s": engine_s, "prefill_s": t.prefill_s, "decode_s": t.decode_s,
                       "runs": self._runs}

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        try:
            return await self._predict(payload)
        except MLServerError:
            raise
        except Exception as e:  # answer 500 with the reason instead of dropping the connection
            log.exception("request %r failed", payload.id)
            raise MLServerError(f"internal error: {type(e).__name__}: {e}", 500) from None

    async def _predict(self, payload: InferenceRequest) -> InferenceResponse:
        received = time.perf_counter()
        loop = asyncio.get_running_loop()
        params = payload.parameters.model_dump(exclude_none=True) if payload.parameters is not None else {}
        fault_delay_s = _fault_delay(params.pop("fault_delay_s", 0.0)) if self._cfg.fault_injection else 0.0
        try:
            req = await loop.run_in_executor(self._decoders, decode_request, payload.id or "", params,
                                             _tensors(payload), self._limits)
        except ProtocolError as e:
            raise MLServerError(str(e), e.status) from None
        decoded = time.perf_counter()
        chunk, timings = await loop.run_in_executor(self._engine_thread, self._run, req, decoded, fault_delay_s)
        timings["decode_input_s"] = decoded - received
        timings["server_s"] = time.perf_counter() - received
        runs = timings.pop("runs")
        body = encode_response(chunk.actions, self._engine.spec.name, req.seq, timings)
        body["parameters"]["runs"] = runs
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 parameters=Parameters(**body["parameters"]),
                                 outputs=[ResponseOutput(**o) for o in body["outputs"]])

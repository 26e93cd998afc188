"""MLServer custom runtime: serves the edgefm Engine over the Open Inference Protocol (REST and gRPC).

model-settings.json names ``edgefm_ros.cloud.runtime.EdgeFMRuntime`` as ``implementation`` and gives
``parameters.extra`` (RuntimeConfig's fields). ``load`` builds the engine and warms it up, so MLServer
reports the model ready only when a chunk can be served at full speed.

Concurrency: requests are decoded (base64, JPEG) on a small thread pool, then run one at a time on a
single engine thread (the runtime is one-request-at-a-time, end to end); ``queue_s`` is the wait for
that thread. More throughput per host: MLServer's ``parallel_workers`` (one engine per worker process)
or more replicas behind KServe. A request whose client budget (``deadline_s``) ran out while it waited
is answered 504 without running the model. The skeleton (load, pools, errors) is mlserver_base.py's.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse

from edgefm_ros.cloud.mlserver_base import EngineRuntime, drill_seconds, queue_deadline_error, request_parameters
from edgefm_ros.cloud.protocol import DecodedRequest, RequestLimits, decode_request, encode_response
from edgefm_ros.cloud.serving import RuntimeConfig

log = logging.getLogger("edgefm_ros.cloud.runtime")


def build_engine(cfg: RuntimeConfig):
    import torch

    from edgefm_ros.runtime.engine import Engine

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    engine = Engine.from_checkpoint(cfg.checkpoint, vlm_dir=cfg.vlm, mode=cfg.mode, threads=cfg.threads,
                                    device=device, vision_position_ids=cfg.vision_position_ids)
    engine.warmup()
    return engine


def limits_for(spec, cfg: RuntimeConfig) -> RequestLimits:
    return RequestLimits(camera_keys=tuple(spec.camera_keys), state_dim=int(spec.state_dim),
                         noise_shape=(int(spec.chunk_size), int(spec.max_action_dim)),
                         max_side=cfg.max_side, max_image_bytes=cfg.max_image_bytes)


class EdgeFMRuntime(EngineRuntime):
    config_type = RuntimeConfig
    _build = staticmethod(build_engine)

    def _loaded(self, load_s: float) -> None:
        self._limits = limits_for(self._engine.spec, self._cfg)
        self._runs = 0  # chunks computed (only the engine thread writes it)
        log.info("edgefm engine %s (%s, vision position ids %s) loaded and warmed up in %.2f s",
                 self._engine.spec.name, self._cfg.mode, self._engine.vision_position_ids, load_s)

    def _run(self, req: DecodedRequest, received: float, fault_delay_s: float) -> tuple[Any, dict]:
        started = time.perf_counter()
        queue_s = started - received
        if req.deadline_s is not None and queue_s > req.deadline_s:
            raise queue_deadline_error(req.request_id, queue_s, req.deadline_s)
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

    async def _predict(self, payload: InferenceRequest) -> InferenceResponse:
        received = time.perf_counter()
        params = request_parameters(payload)
        fault_delay_s = 0.0
        if self._cfg.fault_injection:
            fault_delay_s = drill_seconds("fault_delay_s", params.pop("fault_delay_s", 0.0), 60.0)
        req = await self._decode_on_pool(decode_request, payload, params)
        decoded = time.perf_counter()
        chunk, timings = await self._on_engine(self._run, req, decoded, fault_delay_s)
        timings["decode_input_s"] = decoded - received
        timings["server_s"] = time.perf_counter() - received
        runs = timings.pop("runs")
        body = encode_response(chunk.actions, self._engine.spec.name, req.seq, timings)
        body["parameters"]["runs"] = runs
        return self._response(payload, body)

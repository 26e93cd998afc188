"""MLServer custom runtime: scene questions answered by the autoregressive engine (runtime/generate.py)
over the Open Inference Protocol (REST and gRPC); the tensors are in vqa_protocol.py.

model-settings.json names ``edgefm_ros.cloud.vqa_runtime.VqaRuntime`` as ``implementation`` and gives
``parameters.extra`` (VqaRuntimeConfig's fields). ``load`` builds the LlmEngine and runs a short warm-up
generation, so MLServer reports the model ready only when a question can be answered at full speed.

Concurrency as in runtime.py (the shared skeleton is mlserver_base.py): payloads are decoded on a small
thread pool, generation runs one request at a time on a single engine thread (``queue_s`` is the wait
for it). A request whose client budget (``deadline_s``) ran out while it was queued is answered 504
without running; one whose budget runs out while its answer is generated is stopped at the next token
and answered 504 too (nobody waits for it).

Streaming (``predict_stream``, REST ``/v2/models/<name>/infer_stream``, Server-Sent Events): the same
request; one "delta" event per generated token as the engine produces it, then one "final" event (the
whole response) or an "error" event with the status the plain call would have answered (the stream's
HTTP status is already 200 when generation starts). A client that goes away stops its generation at the
next token. With ``--fault-injection`` the request parameter ``fault_token_delay_s`` slows every token
(drills: a stream that is still running when the server is killed).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import AsyncIterator

import numpy as np
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse

from edgefm_ros.cloud.mlserver_base import EngineRuntime, drill_seconds, queue_deadline_error, request_parameters
from edgefm_ros.cloud.vqa_protocol import (VqaLimits, VqaRequest, decode_vqa_request, encode_vqa_delta,
                                           encode_vqa_error, encode_vqa_final, encode_vqa_response, vqa_messages)
from edgefm_ros.cloud.vqa_settings import VqaRuntimeConfig

log = logging.getLogger("edgefm_ros.cloud.vqa_runtime")


class _OutOfTime(Exception):
    pass


class _Cancelled(Exception):
    pass


def build_llm_engine(cfg: VqaRuntimeConfig):
    from edgefm_ros.runtime.generate import LlmEngine, LlmEngineConfig, SamplingConfig
    from edgefm_ros.runtime.gguf_loader import smollm2_gguf_path

    ec = LlmEngineConfig(mode=cfg.mode, kv_codec=cfg.kv_codec, capacity=cfg.capacity, threads=cfg.threads)
    if cfg.model and not cfg.model.endswith(".gguf"):
        engine = LlmEngine.from_dir(cfg.model, ec)
    else:
        engine = LlmEngine.from_gguf(cfg.model or smollm2_gguf_path(), ec)
    warm = [] if engine.vlm is None else [np.full((64, 64, 3), 128, dtype=np.uint8)]  # exercises the vision path
    engine.generate(vqa_messages("What do you see?", len(warm)), SamplingConfig(max_new_tokens=2), None, warm or None)
    return engine


def limits_for(engine, cfg: VqaRuntimeConfig) -> VqaLimits:
    return VqaLimits(max_images=cfg.max_images if engine.vlm is not None else 0, max_side=cfg.max_side,
                     max_image_bytes=cfg.max_image_bytes, max_question_chars=cfg.max_question_chars,
                     max_new_tokens=cfg.max_new_tokens)


class VqaRuntime(EngineRuntime):
    config_type = VqaRuntimeConfig
    engine_thread_name, decode_thread_name = "edgefm-vqa", "edgefm-vqa-decode"
    _build = staticmethod(build_llm_engine)

    def _loaded(self, load_s: float) -> None:
        self._limits = limits_for(self._engine, self._cfg)
        self._model = "smolvlm2" if self._engine.vlm is not None else "smollm2"
        log.info("edgefm VQA engine %s (%s, %d KV positions) loaded and warmed up in %.2f s", self._model,
                 self._cfg.mode, self._cfg.capacity, load_s)

    def _run(self, req: VqaRequest, received: float, decoded: float, faults: tuple[float, float],
             on_delta=None, cancel: threading.Event | None = None):
        """Generation on the engine thread; ``on_delta(token, text)`` per token (streaming), ``cancel``
        set: stop at the next token. ``faults``: (delay before, delay per token) in seconds (drills)."""
        from edgefm_ros.runtime.generate import SamplingConfig

        cancel = cancel or threading.Event()
        started = time.perf_counter()
        queue_s = started - decoded
        end = None if req.deadline_s is None else received + req.deadline_s
        if end is not None and started > end:
            raise queue_deadline_error(req.request_id, queue_s, req.deadline_s)
        if faults[0] > 0:
            cancel.wait(faults[0])
        try:
            s = SamplingConfig(max_new_tokens=req.max_new_tokens, temperature=req.temperature, top_k=req.top_k,
                               top_p=req.top_p, seed=req.seed)
        except ValueError as e:
            raise MLServerError(f"bad sampling parameters: {e}", 400) from None
        n = [0]

        def on_token(tok, delta):
            n[0] += 1
            if faults[1] > 0:
                cancel.wait(faults[1])
            if cancel.is_set():
                raise _Cancelled
            if end is not None and time.perf_counter() > end:
                raise _OutOfTime
            if on_delta is not None:
                on_delta(tok, delta)

        t0 = time.perf_counter()
        try:
            out = self._engine.generate(vqa_messages(req.question, len(req.images), req.system), s, on_token,
                                        list(req.images) or None)
        except _OutOfTime:
            raise MLServerError(f"request {req.request_id!r}: deadline of {req.deadline_s:.3f} s ran out after "
                                f"{n[0]} generated tokens; stopped", 504) from None
        except _Cancelled:
            raise MLServerError(f"request {req.request_id!r}: the client went away after {n[0]} generated "
                                "tokens; stopped", 499) from None
        except ValueError as e:  # GenerationError and the image checks: the request's fault
            raise MLServerError(f"rejected by the engine: {e}", 400) from None
        engine_s = time.perf_counter() - t0
        timings = {"queue_s": queue_s, "engine_s": engine_s, "prefill_s": out.ttft_s, "decode_s": out.decode_s}
        counts = {"prompt_tokens": out.prompt_tokens, "prefilled_tokens": out.prefilled_tokens,
                  "tokens_generated": len(out.tokens)}
        return out, counts, timings

    async def _decode(self, payload: InferenceRequest) -> tuple[VqaRequest, tuple[float, float]]:
        """The checked request and its fault delays; MLServerError (4xx) naming the bad field."""
        params = request_parameters(payload)
        faults = (0.0, 0.0)
        if self._cfg.fault_injection:
            faults = (drill_seconds("fault_delay_s", params.pop("fault_delay_s", 0.0), 60.0),
                      drill_seconds("fault_token_delay_s", params.pop("fault_token_delay_s", 0.0), 10.0))
        return await self._decode_on_pool(decode_vqa_request, payload, params), faults

    def _answer(self, out, counts: dict, timings: dict, received: float, decoded: float) -> dict:
        timings["decode_input_s"] = decoded - received
        timings["server_s"] = time.perf_counter() - received
        return encode_vqa_response(out.text, out.tokens, self._model, out.stop_reason, counts, timings)

    async def _predict(self, payload: InferenceRequest) -> InferenceResponse:
        received = time.perf_counter()
        req, faults = await self._decode(payload)
        decoded = time.perf_counter()
        out, counts, timings = await self._on_engine(self._run, req, received, decoded, faults)
        return self._response(payload, self._answer(out, counts, timings, received, decoded))

    async def predict_stream(self, payloads: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """One request in; a "delta" event per generated token, then "final" (or "error")."""
        payload = await payloads.__anext__()
        received = time.perf_counter()
        cancel = threading.Event()  # set when this generator is closed early: the client went away
        try:
            req, faults = await self._decode(payload)
            decoded = time.perf_counter()
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()

            def on_delta(tok: int, delta: str) -> None:  # engine thread
                loop.call_soon_threadsafe(events.put_nowait, (tok, delta))

            job = loop.run_in_executor(self._engine_thread, self._run, req, received, decoded, faults, on_delta,
                                       cancel)
            def done(f) -> None:  # runs on the loop after every delta was queued (same thread, in order)
                if not f.cancelled():
                    f.exception()  # retrieved here: a client that went away never awaits it
                events.put_nowait(None)

            job.add_done_callback(done)
            index = 0
            while (item := await events.get()) is not None:
                yield self._response(payload, encode_vqa_delta(item[0], item[1], index))
                index += 1
            out, counts, timings = await job
            last = encode_vqa_final(self._answer(out, counts, timings, received, decoded))
        except MLServerError as e:
            last = encode_vqa_error(e.status_code, str(e))
        except Exception as e:  # report it in the stream instead of dropping the connection
            log.exception("stream %r failed", payload.id)
            last = encode_vqa_error(500, f"internal error: {type(e).__name__}: {e}")
        finally:
            cancel.set()  # no-op once generation ended; stops it when the client has gone
        yield self._response(payload, last)

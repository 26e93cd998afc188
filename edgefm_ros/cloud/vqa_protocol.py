"""Scene question -> Open Inference Protocol (KServe v2) request, and answer <- v2 response.

Request (REST JSON; the same tensors over gRPC, with bytes instead of base64 text):
  id: request id (echoed in the response)
  parameters: {"max_new_tokens", "temperature" (0: greedy), "top_k", "top_p", "seed" (sampling),
               "deadline_s" (budget left when sent, optional)}
  inputs:
    "question"   BYTES [1]  utf-8 question
    "system"     BYTES [1]  utf-8 system message (optional)
    "image_<i>"  BYTES [1]  i = 0..n-1, in prompt order; the cloud image codecs (images.py): raw uint8
                            (H, W, 3) / float32 (3, H, W), or JPEG; base64 text over REST
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

The prompt is the same on the edge and in the cloud: ``vqa_messages``. Everything a request carries is
checked here before any model code runs; ProtocolError names the bad field (400, or 413 too large).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from edgefm_ros.cloud.images import Encoding, encode_image
from edgefm_ros.cloud.protocol import ProtocolError, Tensor, _b64, _image, _one_bytes

QUESTION, SYSTEM, ANSWER, TOKENS, IMAGE_PREFIX = "question", "system", "answer", "tokens", "image_"
DELTA = "delta"
EVENTS = ("delta", "final", "error")
TIMING_KEYS = ("queue_s", "decode_input_s", "prefill_s", "decode_s", "engine_s", "server_s")
COUNT_KEYS = ("prompt_tokens", "prefilled_tokens", "tokens_generated")


def vqa_messages(question: str, n_images: int, system: str | None = None) -> list[dict]:
    """Chat messages of a scene question: [system], user (``n_images`` image markers, then the text)."""
    content: Any = question
    if n_images:
        content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": question}]
    user = {"role": "user", "content": content}
    return [{"role": "system", "content": system}, user] if system else [user]


@dataclass(frozen=True)
class VqaLimits:
    """What the server accepts; everything else is refused with a 4xx."""

    max_images: int = 4  # 0: a text-only model
    max_side: int = 2048  # pixels per image side
    max_image_bytes: int = 16 << 20  # one decoded payload
    max_question_chars: int = 4096  # question and system message, each
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        if self.max_images < 0:
            raise ValueError(f"VqaLimits.max_images must be >= 0, got {self.max_images!r}")
        for k in ("max_side", "max_image_bytes", "max_question_chars", "max_new_tokens"):
            if getattr(self, k) <= 0:
                raise ValueError(f"VqaLimits.{k} must be positive, got {getattr(self, k)!r}")


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


# ---------------------------------------------------------------- client side

def encode_vqa_request(question: str, images: Sequence[np.ndarray] = (), enc: Encoding = Encoding(), *,
                       request_id: str, system: str | None = None, max_new_tokens: int = 64,
                       temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                       deadline_s: float | None = None, extra: Mapping[str, Any] | None = None) -> dict:
    """Question (+ images, in prompt order) -> v2 REST request dict (images as base64 text)."""
    inputs = [{"name": QUESTION, "datatype": "BYTES", "shape": [1], "data": [question]}]
    if system:
        inputs.append({"name": SYSTEM, "datatype": "BYTES", "shape": [1], "data": [system]})
    for i, img in enumerate(images):
        payload, params = encode_image(img, enc)
        inputs.append({"name": f"{IMAGE_PREFIX}{i}", "datatype": "BYTES", "shape": [1], "parameters": params,
                       "data": [_b64(payload)]})
    params: dict[str, Any] = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
                              "top_k": int(top_k), "top_p": float(top_p)}
    if seed is not None:
        params["seed"] = int(seed)
    if deadline_s is not None:
        params["deadline_s"] = float(deadline_s)
    params.update(extra or {})
    return {"id": request_id, "parameters": params, "inputs": inputs}


def decode_vqa_response(body: Mapping[str, Any]) -> tuple[str, tuple[int, ...], dict]:
    """v2 response dict -> (answer text, generated token ids, parameters); ValueError if malformed."""
    outs = {o.get("name"): o for o in body.get("outputs", []) if isinstance(o, Mapping)}
    for need in (ANSWER, TOKENS):
        if need not in outs:
            raise ValueError(f"response has no {need!r} output (outputs: {sorted(map(str, outs))})")
    text = outs[ANSWER].get("data")
    if not (isinstance(text, list) and len(text) == 1 and isinstance(text[0], str)):
        raise ValueError(f"response 'answer' must hold one text, got {text!r}")
    ids = outs[TOKENS].get("data")
    if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ValueError(f"response 'tokens' must be a list of ints, got {str(ids)[:80]}")
    return text[0], tuple(ids), dict(body.get("parameters") or {})


# ---------------------------------------------------------------- server side

def _text(t: Tensor, limits: VqaLimits) -> str:
    raw = _one_bytes(t)
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ProtocolError(f"input {t.name!r} is not valid utf-8") from None
    if not text.strip() or len(text) > limits.max_question_chars:
        raise ProtocolError(f"input {t.name!r} must be 1..{limits.max_question_chars} characters of text, "
                            f"got {len(text.strip())}")
    return text


def _number(p: Mapping[str, Any], name: str, default, kind: type, lo: float, hi: float):
    v = p.get(name, default)
    if v is None and default is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and kind is int:
        ok = float(v).is_integer()
    if not (ok and lo <= v <= hi):
        what = "an integer" if kind is int else "a number"
        raise ProtocolError(f"parameter {name!r} must be {what} in [{lo:g}, {hi:g}], got {v!r}")
    return kind(v)


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
    by_name: dict[str, Tensor] = {}
    for t in inputs:
        if t.name in by_name:
            raise ProtocolError(f"input {t.name!r} given twice")
        by_name[t.name] = t
    unknown = [n for n in by_name if n not in (QUESTION, SYSTEM) and not n.startswith(IMAGE_PREFIX)]
    if unknown:
        raise ProtocolError(f"unknown input(s) {unknown}; expected {QUESTION!r}, {SYSTEM!r}, {IMAGE_PREFIX}<i>")
    if QUESTION not in by_name:
        raise ProtocolError(f"missing input {QUESTION!r}")
    names = _image_names(list(by_name), limits)
    p = params or {}
    max_new = _number(p, "max_new_tokens", 64, int, 1, limits.max_new_tokens)
    temperature = _number(p, "temperature", 0.0, float, 0.0, 100.0)
    top_k = _number(p, "top_k", 0, int, 0, 1 << 30)
    top_p = _number(p, "top_p", 1.0, float, 1e-9, 1.0)
    seed = _number(p, "seed", None, int, 0, (1 << 63) - 1)
    deadline = _number(p, "deadline_s", None, float, 0.0, 1e6)
    question = _text(by_name[QUESTION], limits)
    system = _text(by_name[SYSTEM], limits) if SYSTEM in by_name else None
    images = tuple(_image(by_name[n], limits) for n in names)  # limits: max_side, max_image_bytes
    return VqaRequest(str(request_id or ""), question, system, images, max_new, temperature, top_k, top_p, seed,
                      deadline)


def encode_vqa_response(text: str, tokens: Sequence[int], model: str, stop_reason: str,
                        counts: Mapping[str, int], timings: Mapping[str, float]) -> dict:
    """-> the ``outputs`` and ``parameters`` of a v2 response (the server library adds id and model name)."""
    params: dict[str, Any] = {"model": model, "stop_reason": stop_reason}
    params.update({k: int(counts.get(k, 0)) for k in COUNT_KEYS})
    params.update({k: float(timings.get(k, 0.0)) for k in TIMING_KEYS})
    ids = [int(i) for i in tokens]
    return {"outputs": [{"name": ANSWER, "datatype": "BYTES", "shape": [1], "data": [text]},
                        {"name": TOKENS, "datatype": "INT64", "shape": [len(ids)], "data": ids}],
            "parameters": params}


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
    return {"outputs": [{"name": DELTA, "datatype": "BYTES", "shape": [1], "data": [delta]}],
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
        text, ids, p = decode_vqa_response(body)
        return VqaEvent("final", text=text, tokens=ids, params={k: v for k, v in p.items() if k != "event"})
    outs = [o for o in body.get("outputs", []) if isinstance(o, Mapping) and o.get("name") == DELTA]
    data = outs[0].get("data") if len(outs) == 1 else None
    if not (isinstance(data, list) and len(data) == 1 and isinstance(data[0], str)):
        raise ValueError(f"delta event must hold one {DELTA!r} text, got {str(body.get('outputs'))[:80]}")
    token = params.get("token")
    if not (isinstance(token, int) and not isinstance(token, bool) and token >= 0):
        raise ValueError(f"delta event token must be an id >= 0, got {token!r}")
    return VqaEvent("delta", text=data[0], token=token)

"""Observation -> Open Inference Protocol (KServe v2) request, and action chunk <- v2 response.

Request (REST JSON; the same tensors over gRPC, with bytes instead of base64 text):
  id: request id (echoed in the response)
  parameters: {"stamp", "dt", "seq", "missing": [camera keys], "deadline_s" (budget left, optional)}
  inputs:
    "state"       FP32  [state_dim]
    "task"        BYTES [1]   utf-8 instruction
    <camera key>  BYTES [1]   one per camera sent; base64 text over REST; parameters say how to read the
                              bytes (images.py): raw uint8 (H, W, 3) / float32 (3, H, W), or JPEG
    "noise"       FP32  [chunk_size, max_action_dim]  (optional: exact-mode comparisons)
Response:
  outputs: "actions" FP32 [chunk_size, action_dim] (unnormalised)
  parameters: {"model", "seq", "runs" (chunks computed by this server so far), and seconds: "queue_s"
               (wait for the engine), "decode_input_s" (payload decoding), "engine_s" (Engine.predict:
               preprocessing + "prefill_s" + "decode_s" + postprocessing), "server_s" (request
               received -> response ready, inside the runtime)}

Everything a request carries is checked here, before any model code runs; ProtocolError carries the
HTTP status to answer with (400 malformed, 413 too large) and a message naming the bad value.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from edgefm_ros.cloud.images import Encoding, ImageError, decode_image, encode_image
from edgefm_ros.types import Observation

STATE, TASK, NOISE, ACTIONS = "state", "task", "noise", "actions"
TIMING_KEYS = ("queue_s", "decode_input_s", "engine_s", "prefill_s", "decode_s", "server_s")


class ProtocolError(ValueError):
    """A request the server refuses before the model runs; ``status`` is the HTTP code to answer."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Tensor(NamedTuple):
    """One v2 input/output, independent of the server library: data is the flat or nested list."""

    name: str
    datatype: str
    shape: Sequence[int]
    parameters: Mapping[str, Any]
    data: Any


@dataclass(frozen=True)
class RequestLimits:
    """What the server accepts; everything else is refused with a 4xx."""

    camera_keys: tuple[str, ...]  # the model's cameras; more or other keys are refused
    state_dim: int
    noise_shape: tuple[int, int]  # (chunk_size, max_action_dim)
    max_side: int = 2048  # pixels per image side
    max_image_bytes: int = 16 << 20  # one decoded payload
    max_task_chars: int = 1024

    def __post_init__(self) -> None:
        if not self.camera_keys:
            raise ValueError("RequestLimits.camera_keys is empty")
        for k in ("state_dim", "max_side", "max_image_bytes", "max_task_chars"):
            if getattr(self, k) <= 0:
                raise ValueError(f"RequestLimits.{k} must be positive, got {getattr(self, k)!r}")


@dataclass(frozen=True)
class DecodedRequest:
    request_id: str
    obs: Observation
    noise: np.ndarray | None  # float32 (chunk_size, max_action_dim)
    dt: float
    seq: int
    deadline_s: float | None  # budget the client had left when it sent the request


# ---------------------------------------------------------------- client side

def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def encode_request(obs: Observation, enc: Encoding, *, request_id: str, dt: float, seq: int = 0,
                   noise: np.ndarray | None = None, deadline_s: float | None = None,
                   extra: Mapping[str, Any] | None = None) -> dict:
    """Observation -> v2 REST request dict (images as base64 text)."""
    state = np.asarray(obs.state, dtype=np.float32)
    inputs = [{"name": STATE, "datatype": "FP32", "shape": [int(state.shape[0])], "data": state.tolist()},
              {"name": TASK, "datatype": "BYTES", "shape": [1], "data": [obs.task]}]
    for key, img in obs.images.items():
        payload, params = encode_image(img, enc)
        inputs.append({"name": key, "datatype": "BYTES", "shape": [1], "parameters": params, "data": [_b64(payload)]})
    if noise is not None:
        n = np.asarray(noise, dtype=np.float32)
        inputs.append({"name": NOISE, "datatype": "FP32", "shape": list(n.shape), "data": n.ravel().tolist()})
    params: dict[str, Any] = {"stamp": float(obs.stamp), "dt": float(dt), "seq": int(seq), "missing": list(obs.missing)}
    if deadline_s is not None:
        params["deadline_s"] = float(deadline_s)
    params.update(extra or {})
    return {"id": request_id, "parameters": params, "inputs": inputs}


def request_body(request: dict) -> bytes:
    """JSON bytes (orjson when installed: about 4x faster on megabytes of base64 than the stdlib)."""
    try:
        import orjson
    except ImportError:
        return json.dumps(request, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return orjson.dumps(request)


def decode_response(body: Mapping[str, Any]) -> tuple[np.ndarray, dict]:
    """v2 response dict -> (float32 (chunk, action_dim) actions, parameters); ValueError if malformed."""
    outs = {o.get("name"): o for o in body.get("outputs", []) if isinstance(o, Mapping)}
    if ACTIONS not in outs:
        raise ValueError(f"response has no {ACTIONS!r} output (outputs: {sorted(map(str, outs))})")
    o = outs[ACTIONS]
    shape = o.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2):
        raise ValueError(f"response actions shape must be [chunk, action_dim], got {shape!r}")
    actions = np.asarray(o.get("data"), dtype=np.float32).reshape(shape)
    return actions, dict(body.get("parameters") or {})


# ---------------------------------------------------------------- server side

def _float_tensor(t: Tensor, shape: tuple[int, ...]) -> np.ndarray:
    if t.datatype != "FP32":
        raise ProtocolError(f"input {t.name!r} must be FP32, got {t.datatype}")
    if list(t.shape) != list(shape):
        raise ProtocolError(f"input {t.name!r} must have shape {list(shape)}, got {list(t.shape)}")
    try:
        a = np.asarray(t.data, dtype=np.float32).reshape(shape)
    except (TypeError, ValueError):
        raise ProtocolError(f"input {t.name!r}: data is not {math.prod(shape)} numbers "
                            f"of shape {list(shape)}") from None
    if not np.all(np.isfinite(a)):
        raise ProtocolError(f"input {t.name!r} holds non-finite values")
    return a


def _one_bytes(t: Tensor) -> bytes | str:
    if t.datatype != "BYTES" or list(t.shape) != [1]:
        raise ProtocolError(f"input {t.name!r} must be BYTES of shape [1], got {t.datatype} {list(t.shape)}")
    data = t.data
    if not (isinstance(data, (list, tuple)) and len(data) == 1 and isinstance(data[0], (bytes, str))):
        raise ProtocolError(f"input {t.name!r} must hold exactly one byte string")
    return data[0]


def _task(t: Tensor, limits: RequestLimits) -> str:
    raw = _one_bytes(t)
    try:
        task = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ProtocolError("input 'task' is not valid utf-8") from None
    if not task.strip() or len(task) > limits.max_task_chars:
        raise ProtocolError(f"input 'task' must be 1..{limits.max_task_chars} characters, got {len(task)}")
    return task


def _image(t: Tensor, limits: RequestLimits) -> np.ndarray:
    raw = _one_bytes(t)
    if isinstance(raw, str):  # REST: base64 text
        if len(raw) > limits.max_image_bytes * 4 // 3 + 4:
            raise ProtocolError(f"input {t.name!r}: image payload over {limits.max_image_bytes} bytes", 413)
        try:
            raw = binascii.a2b_base64(raw, strict_mode=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(f"input {t.name!r}: image payload is not base64") from None
    if len(raw) > limits.max_image_bytes:
        raise ProtocolError(f"input {t.name!r}: image payload of {len(raw)} bytes over {limits.max_image_bytes}", 413)
    try:
        return decode_image(raw, dict(t.parameters or {}), limits.max_side, t.name)
    except ImageError as e:
        raise ProtocolError(str(e)) from None


def _params(p: Mapping[str, Any], limits: RequestLimits) -> tuple[float, int, float, float | None, tuple[str, ...]]:
    try:
        stamp, dt, seq = float(p.get("stamp", 0.0)), float(p.get("dt", 1 / 30)), int(p.get("seq", 0))
        deadline = None if p.get("deadline_s") is None else float(p["deadline_s"])
    except (TypeError, ValueError):
        raise ProtocolError(f"request parameters stamp/dt/seq/deadline_s must be numbers, got {dict(p)}") from None
    if not (math.isfinite(dt) and dt > 0 and math.isfinite(stamp) and seq >= 0):
        raise ProtocolError(f"request parameters need finite stamp, dt > 0 and seq >= 0, got {stamp}, {dt}, {seq}")
    missing = p.get("missing", [])
    if not (isinstance(missing, list) and all(m in limits.camera_keys for m in missing)):
        raise ProtocolError(f"parameter 'missing' must list camera keys of {limits.camera_keys}, got {missing!r}")
    return stamp, dt, seq, deadline, tuple(missing)


def decode_request(request_id: str, params: Mapping[str, Any], inputs: Sequence[Tensor],
                   limits: RequestLimits) -> DecodedRequest:
    """Validate and decode a v2 request; raises ProtocolError naming the first problem found."""
    by_name: dict[str, Tensor] = {}
    for t in inputs:
        if t.name in by_name:
            raise ProtocolError(f"input {t.name!r} given twice")
        by_name[t.name] = t
    cameras = [n for n in by_name if n not in (STATE, TASK, NOISE)]
    if len(cameras) > len(limits.camera_keys):
        raise ProtocolError(f"too many cameras: {len(cameras)} sent, the model takes {len(limits.camera_keys)} "
                            f"({', '.join(limits.camera_keys)})")
    unknown = [n for n in cameras if n not in limits.camera_keys]
    if unknown:
        raise ProtocolError(f"unknown input(s) {unknown}; cameras are {list(limits.camera_keys)}")
    if not cameras:
        raise ProtocolError(f"no camera image sent; cameras are {list(limits.camera_keys)}")
    for need in (STATE, TASK):
        if need not in by_name:
            raise ProtocolError(f"missing input {need!r}")
    stamp, dt, seq, deadline, missing = _params(params or {}, limits)
    state = _float_tensor(by_name[STATE], (limits.state_dim,))
    task = _task(by_name[TASK], limits)
    noise = _float_tensor(by_name[NOISE], limits.noise_shape) if NOISE in by_name else None
    images = {k: _image(by_name[k], limits) for k in cameras}
    obs = Observation(images=images, state=state, task=task, stamp=stamp, missing=missing)
    return DecodedRequest(str(request_id or ""), obs, noise, dt, seq, deadline)


def encode_response(actions: np.ndarray, model: str, seq: int, timings: Mapping[str, float]) -> dict:
    """-> the ``outputs`` and ``parameters`` of a v2 response (the server library adds id and model name)."""
    a = np.asarray(actions, dtype=np.float32)
    params: dict[str, Any] = {"model": model, "seq": int(seq)}
    params.update({k: float(timings.get(k, 0.0)) for k in TIMING_KEYS})
    return {"outputs": [{"name": ACTIONS, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}],
            "parameters": params}

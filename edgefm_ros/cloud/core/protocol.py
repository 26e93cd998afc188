"""The Open Inference Protocol (KServe v2) pieces every task uses: tensors, the image convention,
request parameters, and the checks a request must pass (ProtocolError names the field; 4xx).

Images travel as one BYTES [1] input each: base64 text over REST, plain bytes over gRPC, with the
parameters images.py describes (``image_encoding`` raw | jpeg; raw also ``image_dtype`` and
``image_shape``). An image input without its own ``image_encoding`` takes the request-level parameters
of those names (a client that cannot set per-input parameters, e.g. tritonclient, sends them there).
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from edgefm_ros.cloud.images import ENCODINGS, Encoding, ImageError, decode_image, encode_image

IMAGE_PARAMETERS = ("image_encoding", "image_dtype", "image_shape")
TIMING_KEYS = ("queue_s", "decode_input_s", "engine_s", "prefill_s", "decode_s", "server_s")
DEADLINE_MAX_S = 1e6


class ProtocolError(ValueError):
    """A request the server refuses; ``status`` is the HTTP code to answer (400, 413, 504, ...)."""

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


# ---------------------------------------------------------------- client side: building a request

def b64_text(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def text_input(name: str, text: str) -> dict:
    return {"name": name, "datatype": "BYTES", "shape": [1], "data": [text]}


def float_input(name: str, a: np.ndarray) -> dict:
    a = np.asarray(a, dtype=np.float32)
    return {"name": name, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}


def image_input(name: str, img: np.ndarray, enc: Encoding) -> dict:
    """An Observation image -> BYTES [1] input, base64 text (REST) with its image parameters."""
    payload, params = encode_image(img, enc)
    return {"name": name, "datatype": "BYTES", "shape": [1], "parameters": params, "data": [b64_text(payload)]}


def request_dict(request_id: str, inputs: list[dict], params: dict, deadline_s: float | None,
                 extra: Mapping[str, Any] | None) -> dict:
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


# ---------------------------------------------------------------- client side: reading a response

def response_outputs(body: Mapping[str, Any], names: Sequence[str]) -> dict[str, Mapping]:
    """The named outputs of a v2 response dict; ValueError naming the first one missing."""
    listed = body.get("outputs", []) if isinstance(body, Mapping) else None
    if not isinstance(listed, list):
        raise ValueError(f"response 'outputs' must be a list, got {listed!r:.80}")
    outs = {str(o.get("name")): o for o in listed if isinstance(o, Mapping)}
    for need in names:
        if need not in outs:
            raise ValueError(f"response has no {need!r} output (outputs: {sorted(map(str, outs))})")
    return outs


def response_parameters(body: Mapping[str, Any]) -> dict:
    """The ``parameters`` of a v2 response dict ({} when absent); ValueError when not an object."""
    params = body.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"response 'parameters' must be an object, got {params!r:.80}")
    return dict(params)


def server_seconds(params: Mapping[str, Any]) -> dict[str, float]:
    """The server's timing parameters (``*_s`` numbers) of a response."""
    return {k: float(v) for k, v in params.items()
            if k.endswith("_s") and isinstance(v, (int, float)) and not isinstance(v, bool)}


# ---------------------------------------------------------------- server side: checks naming the field

def index_inputs(inputs: Sequence[Tensor], fixed: Sequence[str], is_variable=lambda name: False,
                 expected: str = "") -> dict[str, Tensor]:
    """{name: tensor}; ProtocolError for a name given twice, or one neither in ``fixed`` nor accepted
    by ``is_variable`` (``expected`` says what is accepted)."""
    by_name: dict[str, Tensor] = {}
    for t in inputs:
        if t.name in by_name:
            raise ProtocolError(f"input {t.name!r} given twice")
        by_name[t.name] = t
    unknown = [n for n in by_name if n not in fixed and not is_variable(n)]
    if unknown:
        raise ProtocolError(f"unknown input(s) {unknown}; expected {expected or list(fixed)}")
    return by_name


def require(by_name: Mapping[str, Tensor], names: Sequence[str]) -> None:
    for need in names:
        if need not in by_name:
            raise ProtocolError(f"missing input {need!r}")


def float_tensor(t: Tensor, shape: tuple[int, ...]) -> np.ndarray:
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


def one_bytes(t: Tensor) -> bytes | str:
    if t.datatype != "BYTES" or list(t.shape) != [1]:
        raise ProtocolError(f"input {t.name!r} must be BYTES of shape [1], got {t.datatype} {list(t.shape)}")
    data = t.data
    if not (isinstance(data, (list, tuple)) and len(data) == 1 and isinstance(data[0], (bytes, str))):
        raise ProtocolError(f"input {t.name!r} must hold exactly one byte string")
    return data[0]


def text(t: Tensor, max_chars: int) -> str:
    """A BYTES [1] input holding 1..max_chars characters of utf-8 text (not only blanks)."""
    raw = one_bytes(t)
    try:
        s = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ProtocolError(f"input {t.name!r} is not valid utf-8") from None
    if not s.strip() or len(s) > max_chars:
        raise ProtocolError(f"input {t.name!r} must be 1..{max_chars} characters of text, got {len(s.strip())}")
    return s


def image(t: Tensor, max_side: int, max_image_bytes: int, request_params: Mapping[str, Any] | None = None
          ) -> np.ndarray:
    """A BYTES [1] image input -> uint8 (H, W, 3) or float32 (3, H, W); 413 when over max_image_bytes."""
    raw = one_bytes(t)
    if isinstance(raw, str):  # REST: base64 text
        if len(raw) > max_image_bytes * 4 // 3 + 4:
            raise ProtocolError(f"input {t.name!r}: image payload over {max_image_bytes} bytes", 413)
        try:
            raw = binascii.a2b_base64(raw, strict_mode=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(f"input {t.name!r}: image payload is not base64") from None
    if len(raw) > max_image_bytes:
        raise ProtocolError(f"input {t.name!r}: image payload of {len(raw)} bytes over {max_image_bytes}", 413)
    params = dict(t.parameters or {})
    if "image_encoding" not in params:  # the request-level image parameters, if any
        params.update({k: v for k, v in (request_params or {}).items() if k in IMAGE_PARAMETERS})
    try:
        return decode_image(raw, params, max_side, t.name)
    except ImageError as e:
        raise ProtocolError(str(e)) from None


def number(p: Mapping[str, Any], name: str, default, kind: type, lo: float, hi: float):
    """Request parameter ``name``: a JSON number (an integer for ``kind`` int; never a bool or a
    string, never NaN) in [lo, hi], else ProtocolError naming it; ``default`` when absent (None: optional)."""
    v = p.get(name, default)
    if v is None and default is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and kind is int:
        ok = isinstance(v, int)
    if not (ok and lo <= v <= hi):
        what = "an integer" if kind is int else "a finite number"
        raise ProtocolError(f"parameter {name!r} must be {what} in [{lo:g}, {hi:g}], got {v!r}")
    return kind(v)


def deadline(p: Mapping[str, Any]) -> float | None:
    """``deadline_s``: the budget (s) the client had left when it sent the request; counts from receipt."""
    return number(p, "deadline_s", None, float, 0.0, DEADLINE_MAX_S)


# ---------------------------------------------------------------- metadata (GET /v2/models/<name>)

IMAGE_INPUT_PARAMETERS = {
    "image_encoding": f"one of {list(ENCODINGS)} (default: the request parameter of this name)",
    "image_dtype": "raw only: 'uint8' (data is H x W x 3 RGB bytes) or 'float32' (3 x H x W in [0, 1])",
    "image_shape": "raw only: [H, W, 3] for uint8, [3, H, W] for float32 (over gRPC the text 'H,W,3')",
    "data": "the image bytes: base64 text over REST, plain bytes over gRPC",
}
IMAGE_REQUEST_PARAMETERS = {k: f"{k} of every image input that has no image_encoding of its own"
                            for k in IMAGE_PARAMETERS}


def tensor_spec(name: str, datatype: str, shape: Sequence[int], parameters: Mapping[str, str] | None = None) -> dict:
    """One metadata tensor: -1 in ``shape`` is a size the request chooses; ``parameters``: name -> meaning."""
    spec = {"name": name, "datatype": datatype, "shape": [int(s) for s in shape]}
    if parameters:
        spec["parameters"] = dict(parameters)
    return spec

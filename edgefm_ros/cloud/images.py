"""Camera images on the wire: raw arrays or JPEG, optionally downscaled first (OpenCV; no torch).

Scaling and JPEG encoding are the router's (routing/payload.py): longer side fitted to ``resolution``,
never enlarged; so the bytes it predicted for a candidate are the bytes sent.

An image travels as one byte string plus a few parameters saying how to read it back:
  raw:  {"image_encoding": "raw", "image_dtype": "uint8"|"float32", "image_shape": [..3 dims..]}
        (over gRPC, whose parameters hold no lists, image_shape may be the text "H,W,3")
        uint8 (H, W, 3) RGB, or float32 (3, H, W) in [0, 1] (the two layouts Observation allows)
  jpeg: {"image_encoding": "jpeg"}  (always decodes to uint8 (H, W, 3) RGB)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from edgefm_ros.routing.payload import downscale as payload_downscale

ENCODINGS = ("raw", "jpeg")


class ImageError(ValueError):
    """An image payload that cannot be read back; the message names what is wrong."""


@dataclass(frozen=True)
class Encoding:
    """How the client sends images: ``raw`` or ``jpeg`` (quality 1..100), optionally downscaled so the
    longer side is at most ``resolution`` pixels (None: as captured). Raw without resolution is lossless."""

    format: str = "raw"
    jpeg_quality: int = 90
    resolution: int | None = None

    def __post_init__(self) -> None:
        if self.format not in ENCODINGS:
            raise ValueError(f"Encoding.format must be one of {ENCODINGS}, got {self.format!r}")
        if not (isinstance(self.jpeg_quality, int) and 1 <= self.jpeg_quality <= 100):
            raise ValueError(f"Encoding.jpeg_quality must be an int in [1, 100], got {self.jpeg_quality!r}")
        if self.resolution is not None and not (isinstance(self.resolution, int) and self.resolution >= 8):
            raise ValueError(f"Encoding.resolution must be None or an int >= 8, got {self.resolution!r}")

    @classmethod
    def from_route(cls, jpeg_quality: int = 0, resolution: int = 0) -> "Encoding":
        """From a RouteDecision's params: jpeg_quality 0 means raw, resolution 0 means as captured."""
        q, r = int(jpeg_quality or 0), int(resolution or 0)
        return cls("jpeg" if q > 0 else "raw", q if q > 0 else 90, r if r > 0 else None)

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> "Encoding":
        """From ``RouteDecision.params`` (its ``jpeg_quality`` and ``resolution``; other keys ignored)."""
        return cls.from_route(params.get("jpeg_quality", 0), params.get("resolution", 0))


def to_hwc_uint8(img: np.ndarray) -> np.ndarray:
    """uint8 (H, W, 3) view of an Observation image (float32 (3, H, W) in [0, 1] is rounded)."""
    a = np.asarray(img)
    if a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3:
        return a
    if a.dtype == np.float32 and a.ndim == 3 and a.shape[0] == 3:
        return np.ascontiguousarray((np.clip(a, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8).transpose(1, 2, 0))
    raise ImageError(f"image must be uint8 (H, W, 3) or float32 (3, H, W), got {a.dtype} {a.shape}")


def downscale(img: np.ndarray, resolution: int) -> np.ndarray:
    """uint8 (H, W, 3) -> uint8 with the longer side <= resolution, aspect kept: the router's rule
    (routing/payload.downscale), so the bytes it predicted are the bytes sent."""
    return payload_downscale(img, resolution)


def encode_image(img: np.ndarray, enc: Encoding) -> tuple[bytes, dict]:
    """Observation image -> (payload bytes, parameters)."""
    a = np.asarray(img)
    if enc.format == "raw" and enc.resolution is None:
        if a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3:
            return a.tobytes(), {"image_encoding": "raw", "image_dtype": "uint8", "image_shape": list(a.shape)}
        if a.dtype == np.float32 and a.ndim == 3 and a.shape[0] == 3:
            return (np.ascontiguousarray(a).tobytes(),
                    {"image_encoding": "raw", "image_dtype": "float32", "image_shape": list(a.shape)})
        raise ImageError(f"image must be uint8 (H, W, 3) or float32 (3, H, W), got {a.dtype} {a.shape}")
    hwc = to_hwc_uint8(a)
    if enc.resolution is not None:
        hwc = downscale(hwc, enc.resolution)
    if enc.format == "raw":
        return hwc.tobytes(), {"image_encoding": "raw", "image_dtype": "uint8", "image_shape": list(hwc.shape)}
    import cv2

    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(hwc[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, enc.jpeg_quality])
    if not ok:
        raise ImageError(f"JPEG encoding failed for an image of shape {hwc.shape}")
    return buf.tobytes(), {"image_encoding": "jpeg"}


def _check_side(h: int, w: int, max_side: int, name: str) -> None:
    if not (1 <= h <= max_side and 1 <= w <= max_side):
        raise ImageError(f"{name}: image size {h}x{w} outside 1..{max_side} pixels per side")


def _decode_raw(payload: bytes, params: dict, max_side: int, name: str) -> np.ndarray:
    dtype, shape = params.get("image_dtype"), params.get("image_shape")
    if isinstance(shape, str):  # gRPC parameters hold no lists: "H,W,3"
        try:
            shape = [int(s) for s in shape.split(",")]
        except ValueError:
            pass
    if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(s, int) for s in shape)):
        raise ImageError(f"{name}: image_shape must be 3 ints (a list, or 'H,W,3' text), got {shape!r}")
    if dtype == "uint8":
        if shape[2] != 3:
            raise ImageError(f"{name}: uint8 images must be (H, W, 3), got image_shape {shape}")
        h, w, itemsize = shape[0], shape[1], 1
    elif dtype == "float32":
        if shape[0] != 3:
            raise ImageError(f"{name}: float32 images must be (3, H, W), got image_shape {shape}")
        h, w, itemsize = shape[1], shape[2], 4
    else:
        raise ImageError(f"{name}: image_dtype must be 'uint8' or 'float32', got {dtype!r}")
    _check_side(h, w, max_side, name)
    if len(payload) != h * w * 3 * itemsize:
        raise ImageError(f"{name}: {len(payload)} bytes do not match image_shape {shape} of {dtype}")
    a = np.frombuffer(payload, dtype=np.uint8 if itemsize == 1 else np.float32).reshape(shape).copy()  # writable
    if itemsize == 4 and not (np.all(np.isfinite(a)) and a.min() >= 0.0 and a.max() <= 1.0):
        raise ImageError(f"{name}: float32 image values must be finite and in [0, 1]")
    return a


SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame: holds the image size


def jpeg_size(payload: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, without decoding; None if there is none."""
    if payload[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(payload):
        if payload[i] != 0xFF:
            return None
        marker = payload[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = int.from_bytes(payload[i + 2:i + 4], "big")
        if marker in SOF_MARKERS:
            return int.from_bytes(payload[i + 5:i + 7], "big"), int.from_bytes(payload[i + 7:i + 9], "big")
        i += 2 + length
    return None


def _decode_jpeg(payload: bytes, max_side: int, name: str) -> np.ndarray:
    import cv2

    size = jpeg_size(payload)
    if size is None:
        raise ImageError(f"{name}: image_encoding 'jpeg' but the payload is not a JPEG (no frame header)")
    _check_side(*size, max_side, name)  # before decoding the pixels
    img = cv2.imdecode(np.frombuffer(payload, dtype=np.uint8), cv2.IMREAD_COLOR)
    if img is None or img.shape[:2] != size:
        raise ImageError(f"{name}: not a readable JPEG ({len(payload)} bytes)")
    return np.ascontiguousarray(img[:, :, ::-1])


def decode_image(payload: bytes, params: dict, max_side: int, name: str = "image") -> np.ndarray:
    """(payload, parameters) -> uint8 (H, W, 3) or float32 (3, H, W); ImageError names the problem."""
    kind = params.get("image_encoding")
    if kind == "raw":
        return _decode_raw(payload, params, max_side, name)
    if kind == "jpeg":
        return _decode_jpeg(payload, max_side, name)
    raise ImageError(f"{name}: image_encoding must be one of {ENCODINGS}, got {kind!r}")

"""Bytes the images of one request would take on the wire to a cloud candidate.

What is sent (and what ``RouteDecision.params`` tells the cloud client): each image scaled so that
its longer side is at most ``resolution`` (never enlarged), JPEG-encoded at ``jpeg_quality``
(0: raw RGB, 3 bytes a pixel). The count is the real encoder's output for this very image, not a
rule of thumb. A JPEG input that is already small enough and of no higher quality is sent as it is.
"""
from __future__ import annotations

from typing import Mapping

import cv2
import numpy as np

from edgefm_ros.routing.features import ImageInput, jpeg_quality


def _fit(h: int, w: int, resolution: int) -> tuple[int, int]:
    s = min(1.0, resolution / max(h, w))
    return max(1, round(h * s)), max(1, round(w * s))


def _decode(data: ImageInput) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)  # BGR
    if img is None:
        raise ValueError(f"could not decode the compressed image ({len(memoryview(data))} bytes)")
    return img


def encoded_bytes(image: ImageInput, resolution: int, quality: int) -> int:
    """Bytes of ``image`` as it would be sent (module docstring)."""
    if not 0 <= quality <= 100:
        raise ValueError(f"jpeg quality must be in [0, 100], got {quality}")
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = memoryview(image).cast("B")
        is_jpeg = len(data) > 2 and data[0] == 0xFF and data[1] == 0xD8
        src_q = jpeg_quality(data) if is_jpeg else None
        img = _decode(data)
        h, w = img.shape[:2]
        if quality and src_q is not None and src_q <= quality and max(h, w) <= resolution:
            return len(data)
    else:
        img = np.asarray(image)
        if img.dtype == np.float32 and img.ndim == 3 and img.shape[0] == 3:
            img = np.clip(img.transpose(1, 2, 0) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        if img.dtype != np.uint8 or img.ndim not in (2, 3):
            raise ValueError(f"image must be uint8 (H, W[, 3]) or float32 (3, H, W), got {img.dtype} {img.shape}")
    h, w = img.shape[:2]
    th, tw = _fit(h, w, resolution)
    if not quality:
        return th * tw * 3
    small = img if (th, tw) == (h, w) else cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"JPEG encoding failed for an image of shape {small.shape}")
    return int(buf.size)


def request_bytes(images: Mapping[str, ImageInput], resolution: int, quality: int) -> int:
    """Total bytes of all cameras' images for one (resolution, quality)."""
    return sum(encoded_bytes(img, resolution, quality) for img in images.values())

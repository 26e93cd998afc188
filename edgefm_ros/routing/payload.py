"""Bytes the images of one request would take on the wire to a cloud candidate.

What is sent (and what ``RouteDecision.params`` tells the cloud client): each image scaled so that
its longer side is at most ``resolution`` (never enlarged; ``downscale``, which the client uses too), JPEG-encoded
at ``jpeg_quality``
(0: raw RGB, 3 bytes a pixel). The count is the real encoder's output for this very image, not a
rule of thumb. A JPEG input that is already small enough and of no higher quality is sent as it is.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import cv2
import numpy as np

from edgefm_ros.routing.features import ImageInput, jpeg_quality


def _fit(h: int, w: int, resolution: int) -> tuple[int, int]:
    s = min(1.0, resolution / max(h, w))
    return max(1, round(h * s)), max(1, round(w * s))


def downscale(img: np.ndarray, resolution: int) -> np.ndarray:
    """``img`` (H, W[, C]) with its longer side fitted to ``resolution``, never enlarged: what the cloud client
    sends (cloud/images.py) and what the byte counts below measure. Whole factors of two are averaged away by
    INTER_AREA (each output pixel the mean of its block: no aliasing, and cheap at an integer ratio), the
    remaining factor below two by INTER_LINEAR. INTER_AREA at a fractional ratio such as 640 -> 512 takes
    1.2 ms on a 640x480 frame (2026-12-06, AMD EPYC Zen 4), this 0.2 ms."""
    h, w = img.shape[:2]
    th, tw = _fit(h, w, resolution)
    if (th, tw) == (h, w):
        return img
    k = 1
    while max(h, w) // (2 * k) >= max(th, tw) and h // (2 * k) >= th and w // (2 * k) >= tw:
        k *= 2
    if k > 1:
        img = cv2.resize(img, (w // k, h // k), interpolation=cv2.INTER_AREA)
    if img.shape[:2] != (th, tw):
        img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_LINEAR)
    return img


def _decode(data: ImageInput) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)  # BGR
    if img is None:
        raise ValueError(f"could not decode the compressed image ({len(memoryview(data))} bytes)")
    return img


class _Source:
    """One camera's image, decoded once, with each resolution's resized copy kept for every quality asked."""

    def __init__(self, image: ImageInput):
        self.jpeg_len, self.jpeg_q = 0, None
        self.rgb = not isinstance(image, (bytes, bytearray, memoryview))  # cv2 decodes to BGR, and encodes BGR
        if not self.rgb:
            data = memoryview(image).cast("B")
            if len(data) > 2 and data[0] == 0xFF and data[1] == 0xD8:
                self.jpeg_len, self.jpeg_q = len(data), jpeg_quality(data)
            img = _decode(data)
        else:
            img = np.asarray(image)
            if img.dtype == np.float32 and img.ndim == 3 and img.shape[0] == 3:
                img = np.clip(img.transpose(1, 2, 0) * 255.0 + 0.5, 0, 255).astype(np.uint8)
            if img.dtype != np.uint8 or img.ndim not in (2, 3):
                raise ValueError(f"image must be uint8 (H, W[, 3]) or float32 (3, H, W), got {img.dtype} {img.shape}")
        self.img = img
        self._resized: dict[int, np.ndarray] = {}

    def nbytes(self, resolution: int, quality: int) -> int:
        if not 0 <= quality <= 100:
            raise ValueError(f"jpeg quality must be in [0, 100], got {quality}")
        h, w = self.img.shape[:2]
        if quality and self.jpeg_q is not None and self.jpeg_q <= quality and max(h, w) <= resolution:
            return self.jpeg_len
        th, tw = _fit(h, w, resolution)
        if not quality:
            return th * tw * 3
        small = self._resized.get(resolution)
        if small is None:  # once per resolution, for every quality
            small = downscale(self.img, resolution)
            if self.rgb and small.ndim == 3:  # the colours the cloud client encodes (cloud/images.encode_image)
                small = cv2.cvtColor(small, cv2.COLOR_RGB2BGR)
            self._resized[resolution] = small
        ok, buf = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        if not ok:
            raise ValueError(f"JPEG encoding failed for an image of shape {small.shape}")
        return int(buf.size)


def encoded_bytes(image: ImageInput, resolution: int, quality: int) -> int:
    """Bytes of ``image`` as it would be sent (module docstring)."""
    return _Source(image).nbytes(resolution, quality)


def request_bytes(images: Mapping[str, ImageInput], resolution: int, quality: int) -> int:
    """Total bytes of all cameras' images for one (resolution, quality)."""
    return request_bytes_for(images, [(resolution, quality)])[(resolution, quality)]


def request_bytes_for(images: Mapping[str, ImageInput],
                      keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """``request_bytes`` for several (resolution, quality) keys: each image decoded and resized once per
    resolution, then encoded per quality."""
    sources = [_Source(img) for img in images.values()]
    return {key: sum(src.nbytes(*key) for src in sources) for key in dict.fromkeys(keys)}

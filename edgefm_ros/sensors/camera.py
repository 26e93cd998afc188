"""Camera images <-> numpy without ROS types: raw sensor_msgs/Image fields and compressed bytes.

Everything returns uint8 (H, W, 3) RGB; malformed input raises ValueError naming the bad value.
"""
from __future__ import annotations

import numpy as np

from edgefm_ros.cloud.images import jpeg_size

CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8UC1": 1, "8UC3": 3}
MAX_PIXELS = 1 << 25  # 33.5 Mpx (8K UHD fits): a compressed frame declaring more is refused before decoding


def pixel_view(encoding: str, height: int, width: int, step: int, data) -> np.ndarray:
    """sensor_msgs/Image fields -> uint8 (H, W, channels) view of ``data`` (no copy, rows' padding dropped)."""
    ch = CHANNELS.get(encoding)
    if ch is None:
        raise ValueError(f"unsupported image encoding {encoding!r}; supported: {sorted(CHANNELS)}")
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if step < width * ch:
        raise ValueError(f"image step {step} is smaller than width*channels = {width * ch}")
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != step * height:
        raise ValueError(f"image data holds {buf.size} bytes, expected step*height = {step * height}")
    return buf.reshape(height, step)[:, : width * ch].reshape(height, width, ch)


def rgb_view(encoding: str, height: int, width: int, step: int, data) -> np.ndarray:
    """uint8 (H, W, 3) RGB or (H, W) grey as a view of ``data`` (no copy): what the router's features read."""
    px = pixel_view(encoding, height, width, step, data)
    if px.shape[2] == 1:
        return px[..., 0]
    if encoding in ("bgr8", "8UC3"):
        return px[..., ::-1]
    if encoding == "bgra8":
        return px[..., 2::-1]
    return px[..., :3]


def image_to_rgb(encoding: str, height: int, width: int, step: int, data) -> np.ndarray:
    """sensor_msgs/Image fields -> uint8 (H, W, 3) RGB (a copy; ``data`` may be any buffer)."""
    view = rgb_view(encoding, height, width, step, data)
    if view.ndim == 2:  # mono
        return np.repeat(view[..., None], 3, axis=2)
    return view.copy()  # C order: owns its pixels (the message's buffer is not kept)


def rgb_to_image_fields(rgb: np.ndarray, encoding: str = "rgb8") -> tuple[int, int, int, bytes]:
    """uint8 (H, W, 3) RGB -> (height, width, step, data) for an rgb8 or bgr8 sensor_msgs/Image."""
    rgb = _check_rgb(rgb)
    if encoding not in ("rgb8", "bgr8"):
        raise ValueError(f"can only encode rgb8 or bgr8, got {encoding!r}")
    px = rgb if encoding == "rgb8" else rgb[..., ::-1]
    h, w, _ = rgb.shape
    return h, w, w * 3, np.ascontiguousarray(px).tobytes()


def declared_size(b: bytes) -> tuple[int, int] | None:
    """(height, width) a PNG (IHDR) or JPEG (frame header: the cloud's reader) declares, or None."""
    if b[:8] == b"\x89PNG\r\n\x1a\n" and len(b) >= 24 and b[12:16] == b"IHDR":
        return int.from_bytes(b[20:24], "big"), int.from_bytes(b[16:20], "big")
    return jpeg_size(b)


def decode_compressed(fmt: str, data) -> np.ndarray:
    """sensor_msgs/CompressedImage (format, data) -> uint8 (H, W, 3) RGB. JPEG and PNG, at most MAX_PIXELS."""
    import cv2  # OpenCV is optional in a pip install (extra "tools"): imported only where an image is coded

    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size == 0:
        raise ValueError(f"compressed image ({fmt!r}) holds no data")
    f = fmt.lower()
    if not any(k in f for k in ("jpeg", "jpg", "png")) and f.strip():
        raise ValueError(f"unsupported compressed image format {fmt!r}; supported: jpeg, png")
    # the decoder allocates what the header declares before reading the data: read the header first, and
    # only PNG or JPEG (OpenCV would decode BMP, TIFF ... too, and skips junk before a JPEG frame header)
    size = declared_size(buf[:65536].tobytes())
    if size is None:
        raise ValueError(f"compressed image ({fmt!r}, {buf.size} bytes) is not a PNG or JPEG with a readable header")
    if not 0 < size[0] * size[1] <= MAX_PIXELS:
        raise ValueError(f"compressed image ({fmt!r}) declares {size[0]}x{size[1]} pixels, outside 1..{MAX_PIXELS}")
    bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f"compressed image ({fmt!r}, {buf.size} bytes) could not be decoded")
    return np.ascontiguousarray(bgr[..., ::-1])


def encode_jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    import cv2  # optional, as in decode_compressed

    if not 1 <= quality <= 100:
        raise ValueError(f"jpeg quality must be in [1, 100], got {quality}")
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(_check_rgb(rgb)[..., ::-1]),
                           [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError("jpeg encoding failed")
    return buf.tobytes()


def resize_rgb(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of uint8 (H, W, 3) to (height, width, 3) (identity when the size matches)."""
    import cv2  # optional, as in decode_compressed

    if rgb.shape[:2] == (height, width):
        return rgb
    return cv2.resize(rgb, (width, height), interpolation=cv2.INTER_LINEAR)


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    a = np.asarray(rgb)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"expected uint8 (H, W, 3) RGB, got {a.dtype} {a.shape}")
    return a

"""Camera messages -> RGB frames: sensor_msgs/Image (any encoding rosbags-image knows, the common ones
without a copy through OpenCV) and sensor_msgs/CompressedImage (JPEG, PNG)."""
from __future__ import annotations

import cv2
import numpy as np

from .bagread import COMPRESSED, IMAGE, typestore

_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8UC3": 3, "8UC1": 1}


def image_to_rgb(msg) -> np.ndarray:
    """uint8 [H, W, 3] RGB of a deserialized sensor_msgs/Image."""
    enc = str(msg.encoding)
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    ch = _CHANNELS.get(enc)
    if ch is None:  # 16-bit, Bayer, YUV...: rosbags-image converts
        from rosbags.image import message_to_cvimage  # only for the rarer encodings

        return np.ascontiguousarray(message_to_cvimage(msg, "rgb8"))
    data = np.asarray(msg.data, dtype=np.uint8)
    if h <= 0 or w <= 0 or step < w * ch or len(data) < step * h:
        raise ValueError(f"Image {w}x{h} {enc} step {step}: {len(data)} data bytes do not fill it")
    img = data[: step * h].reshape(h, step)[:, : w * ch].reshape(h, w, ch)
    if enc in ("rgb8", "8UC3"):
        return np.ascontiguousarray(img)
    if enc == "bgr8":
        return cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_BGR2RGB)
    if enc == "rgba8":
        return np.ascontiguousarray(img[:, :, :3])
    if enc == "bgra8":
        return np.ascontiguousarray(img[:, :, 2::-1])
    return np.repeat(img, 3, axis=2)  # mono8


def compressed_to_rgb(msg) -> np.ndarray:
    buf = np.asarray(msg.data, dtype=np.uint8)
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR) if len(buf) else None
    if img is None:
        raise ValueError(f"CompressedImage ({msg.format!r}, {len(buf)} bytes) is not a decodable image")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def decode_frame(msgtype: str, raw: bytes) -> np.ndarray:
    """uint8 [H, W, 3] RGB of a serialized camera message."""
    msg = typestore().deserialize_cdr(raw, msgtype)
    if msgtype == IMAGE:
        return image_to_rgb(msg)
    if msgtype == COMPRESSED:
        return compressed_to_rgb(msg)
    raise ValueError(f"not a camera message type: {msgtype}")

"""MP4 video with PyAV: an encoder fed one RGB frame at a time, and a decoder back to RGB arrays.

The defaults are LeRobot 0.4.4's (``encode_video_frames``): AV1 with libsvtav1, pix_fmt yuv420p, a keyframe
every 2 frames (g=2), crf 30, preset 12 (SVT-AV1 3.0 maps it to 10). Frame i of a file has pts i in time
base 1/fps, so its time is i / fps: what LeRobot's decoders look up (``from_timestamp + timestamp``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

CODECS = {"libsvtav1": "av1", "h264": "h264", "libx264": "h264", "hevc": "hevc", "libx265": "hevc"}
X26X_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")


@dataclass(frozen=True)
class VideoConfig:
    vcodec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    gop: int = 2
    crf: int = 30
    preset: str = ""  # "": LeRobot's (libsvtav1 12; x264/x265 their default, medium); x264/x265: ultrafast..veryslow
    threads: int = 0  # 0: the codec decides

    def __post_init__(self) -> None:
        if self.vcodec not in CODECS:
            raise ValueError(f"vcodec must be one of {sorted(CODECS)}, got {self.vcodec!r}")
        if self.pix_fmt not in ("yuv420p", "yuv444p"):
            raise ValueError(f"pix_fmt must be yuv420p or yuv444p, got {self.pix_fmt!r}")
        if not 1 <= self.gop <= 600:
            raise ValueError(f"gop must be in 1..600, got {self.gop}")
        if not 0 <= self.crf <= 63:
            raise ValueError(f"crf must be in 0..63, got {self.crf}")
        object.__setattr__(self, "preset", str(self.preset).strip())
        if self.preset:
            ok = self.preset.isdigit() and 0 <= int(self.preset) <= 13 if self.encoder == "libsvtav1" \
                else self.preset in X26X_PRESETS
            if not ok:
                raise ValueError(f"preset {self.preset!r} is not one of {self.encoder}'s "
                                 f"({'0..13' if self.encoder == 'libsvtav1' else ', '.join(X26X_PRESETS)})")

    @property
    def encoder(self) -> str:
        return "libx264" if self.vcodec == "h264" else ("libx265" if self.vcodec == "hevc" else self.vcodec)

    def options(self) -> dict[str, str]:
        o = {"g": str(self.gop), "crf": str(self.crf)}
        if self.encoder == "libsvtav1":
            o["preset"] = self.preset or "12"
            if self.threads:
                o["svtav1-params"] = f"lp={self.threads}"
        else:
            if self.preset:
                o["preset"] = self.preset
            if self.threads:
                o["threads"] = str(self.threads)
        return o


class VideoWriter:
    """One MP4 file: ``add(rgb)`` per frame, in order; ``close()`` flushes. Frames must share one size."""

    def __init__(self, path: str | Path, fps: int, cfg: VideoConfig = VideoConfig()):
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner per encoder otherwise (errors only)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps, self.cfg = int(fps), cfg
        self._out = av.open(str(self.path), "w", format="mp4")
        self._stream = None
        self.frames = 0
        self.bytes = 0
        self.shape: tuple[int, int] | None = None

    def _open_stream(self, h: int, w: int) -> None:
        s = self._out.add_stream(self.cfg.encoder, rate=self.fps, options=self.cfg.options())
        s.width, s.height, s.pix_fmt = w, h, self.cfg.pix_fmt
        s.time_base = Fraction(1, self.fps)
        self._stream, self.shape = s, (h, w)

    def add(self, rgb: np.ndarray) -> None:
        h, w = rgb.shape[:2]
        if self._stream is None:
            self._open_stream(h, w)
        elif (h, w) != self.shape:
            raise ValueError(f"frame {w}x{h} differs from the video's {self.shape[1]}x{self.shape[0]}")
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self.frames
        frame.time_base = Fraction(1, self.fps)
        self._mux(self._stream.encode(frame))
        self.frames += 1

    def _mux(self, packets) -> None:
        for p in packets:
            self.bytes += p.size
            self._out.mux(p)

    def close(self) -> None:
        if self._out is None:
            return
        try:
            if self._stream is not None:
                self._mux(self._stream.encode())
        finally:
            self._out.close()
            self._out = None

    def info(self) -> dict:
        """LeRobot's ``features[key]["info"]`` for this video (what its get_video_info reads from a file)."""
        h, w = self.shape
        return {"video.height": h, "video.width": w, "video.codec": CODECS[self.cfg.vcodec],
                "video.pix_fmt": self.cfg.pix_fmt, "video.is_depth_map": False, "video.fps": self.fps,
                "video.channels": 3, "has_audio": False}


def decode_video(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [N, H, W, 3] RGB frames, float64 [N] times in s) of a file's first video stream, in order."""
    frames, times = [], []
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "AUTO"
        for f in c.decode(stream):
            frames.append(f.to_ndarray(format="rgb24"))
            times.append(float(f.pts * f.time_base) if f.pts is not None else float("nan"))
    if not frames:
        raise ValueError(f"{path}: no video frames")
    return np.stack(frames), np.asarray(times)


def probe_video(path: str | Path) -> dict:
    """codec, pix_fmt, width, height, frames, fps of a file's first video stream (for checks and reports)."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return {"codec": s.codec.canonical_name, "pix_fmt": s.pix_fmt, "width": s.width, "height": s.height,
                "frames": s.frames, "fps": float(s.average_rate) if s.average_rate else None}

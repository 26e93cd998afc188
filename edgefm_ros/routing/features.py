"""Cheap input features for routing: 4 visual + 6 text, computed before any model runs.

Visual features are measured on a grey image resized to a fixed analysis size, so a 640x480 and a
1280x960 frame of the same scene read alike. All four are scaled to roughly [0, 1] (exposure to
[-1, 1]) and increase with the degradation they name:

- ``blur``: log2(0.5 / sharpness) / 5, clipped to [0, 1]; sharpness is the RMS first difference at
  analysis size over the image's own contrast (standard deviation), so gain does not read as
  sharpness; differences whose support straddles an 8x8 JPEG block boundary of the native image
  are left out, so block edges do not read as sharpness either.
- ``exposure``: signed exposure error in [-1, 1]: 2 * (mean luminance - 0.5) plus the fraction of
  clipped-white pixels minus the fraction of clipped-black pixels. 0 is mid-grey, -1 black, +1 white.
- ``jpeg``: compression artifact level in [0, 1]. From pixels: blockiness in the Wang-Sheikh-Bovik
  manner, the mean absolute luminance step across 8x8 block boundaries over the mean step inside
  blocks (1 for an uncompressed image), mapped by ``(ratio - 1) / 2``. When the input is JPEG bytes
  the encoder's IJG quality is read from its quantisation tables (DQT) and ``(100 - q) / 100``
  is used instead (exact, and cheaper: large frames are then decoded at half size in the DCT domain).
- ``detail``: edge density at a coarse scale (40x30): the fraction of pixels whose contrast-
  normalised gradient magnitude exceeds a threshold. Coarse on purpose: it measures how much there is
  to see (clutter, text, small parts), and a moderate blur hardly moves it.

Text features (all in [0, 1]): ``text_length`` (words / 32, capped), ``text_entity`` (share of
numbers, units, quoted strings and capitalised names), ``text_question`` (1 question, 0 command,
0.5 statement), ``text_lexical`` (share of long words, >= 7 letters), ``text_reasoning``
(conditionals, comparisons, ordinals, negation, counting; 3 markers saturate), ``text_deictic``
(context-dependent references: this, that, there, it, again, ...; 3 markers saturate).

Extensions, off by default (``FeatureConfig``): ``text_hash_dims`` > 0 appends a cheap instruction
embedding, ``text_hash_00`` ...: each content word (lower case, stop words left out) sets the bucket
``crc32(word) % text_hash_dims`` to 1, so the same words in other phrasings land in the same buckets;
``signals`` appends named values the caller measures itself (e.g. ``edge_spread``, how far two noise draws of
the edge model's chunk disagree), given to ``extract_features`` as a mapping. ``feature_names(cfg)`` lists
them all in order.

Multi-camera: per-camera visual features are combined per feature as ``FeatureConfig.aggregate``
says (``max``, ``min``, ``mean`` or ``absmax``, the value of largest magnitude, for signed ones).
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Union

import cv2
import numpy as np

VISUAL_NAMES = ("blur", "exposure", "jpeg", "detail")
TEXT_NAMES = ("text_length", "text_entity", "text_question", "text_lexical", "text_reasoning",
              "text_deictic")
FEATURE_NAMES = VISUAL_NAMES + TEXT_NAMES
AGGREGATES = ("max", "min", "mean", "absmax")

ImageInput = Union[np.ndarray, bytes, bytearray, memoryview]


@dataclass(frozen=True)
class FeatureConfig:
    analysis_size: tuple[int, int] = (320, 240)  # (width, height) the visual features are measured at
    coarse_size: tuple[int, int] = (40, 30)  # (width, height) for the detail feature
    aggregate: tuple[tuple[str, str], ...] = (
        ("blur", "max"), ("exposure", "absmax"), ("jpeg", "max"), ("detail", "max"))
    clip_low: int = 4  # grey levels <= this count as clipped black
    clip_high: int = 251  # grey levels >= this count as clipped white
    detail_threshold: float = 0.5  # contrast-normalised gradient magnitude counting as an edge
    text_hash_dims: int = 0  # instruction embedding: content words hashed into this many 0/1 buckets (0: off)
    signals: tuple[str, ...] = ()  # named values the caller measures per request, appended as given

    def __post_init__(self) -> None:
        if not (isinstance(self.text_hash_dims, int) and 0 <= self.text_hash_dims <= 256):
            raise ValueError(f"FeatureConfig.text_hash_dims must be an integer in [0, 256], got {self.text_hash_dims!r}")
        bad = [s for s in self.signals if not (isinstance(s, str) and s.isidentifier())
               or s in FEATURE_NAMES or s.startswith("text_hash_")]
        if bad or len(set(self.signals)) != len(self.signals):
            raise ValueError(f"FeatureConfig.signals must be distinct identifiers other than the feature names, "
                             f"got {list(self.signals)!r}")
        for name, size in (("analysis_size", self.analysis_size), ("coarse_size", self.coarse_size)):
            if len(size) != 2 or min(size) < 16 or max(size) > 4096:
                raise ValueError(f"FeatureConfig.{name} must be (width, height) in [16, 4096], got {size}")
        agg = dict(self.aggregate)
        if set(agg) != set(VISUAL_NAMES):
            raise ValueError(f"FeatureConfig.aggregate must name exactly {VISUAL_NAMES}, got {sorted(agg)}")
        bad = {k: v for k, v in agg.items() if v not in AGGREGATES}
        if bad:
            raise ValueError(f"FeatureConfig.aggregate has unknown modes {bad}; use one of {AGGREGATES}")
        if not 0 <= self.clip_low < self.clip_high <= 255:
            raise ValueError(f"FeatureConfig clip levels must satisfy 0 <= low < high <= 255, "
                             f"got {self.clip_low}, {self.clip_high}")
        if not self.detail_threshold > 0:
            raise ValueError(f"FeatureConfig.detail_threshold must be > 0, got {self.detail_threshold}")


# ---------------------------------------------------------------------------------------------
# JPEG quality from the quantisation tables

_ZIGZAG = (0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34,
           27, 20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44,
           51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63)
# JPEG standard Annex K tables (natural order), the base IJG libjpeg scales by quality.
_STD_LUMA = (16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
             14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
             18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
             49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99)
_STD_CHROMA = (17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
               24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99) + (99,) * 32


@lru_cache(maxsize=1)
def _ijg_tables() -> np.ndarray:
    """float64 (100, 2, 64): the IJG tables for quality 1..100 (luma, chroma), zigzag order."""
    q = np.arange(1, 101, dtype=np.int64)
    scale = np.where(q < 50, 5000 // q, 200 - 2 * q)  # (100,)
    base = np.array([_STD_LUMA, _STD_CHROMA], dtype=np.int64)[:, list(_ZIGZAG)]  # (2, 64)
    tables = np.clip((base[None] * scale[:, None, None] + 50) // 100, 1, 255).astype(np.float64)
    tables.setflags(write=False)
    return tables


def read_dqt(data: bytes) -> dict[int, np.ndarray]:
    """Quantisation tables of a JPEG stream: table id -> float64 (64,) in zigzag order.

    Raises ValueError when ``data`` is not a JPEG stream or a DQT segment is truncated.
    """
    buf = memoryview(data).cast("B")
    if len(buf) < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        raise ValueError(f"not a JPEG stream: starts with {bytes(buf[:4]).hex() or 'nothing'}")
    tables: dict[int, np.ndarray] = {}
    pos = 2
    while pos + 4 <= len(buf):
        if buf[pos] != 0xFF:
            raise ValueError(f"JPEG marker expected at byte {pos}, found 0x{buf[pos]:02x}")
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan / end of image: no tables after this point
            break
        length = (buf[pos + 2] << 8) | buf[pos + 3]
        end = pos + 2 + length
        if length < 2 or end > len(buf):
            raise ValueError(f"JPEG segment 0x{marker:02x} at byte {pos} has bad length {length}")
        if marker == 0xDB:
            _parse_dqt(buf[pos + 4:end], tables)
        pos = end
    return tables


def _parse_dqt(seg: memoryview, tables: dict[int, np.ndarray]) -> None:
    i = 0
    while i < len(seg):
        precision, table_id = seg[i] >> 4, seg[i] & 0x0F
        n = 128 if precision else 64
        if i + 1 + n > len(seg):
            raise ValueError(f"truncated DQT table {table_id}: {len(seg) - i - 1} of {n} bytes")
        raw = np.frombuffer(seg[i + 1:i + 1 + n], dtype=">u2" if precision else np.uint8)
        tables[table_id] = raw.astype(np.float64)
        i += 1 + n


def jpeg_quality(data: bytes) -> int | None:
    """The IJG quality (1..100) whose tables are nearest to the stream's; None without tables.

    Exact for libjpeg/libjpeg-turbo/OpenCV output; for other encoders the nearest IJG quality
    (least squared error over the 64 luma and, when present, 64 chroma entries).
    """
    tables = read_dqt(data)
    if 0 not in tables:
        return None
    ref = _ijg_tables()  # (100, 2, 64)
    err = ((ref[:, 0] - tables[0]) ** 2).sum(axis=1)  # (100,)
    if 1 in tables:
        err = err + ((ref[:, 1] - tables[1]) ** 2).sum(axis=1)
    return int(np.argmin(err)) + 1


# ---------------------------------------------------------------------------------------------
# Visual features


def _to_grey(image: ImageInput) -> tuple[np.ndarray, int | None, tuple[int, int]]:
    """Grey uint8 image, JPEG quality (or None), native (height, width) of the input."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = np.frombuffer(image, dtype=np.uint8)
        if data.size < 4:
            raise ValueError(f"compressed image holds only {data.size} bytes")
        if not (data[0] == 0xFF and data[1] == 0xD8):  # PNG and the like: pixels only
            grey = cv2.imdecode(data, cv2.IMREAD_GRAYSCALE)
            if grey is None:
                raise ValueError(f"could not decode the compressed image ({data.size} bytes, starts with "
                                 f"{data[:4].tobytes().hex()})")
            return grey, None, grey.shape[:2]
        quality = jpeg_quality(image)
        native = _jpeg_size(data[:65536].tobytes())
        # The DCT-domain reduced decode is much cheaper than a full decode; blockiness comes from the
        # quantisation tables, so the block grid need not survive.
        flag = cv2.IMREAD_REDUCED_GRAYSCALE_2 if native and min(native) >= 480 else cv2.IMREAD_GRAYSCALE
        grey = cv2.imdecode(data, flag)
        if grey is None:
            raise ValueError(f"could not decode the JPEG image ({len(data)} bytes)")
        return grey, quality, native or grey.shape[:2]
    arr = np.asarray(image)
    if arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3:
        return cv2.cvtColor(arr, cv2.COLOR_RGB2GRAY), None, arr.shape[:2]
    if arr.dtype == np.uint8 and arr.ndim == 2:
        return arr, None, arr.shape
    if arr.dtype == np.float32 and arr.ndim == 3 and arr.shape[0] == 3:
        if not np.all(np.isfinite(arr)):
            raise ValueError("float32 image holds non-finite values")
        rgb = np.clip(arr.transpose(1, 2, 0) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), None, rgb.shape[:2]
    raise ValueError(f"image must be uint8 (H, W, 3) RGB, uint8 (H, W), float32 (3, H, W) or JPEG bytes; "
                     f"got {arr.dtype} {arr.shape}")


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    """(height, width) from the SOF segment of a JPEG stream, None when not found in ``head``."""
    pos = 2
    while pos + 9 <= len(head):
        if head[pos] != 0xFF:
            return None
        marker = head[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        length = (head[pos + 2] << 8) | head[pos + 3]
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            return (head[pos + 5] << 8) | head[pos + 6], (head[pos + 7] << 8) | head[pos + 8]
        if marker == 0xDA:
            return None
        pos += 2 + length
    return None


@lru_cache(maxsize=64)
def _clean_diffs(n_analysis: int, n_native: int) -> np.ndarray:
    """Indices j of first differences g[j+1] - g[j] at analysis size (length n_analysis) whose
    native support [j/s, (j+2)/s) holds no 8x8 block boundary (an edge at a multiple of 8)."""
    s = n_analysis / n_native
    j = np.arange(n_analysis - 1)
    lo, hi = j / s, (j + 2) / s  # native span covered by pixels j and j+1
    next_edge = (np.floor(lo / 8) + 1) * 8  # first block edge strictly right of lo
    keep = j[next_edge >= hi - 1e-9]
    if keep.size < max(4, (n_analysis - 1) // 8):  # blocks at or below analysis resolution
        keep = j
    keep.setflags(write=False)
    return keep


def _blockiness(grey: np.ndarray) -> float:
    """Wang-Sheikh-Bovik style blockiness ratio at native resolution: mean |step| across 8x8
    block boundaries over mean |step| inside blocks (about 1 without block coding)."""
    h, w = grey.shape
    nb_h, nb_v = (w - 1) // 8, (h - 1) // 8
    if nb_h < 2 or nb_v < 2:
        return 1.0
    dh = cv2.absdiff(grey[:, 1:], grey[:, :-1])  # uint8 (h, w-1); column i: step between pixels i, i+1
    dv = cv2.absdiff(grey[1:], grey[:-1])  # uint8 (h-1, w)
    bh = float(dh[:, 7:8 * nb_h:8].sum(dtype=np.int64))  # steps between pixels 8k-1 and 8k
    bv = float(dv[7:8 * nb_v:8].sum(dtype=np.int64))
    n_bh, n_bv = h * nb_h, w * nb_v
    inside = (cv2.sumElems(dh)[0] - bh + cv2.sumElems(dv)[0] - bv) / (dh.size - n_bh + dv.size - n_bv)
    return float((bh / n_bh + bv / n_bv) / 2.0 / (inside + 0.5))


def visual_features(image: ImageInput, cfg: FeatureConfig = FeatureConfig()) -> np.ndarray:
    """float32 (4,): blur, exposure, jpeg, detail of one camera image (see module docstring)."""
    grey, quality, native = _to_grey(image)
    aw, ah = cfg.analysis_size
    small = cv2.resize(grey, (aw, ah), interpolation=cv2.INTER_AREA)  # uint8 (ah, aw)
    g = small.astype(np.float32)
    std = float(cv2.meanStdDev(small)[1][0, 0])

    dx2 = np.square(g[:, 1:] - g[:, :-1]).sum(axis=0)  # (aw-1,) per column of differences
    dy2 = np.square(g[1:] - g[:-1]).sum(axis=1)  # (ah-1,) per row
    kx, ky = _clean_diffs(aw, native[1]), _clean_diffs(ah, native[0])
    energy = 0.5 * (float(dx2[kx].sum()) / (ah * kx.size) + float(dy2[ky].sum()) / (aw * ky.size))
    sharp = np.sqrt(energy) / (std + 2.0)  # ~0.2-0.6 for sharp natural images, -> 0 when blurred
    blur = min(1.0, max(0.0, np.log2(0.5 / (sharp + 1e-6)) / 5.0))  # one octave of sharpness = 0.2

    mean = float(g.mean()) / 255.0
    clip_hi = float(np.count_nonzero(small >= cfg.clip_high)) / small.size
    clip_lo = float(np.count_nonzero(small <= cfg.clip_low)) / small.size
    exposure = float(np.clip(2.0 * (mean - 0.5) + clip_hi - clip_lo, -1.0, 1.0))

    artifact = 0.0
    if quality is None:
        artifact = min(1.0, max(0.0, (_blockiness(grey) - 1.0) / 2.0))
    else:
        artifact = (100.0 - quality) / 100.0

    cw, ch = cfg.coarse_size
    c = cv2.resize(g, (cw, ch), interpolation=cv2.INTER_AREA)  # (ch, cw) float32
    gx = np.abs(np.diff(c, axis=1))[:-1]  # (ch-1, cw-1)
    gy = np.abs(np.diff(c, axis=0))[:, :-1]
    cstd = float(c.std()) + 2.0
    detail = float(np.count_nonzero(gx + gy > cfg.detail_threshold * cstd)) / gx.size

    return np.array([blur, exposure, artifact, detail], dtype=np.float32)


def aggregate(per_camera: np.ndarray, cfg: FeatureConfig = FeatureConfig()) -> np.ndarray:
    """float32 (n_cameras, 4) -> float32 (4,), per feature as cfg.aggregate says."""
    if per_camera.ndim != 2 or per_camera.shape[1] != len(VISUAL_NAMES) or per_camera.shape[0] == 0:
        raise ValueError(f"per-camera features must be (n>=1, {len(VISUAL_NAMES)}), got {per_camera.shape}")
    modes = dict(cfg.aggregate)
    out = np.empty(len(VISUAL_NAMES), dtype=np.float32)
    for i, name in enumerate(VISUAL_NAMES):
        col = per_camera[:, i]
        mode = modes[name]
        if mode == "absmax":
            out[i] = col[int(np.argmax(np.abs(col)))]
        else:
            out[i] = getattr(np, mode)(col)
    return out


# ---------------------------------------------------------------------------------------------
# Text features

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)?")
_QUOTED = re.compile(r"\"[^\"]+\"|'[^']+'|`[^`]+`")
_UNITS = frozenset("cm mm m km kg g deg degrees degree percent inches inch meters meter".split())
_NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten twelve twenty half "
                          "dozen".split())
_QUESTION_START = frozenset("what which who whom whose where when why how is are was were do does did "
                            "can could should would will has have".split())
_REASONING = frozenset("if then else unless because since so therefore otherwise before after until "
                       "while when first second third last next then more less most least larger "
                       "smaller largest smallest bigger biggest heavier lighter closer closest "
                       "farther furthest between each every all both either neither not no none "
                       "except only without count compare same different than".split())
_DEICTIC = frozenset("this that these those here there it its them they their again previous "
                     "previously earlier other another same former latter above below".split())


def text_features(instruction: str) -> np.ndarray:
    """float32 (6,): text_length, text_entity, text_question, text_lexical, text_reasoning,
    text_deictic of one instruction (see module docstring)."""
    if not isinstance(instruction, str):
        raise ValueError(f"instruction must be a str, got {type(instruction).__name__}")
    text = instruction.strip()
    words = _WORD.findall(text)
    n = len(words)
    if n == 0:
        return np.zeros(len(TEXT_NAMES), dtype=np.float32)
    lower = [w.lower() for w in words]
    entities = len(_QUOTED.findall(text))
    for i, (w, lw) in enumerate(zip(words, lower)):
        if w[0].isdigit() or lw in _NUMBER_WORDS or lw in _UNITS:
            entities += 1
        elif i > 0 and w[0].isupper():  # a capitalised word inside the sentence: a name
            entities += 1
    if text.endswith("?") or lower[0] in _QUESTION_START:
        question = 1.0
    elif text.endswith(".") and lower[0] in ("the", "a", "an", "there", "it", "i", "we"):
        question = 0.5
    else:
        question = 0.0
    return np.array([
        min(1.0, n / 32.0),
        min(1.0, entities / n),
        question,
        sum(len(w) >= 7 for w in words if w[0].isalpha()) / n,
        min(1.0, sum(w in _REASONING for w in lower) / 3.0),
        min(1.0, sum(w in _DEICTIC for w in lower) / 3.0),
    ], dtype=np.float32)


# words that carry no content for the instruction embedding
_STOP_WORDS = frozenset("a an the to of on onto into in at from for with and or so it its is be this that your "
                        "you please then up out down".split())


def text_hash(instruction: str, dims: int) -> np.ndarray:
    """float32 (dims,): 1 where a content word of the instruction hashes (CRC-32) to that bucket."""
    out = np.zeros(dims, dtype=np.float32)
    if dims:
        for w in re.findall(r"[a-z]+", instruction.lower()):
            if w not in _STOP_WORDS:
                out[zlib.crc32(w.encode()) % dims] = 1.0
    return out


def feature_names(cfg: FeatureConfig = FeatureConfig()) -> tuple[str, ...]:
    """The names of ``extract_features``' output under ``cfg``: FEATURE_NAMES, then the extensions."""
    return FEATURE_NAMES + tuple(f"text_hash_{i:02d}" for i in range(cfg.text_hash_dims)) + tuple(cfg.signals)


def extract_features(images: Mapping[str, ImageInput], instruction: str,
                     cfg: FeatureConfig = FeatureConfig(), signals: Mapping[str, float] | None = None) -> np.ndarray:
    """float32 (10,) in FEATURE_NAMES order for one request (one or more cameras + instruction); with the
    extensions of ``cfg`` on, (len(feature_names(cfg)),). ``signals``: a value for each of ``cfg.signals``."""
    if not images:
        raise ValueError("extract_features needs at least one camera image, got none")
    per_camera = np.stack([visual_features(img, cfg) for img in images.values()])  # (n_cam, 4)
    parts = [aggregate(per_camera, cfg), text_features(instruction)]
    if cfg.text_hash_dims:
        parts.append(text_hash(instruction, cfg.text_hash_dims))
    if cfg.signals:
        given = dict(signals or {})
        missing = [n for n in cfg.signals if n not in given]
        if missing:
            raise ValueError(f"the router's features need the signal(s) {missing}; given: {sorted(given)}")
        values = np.array([given[n] for n in cfg.signals], dtype=np.float32)
        if not np.isfinite(values).all():
            raise ValueError(f"signals must be finite, got {dict(zip(cfg.signals, values.tolist()))}")
        parts.append(values)
    return np.concatenate(parts)

"""Memory-mapped safetensors reading: tensors are views of one private file mapping (no copy).

The file is mapped copy-on-write, so tensors are writable without touching the file; pages are read
from disk on first use and shared with the page cache.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


MAX_HEADER = 100_000_000  # bytes of JSON header accepted (the format's own readers use the same order)
MAX_BYTES = 2 ** 62  # any tensor's extent in bytes, counting a zero dimension as one (no size overflow)


class SafetensorsError(ValueError):
    """A file that is not valid safetensors; the message names the file, the tensor and the bad value."""


def _count(value, what: str) -> int:
    """A JSON integer >= 0 (not a bool, not a float), else SafetensorsError naming ``value``."""
    if type(value) is not int or value < 0:
        raise SafetensorsError(f"{what} {value!r} is not an integer >= 0")
    return value


def parse_entry(key: str, info, data_len: int) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    """One header entry -> (dtype, shape, start, nbytes) within ``data_len`` bytes of data, or SafetensorsError."""
    where = f"tensor {key!r}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(f"{where}: entry {info!r} must be an object with dtype, shape and data_offsets")
    dt, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dt, str) or dt not in DTYPES:
        raise SafetensorsError(f"{where}: dtype {dt!r} is not one of {sorted(DTYPES)}")
    dtype = DTYPES[dt]
    if not isinstance(shape, list):
        raise SafetensorsError(f"{where}: shape {shape!r} is not a list")
    dims = tuple(_count(d, f"{where}: shape {shape!r}: dimension") for d in shape)
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise SafetensorsError(f"{where}: data_offsets {offsets!r} is not a [start, end] pair")
    start, end = (_count(o, f"{where}: data_offsets {offsets!r}: offset") for o in offsets)
    item = torch.empty((), dtype=dtype).element_size()
    extent = item
    for d in dims:  # grows by at least x1 per dimension: stops at the first overflow
        extent *= max(d, 1)
        if extent > MAX_BYTES:
            raise SafetensorsError(f"{where}: shape {list(dims)} is too large ({dt}, over {MAX_BYTES} bytes)")
    numel = 1
    for d in dims:
        numel *= d
    nbytes = numel * item
    if not start <= end <= data_len:
        raise SafetensorsError(f"{where}: data_offsets [{start}, {end}) lie outside the {data_len} data bytes")
    if end - start != nbytes:
        raise SafetensorsError(f"{where}: data_offsets [{start}, {end}) hold {end - start} bytes, but shape "
                               f"{list(dims)} {dt} needs {nbytes}")
    return dtype, dims, start, nbytes


class MappedSafetensors:
    """Header of a safetensors file plus lazily created tensor views of its mapping.

    A corrupted file raises SafetensorsError naming the bad value: never reads past the file, never
    allocates more than the header length it checked against the file size."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as e:
            raise SafetensorsError(f"cannot open {self.path}: {e}") from None
        try:
            self._open()
        except SafetensorsError as e:
            self._file.close()
            raise SafetensorsError(f"{self.path}: {e}: corrupted") from None

    def _open(self) -> None:
        size = os.fstat(self._file.fileno()).st_size
        head = self._file.read(8)
        if len(head) != 8:
            raise SafetensorsError(f"truncated file ({size} bytes), not safetensors")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER:
            raise SafetensorsError(f"header length {n} exceeds the file size {size} (or {MAX_HEADER})")
        try:
            header = json.loads(self._file.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise SafetensorsError(f"header is not valid JSON ({str(e)[:200]})") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"header is not a JSON object but {type(header).__name__}")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise SafetensorsError(f"__metadata__ {metadata!r:.200} is not an object of strings")
        self.metadata = metadata
        self._base = 8 + n
        data_len = size - self._base
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for key, info in header.items():
            dtype, shape, start, nbytes = parse_entry(key, info, data_len)
            self.entries[key] = (dtype, shape, self._base + start, nbytes)
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY) if size > 0 else None

    def keys(self):
        return self.entries.keys()

    def release(self) -> None:
        """Drop the mapping's resident pages (MADV_DONTNEED). Tensors stay valid: a later access reads
        the page again from the file (page cache). Used after weights were converted to other copies,
        so the fp32 originals do not count twice in resident memory. Weights are never written."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.entries[key][1]

    def get(self, key: str) -> torch.Tensor:
        dtype, shape, offset, nbytes = self.entries[key]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self._map, dtype=dtype, count=nbytes // torch.empty((), dtype=dtype).element_size(),
                                offset=offset)
        return flat.view(shape)


def load_all(path: str | Path, clone: bool = True) -> dict[str, torch.Tensor]:
    """All tensors of a (small) file; cloned by default so they are aligned and own their memory."""
    f = MappedSafetensors(path)
    return {k: (f.get(k).clone() if clone else f.get(k)) for k in f.keys()}

"""Memory-mapped safetensors reading: tensors are views of one private file mapping (no copy).

The file is mapped copy-on-write, so tensors are writable without touching the file; pages are read
from disk on first use and shared with the page cache.
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


class SafetensorsError(ValueError):
    pass


class MappedSafetensors:
    """Header of a safetensors file plus lazily created tensor views of its mapping."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as e:
            raise SafetensorsError(f"cannot open {self.path}: {e}") from None
        size = self.path.stat().st_size
        head = self._file.read(8)
        if len(head) != 8:
            raise SafetensorsError(f"{self.path}: truncated file ({size} bytes), not safetensors")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise SafetensorsError(f"{self.path}: header length {n} exceeds the file size {size}: corrupted")
        try:
            header = json.loads(self._file.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{self.path}: header is not valid JSON ({e}): corrupted") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: header is not a JSON object: corrupted")
        self.metadata = header.pop("__metadata__", None) or {}
        self._base = 8 + n
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY) if size > 0 else None
        data_len = size - self._base
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for key, info in header.items():
            try:
                dtype = DTYPES[info["dtype"]]
                shape = tuple(int(s) for s in info["shape"])
                start, end = (int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise SafetensorsError(f"{self.path}: malformed header entry for {key!r}: {info!r}") from None
            numel = 1
            for s in shape:
                numel *= s
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            if not (0 <= start <= end <= data_len) or end - start != nbytes:
                raise SafetensorsError(f"{self.path}: tensor {key!r} has offsets [{start}, {end}) that do not fit "
                                       f"its shape {list(shape)} {info['dtype']} in {data_len} data bytes: corrupted")
            self.entries[key] = (dtype, shape, self._base + start, nbytes)

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

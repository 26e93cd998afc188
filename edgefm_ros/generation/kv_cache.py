"""Static KV cache (preallocated per layer, stored through a codec) and the fixed-prefix cache on disk.

The cache never reallocates: ``capacity`` positions per layer are allocated once; a request only moves
``length``. A fixed prefix (system prompt) occupies positions [0, P) and is never overwritten, so
reusing it for a new request is ``cache.length = P``: constant time, whatever P is.

On disk a prefix is a safetensors file holding its keys/values per layer (compute dtype, codec-free:
the loading engine writes them through its own codec) and, in the metadata, the prefix token ids,
the weights' fingerprint and the combined fingerprint. Loading refuses a file whose fingerprint does
not match the engine's weights and the expected prefix.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from edgefm_ros.runtime.safetensors_mmap import MappedSafetensors

PREFIX_FORMAT = "edgefm-prefix-kv/1"


class PrefixMismatch(ValueError):
    """A stored prefix cache made for other weights or another prefix."""


class StaticKVCache:
    """Per layer storage of ``capacity`` positions for ``batch`` sequences, through ``codec``."""

    def __init__(self, codec, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype = torch.float32):
        if capacity <= 0 or layers <= 0 or batch <= 0:
            raise ValueError(f"KV cache needs positive layers/batch/capacity, got {layers}/{batch}/{capacity}")
        self.codec, self.capacity, self.batch = codec, capacity, batch
        self.stores = [codec.alloc(batch, kv_heads, capacity, head_dim, dtype) for _ in range(layers)]
        self.length = 0  # committed positions; positions past it are scratch

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        """k/v [B, Hkv, n, D] at positions [start, start + n)."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: positions up to {end} exceed its capacity {self.capacity}")
        self.codec.write(self.stores[layer], k, v, start)

    def read(self, layer: int, end: int):
        """Keys/values of positions [0, end): [B, Hkv, end, D] each."""
        return self.codec.read(self.stores[layer], end)

    def move(self, src: Sequence[int], dst: int) -> None:
        """Copy the entries of slots ``src`` to slots [dst, dst + len(src)) in every layer, as stored (no
        re-encoding: exact for any codec whose store tensors keep slots on axis 2, as every codec does).
        Sources are gathered before writing, so the ranges may overlap."""
        idx = torch.as_tensor(list(src), dtype=torch.long)
        end = dst + len(idx)
        if len(idx) == 0:
            return
        if int(idx.min()) < 0 or int(idx.max()) >= self.capacity or dst < 0 or end > self.capacity:
            raise ValueError(f"KV move of slots {idx.tolist()} to [{dst}, {end}) outside the capacity {self.capacity}")
        for store in self.stores:
            for t in store.values():
                if t.dim() == 4 and t.shape[2] == self.capacity:
                    t[:, :, dst:end] = t[:, :, idx]

    def nbytes(self) -> int:
        return sum(self.codec.nbytes(s) for s in self.stores)


def weights_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names, shapes, dtypes and bytes of the tensors, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        t = t.detach().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
        h.update(t.view(torch.uint8).reshape(-1).numpy().data if t.numel() else b"")
    return h.hexdigest()


def prefix_fingerprint(weights_fp: str, token_ids: Sequence[int], model_sig: str) -> str:
    raw = json.dumps({"format": PREFIX_FORMAT, "weights": weights_fp, "model": model_sig,
                      "tokens": [int(t) for t in token_ids]}, sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class PrefixKV:
    token_ids: tuple[int, ...]
    kv: list  # per layer (k, v) [1, Hkv, P, D]
    fingerprint: str
    weights_fp: str

    @property
    def length(self) -> int:
        return len(self.token_ids)


def save_prefix(path: str | Path, prefix: PrefixKV) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, (k, v) in enumerate(prefix.kv):
        tensors[f"layers.{i}.k"] = k.contiguous()
        tensors[f"layers.{i}.v"] = v.contiguous()
    meta = {"format": PREFIX_FORMAT, "fingerprint": prefix.fingerprint, "weights": prefix.weights_fp,
            "tokens": json.dumps(list(prefix.token_ids))}
    save_file(tensors, str(path), metadata=meta)
    return path


def load_prefix(path: str | Path, weights_fp: str, model_sig: str,
                token_ids: Sequence[int] | None = None) -> PrefixKV:
    """Read a stored prefix and check it against this engine's weights (and the expected prefix, if given)."""
    path = Path(path)
    try:
        meta = MappedSafetensors(path).metadata
    except (ValueError, OSError) as e:
        raise PrefixMismatch(f"prefix cache {path}: cannot read ({e})") from None
    if meta.get("format") != PREFIX_FORMAT:
        raise PrefixMismatch(f"prefix cache {path}: format {meta.get('format')!r}, expected {PREFIX_FORMAT!r}")
    stored = tuple(json.loads(meta.get("tokens", "[]")))
    if meta.get("weights") != weights_fp:
        raise PrefixMismatch(f"prefix cache {path} was built for other weights (fingerprint "
                             f"{str(meta.get('weights'))[:12]}..., these weights are {weights_fp[:12]}...): rebuild it")
    if token_ids is not None and tuple(int(t) for t in token_ids) != stored:
        raise PrefixMismatch(f"prefix cache {path} holds another prefix ({len(stored)} tokens) than the one "
                             f"expected ({len(token_ids)} tokens): rebuild it")
    expected = prefix_fingerprint(weights_fp, stored, model_sig)
    if meta.get("fingerprint") != expected:
        raise PrefixMismatch(f"prefix cache {path}: fingerprint {str(meta.get('fingerprint'))[:12]}... does not "
                             f"match {expected[:12]}... (other model configuration or a modified file): rebuild it")
    try:
        t = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise PrefixMismatch(f"prefix cache {path}: cannot read tensors ({e})") from None
    n = len({k.split(".")[1] for k in t})
    kv = [(t[f"layers.{i}.k"], t[f"layers.{i}.v"]) for i in range(n)]
    return PrefixKV(stored, kv, expected, weights_fp)

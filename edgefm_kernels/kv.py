"""KV-cache codecs: how one layer's keys/values are stored in the static cache and read back.

``impl.build(spec, params)`` -> codec with::

    store = codec.alloc(batch, kv_heads, capacity, head_dim, dtype)   # one layer's preallocated storage
    codec.write(store, k, v, start)   # k/v [B, Hkv, n, D] at positions [start, start + n)
    k, v = codec.read(store, end)     # positions [0, end) -> [B, Hkv, end, D] in ``dtype``
    codec.nbytes(store)               # bytes held

``read`` may return keys shifted by a per-(batch, head) constant vector: attention is invariant to
it (q.(k - m) moves every score of a query row by the same amount). A structural codec (eviction,
merging) would also return the positions it kept; the cache passes them on to build masks.
"""
from __future__ import annotations

import torch

from .registry import Impl, register


class PlainKV:
    """Reference: keys/values kept as written, in the compute dtype; reads are views (no copy)."""

    def alloc(self, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype) -> dict:
        shape = (batch, kv_heads, capacity, head_dim)
        return {"k": torch.zeros(shape, dtype=dtype), "v": torch.zeros(shape, dtype=dtype)}

    def write(self, store: dict, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        n = k.shape[2]
        store["k"][:, :, start:start + n] = k
        store["v"][:, :, start:start + n] = v

    def read(self, store: dict, end: int):
        return store["k"][:, :, :end], store["v"][:, :, :end]

    def nbytes(self, store: dict) -> int:
        return sum(t.numel() * t.element_size() for t in store.values())


FP16_TINY = 6.2e-5  # smallest normal float16: scales stay exact to 2^-11 relative


def _quantize(x: torch.Tensor):
    """x [..., D] float -> (int8 [..., D], scale f16 [..., 1]): symmetric, one scale per token and head."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / 127.0).clamp_min(FP16_TINY).half()
    q = torch.round(x.float() / scale.float()).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8KV(PlainKV):
    """int8 per token and head (float16 scales), SageAttention-style key smoothing.

    Keys lose their per-(batch, head) channel mean before quantisation (the mean of the first write,
    normally the prefill): what is left is centred, so one outlier channel no longer sets every
    token's scale. Reads return the smoothed keys (see the module doc) and dequantised values.
    """

    def __init__(self, smooth_keys: bool = True):
        self.smooth_keys = smooth_keys

    def alloc(self, batch, kv_heads, capacity, head_dim, dtype):
        shape, sshape = (batch, kv_heads, capacity, head_dim), (batch, kv_heads, capacity, 1)
        return {"k": torch.zeros(shape, dtype=torch.int8), "v": torch.zeros(shape, dtype=torch.int8),
                "k_scale": torch.zeros(sshape, dtype=torch.float16),
                "v_scale": torch.zeros(sshape, dtype=torch.float16),
                "k_mean": torch.zeros(batch, kv_heads, 1, head_dim), "dtype": torch.empty(0, dtype=dtype)}

    def write(self, store, k, v, start):
        n = k.shape[2]
        if start == 0 and self.smooth_keys:
            store["k_mean"].copy_(k.float().mean(dim=2, keepdim=True))
        kq, ks = _quantize(k.float() - store["k_mean"])
        vq, vs = _quantize(v)
        store["k"][:, :, start:start + n], store["k_scale"][:, :, start:start + n] = kq, ks
        store["v"][:, :, start:start + n], store["v_scale"][:, :, start:start + n] = vq, vs

    def read(self, store, end):
        dtype = store["dtype"].dtype
        k = (store["k"][:, :, :end].float() * store["k_scale"][:, :, :end].float()).to(dtype)
        v = (store["v"][:, :, :end].float() * store["v_scale"][:, :, :end].float()).to(dtype)
        return k, v


register(Impl("kv", "plain", lambda spec, params: PlainKV(), reference=True,
              doc="keys/values stored as computed; reads are views"))
register(Impl("kv", "int8", lambda spec, params: Int8KV(**params), precision="int8",
              param_space={"smooth_keys": (True, False)},
              doc="int8 per token/head, fp16 scales, keys smoothed by their channel mean"))

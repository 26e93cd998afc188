"""FlashInfer attention for single requests on NVIDIA GPUs (prefill, decode, cross-attention, GQA).

Same contract as attention.py: ``kernel(q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], mask bool [B, Lq, Lk] | None)``.
Each batch row is one FlashInfer request: ``single_prefill_with_kv_cache`` (any Lq, a custom mask) or
``single_decode_with_kv_cache`` (Lq == 1, no mask). Keys/values are read in place in the HND layout
(``k[b]`` is [Hkv, Lk, D]); KV heads are grouped inside the kernel (GQA).

A query row with no visible key gets the mean of all values (uniform weights), as LeRobot's
``finfo.min`` masking gives; FlashInfer itself would return zeros for it. The bit-packed masks and
the fully masked rows are derived once per mask object (once per chunk; inside a captured CUDA
graph when the mask buffer is first seen there, see runtime/graphs.py).
"""
from __future__ import annotations

import importlib.util

import torch

from .registry import Impl, OpSpec, register


def available() -> str | None:
    """None when FlashInfer can run here, else why not."""
    if importlib.util.find_spec("flashinfer") is None:
        return "the flashinfer package is not installed"
    if not torch.cuda.is_available():
        return "FlashInfer needs a CUDA device"
    return None


class FlashInferAttention:
    def __init__(self, backend: str = "auto"):
        import flashinfer  # noqa: F401  (fails here, at build, when missing)

        self.fi = flashinfer
        self.backend = backend
        self._src, self._packed, self._empty = None, None, None

    def masks(self, mask: torch.Tensor):
        """Per batch row: FlashInfer's bit-packed mask, and the indices of query rows that see nothing."""
        if mask is not self._src:
            packed = [self.fi.packbits(m.contiguous().view(-1), bitorder="little") for m in mask]
            empty = [(~m.any(dim=-1)).nonzero().flatten() for m in mask]
            self._src, self._packed, self._empty = mask, packed, empty
        return self._packed, self._empty

    def one(self, q, k, v, packed):  # q [Hq, Lq, D], k/v [Hkv, Lk, D] -> [Hq, Lq, D]
        if q.shape[1] == 1 and packed is None:
            out = self.fi.single_decode_with_kv_cache(q[:, 0].contiguous(), k, v, kv_layout="HND")
            return out[:, None]
        out = self.fi.single_prefill_with_kv_cache(q.transpose(0, 1).contiguous(), k, v, packed_custom_mask=packed,
                                                   kv_layout="HND", backend=self.backend)
        return out.transpose(0, 1)

    def __call__(self, q, k, v, mask):
        k, v = k.contiguous(), v.contiguous()
        packed, empty = self.masks(mask) if mask is not None else (None, None)
        outs = []
        for b in range(q.shape[0]):
            o = self.one(q[b], k[b], v[b], None if packed is None else packed[b])
            if empty is not None and empty[b].numel():
                groups = q.shape[1] // k.shape[1]
                uniform = v[b].mean(dim=1).repeat_interleave(groups, dim=0)  # [Hq, D]
                o = o.index_copy(1, empty[b], uniform[:, None].expand(-1, empty[b].numel(), -1).to(o.dtype))
            outs.append(o)
        return torch.stack(outs)


def _check(spec: OpSpec, params) -> str | None:
    hq, hkv = spec.dims.get("heads", 1), spec.dims.get("kv_heads", 1)
    if hq % hkv:
        return f"{hq} query heads are not a multiple of {hkv} kv heads"
    if spec.dims.get("head_dim", 64) not in (64, 128, 256):
        return f"FlashInfer's prebuilt kernels take head_dim 64/128/256, not {spec.dims['head_dim']}"
    return available()


register(Impl("attention", "flashinfer", lambda spec, params: FlashInferAttention(**params), hw_prefixes=("cuda",),
              param_space={"backend": ("auto", "fa2", "fa3")}, precision="bf16", check=_check,
              doc="FlashInfer single-request prefill/decode (fp16/bf16), custom masks, GQA in-kernel"))

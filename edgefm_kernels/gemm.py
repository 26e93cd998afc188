"""CPU GEMM paths for a fixed weight, shared by the fast linear and MLP implementations.

``Gemm(make, backend, post)``, ``make() -> (W [N, K], b [N] | None)``, is a callable ``x [..., K] -> [..., N]``
(x in W's dtype):
  aten    F.linear: MKL sgemm for fp32, oneDNN for bf16 (the weight is re-laid out on every call)
  mkl     MKL packed sgemm (fp32 only): the weight packed once
  onednn  oneDNN with the weight reordered once into its blocked layout (fp32, or bf16 on AMX)
  panel   our AVX-512 kernel (panel_gemm.py, fp32 only): 32-column panels packed once for every M,
          the next panel prefetched while one is used; made for decode, where the weights are cold
  amx     our AMX kernel (amx_gemm.py, bf16 here; int8 through quant.py's int8_amx): the weight packed once
          into the tiles' read order, the epilogue (and a residual) fused; made for decode (M = 50), where it
          streams the weight once per call
``post`` is an epilogue: "none", "gelu_tanh" (fused by oneDNN, applied after aten/mkl), "silu_glu" (W stacks
gate over up, [2I, K]; the output is silu(gate) * up [..., I]: fused by the panel kernel, applied after the
others). ``epilogue`` says who applies it: "library" (as above) or "avx512" (bf16 only: one pass of our
csrc/bf16_rows.c over the GEMM output; oneDNN's fused GELU costs as much as the GEMM at the vision MLP's
shape, torch's bf16 GELU/SiLU far more).

Weights are converted (dtype, concatenation) once at build; ``pages.release_pages`` then asks the kernel
to drop the resident pages of the memory-mapped source so a converted copy does not double the RSS.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from . import amx_gemm, bf16_rows, native, panel_gemm


BACKENDS = ("aten", "mkl", "onednn", "panel")  # fp32
BF16_BACKENDS = ("aten", "onednn", "amx")
POSTS = ("none", "gelu_tanh", "silu_glu")
EPILOGUES = ("library", "avx512")


def backend_rejects(backend: str, dtype: torch.dtype) -> str | None:
    if backend not in BACKENDS + BF16_BACKENDS:
        return f"unknown GEMM backend {backend!r}; known: {tuple(dict.fromkeys(BACKENDS + BF16_BACKENDS))}"
    if backend == "mkl" and dtype != torch.float32:
        return "the mkl packed GEMM is fp32 only"
    if backend in ("mkl", "onednn") and not torch.backends.mkldnn.is_available():
        return f"backend {backend!r} needs torch built with oneDNN/MKL"
    if backend == "panel":
        if dtype != torch.float32:
            return "the panel GEMM is fp32 only"
        return panel_gemm.unavailable()
    if backend == "amx":
        if dtype != torch.bfloat16:
            return "the AMX GEMM is bf16 only"
        return amx_gemm.unavailable()
    return None


def epilogue_rejects(epilogue: str, dtype: torch.dtype) -> str | None:
    if epilogue not in EPILOGUES:
        return f"unknown GEMM epilogue kernel {epilogue!r}; known: {EPILOGUES}"
    if epilogue == "avx512":
        if dtype != torch.bfloat16:
            return "the avx512 epilogue kernels take bf16 GEMM outputs"
        return native.unavailable(bf16_rows.NAME)
    return None


def backend_check(dtype: torch.dtype):
    """An ``Impl.check`` for impls whose ``backend`` (and ``epilogue``) parameters pick the GEMM path."""
    def check(spec, params) -> str | None:
        reason = epilogue_rejects(params.get("epilogue", "library"), dtype)
        if reason:
            return reason
        backend = params.get("backend", "aten")
        if backend == "amx" and params.get("epilogue", "library") != "library":
            return "the amx backend applies its epilogue in the kernel (epilogue=library)"
        if backend != "aten" and not spec.hw_profile.startswith("cpu"):
            return f"backend {backend!r} is a CPU GEMM, this is {spec.hw_profile!r}"
        if backend == "panel" and not spec.hw_profile.startswith("cpu_x86_avx512"):
            return native.avx512_check(panel_gemm.NAME)(spec, params)
        return backend_rejects(backend, dtype)
    return check


class Gemm:
    """``y = x W^T + b`` through one CPU GEMM path; ``make() -> (W [N, K], b [N] | None)`` builds the weight.

    Packed backends pack the weight at the first call with more than one row, with that call's row count as
    the layout hint, and keep only packed layouts. That layout serves every other row count above one:
    outputs bitwise equal to a layout packed for that count, at the same speed (MKL and oneDNN fp32/bf16,
    M from 2 to 3072; tests/kernels/test_kernel_small_ops.py). Single rows (autoregressive decode) take the
    libraries' matrix-vector path and get a layout of their own. A layout per row count, as before,
    repacked the VLM's weights for every new instruction length: +0.9 GB RSS and a 0.5 s slower chunk in
    FULL fast mode.
    """

    def __init__(self, make, backend: str = "aten", post: str = "none", epilogue: str = "library"):
        w, b = make()
        reason = backend_rejects(backend, w.dtype) or epilogue_rejects(epilogue, w.dtype)
        if reason:
            raise ValueError(reason)
        if post not in POSTS:
            raise ValueError(f"unknown GEMM epilogue {post!r}; known: {POSTS}")
        if backend != "aten" and w.device.type != "cpu":
            raise ValueError(f"backend {backend!r} runs on CPU, the weight is on {w.device}")
        self.make, self.backend, self.post = make, backend, post
        self.own_post = epilogue == "avx512" and post != "none"  # applied by bf16_rows after a plain GEMM
        self.w, self.b = w, b
        self.dtype = w.dtype
        # MKL's packed GEMM only reads the original weight for another M, which never reaches it
        self._origin = torch.zeros((), dtype=w.dtype).expand(w.shape) if backend == "mkl" else None
        self._packed: dict[int, torch.Tensor] = {}  # packed layouts (mkl / onednn): {1: single rows, 2: more}
        self._kernel = None  # our kernels' packed weight (panel, amx)
        if post == "silu_glu" and b is not None:
            raise ValueError("silu_glu takes a bias-free gate/up weight")
        self.out_features = out_features(w, post)
        if backend == "panel":  # one layout for every M: pack now, keep only the panels
            self._kernel = (panel_gemm.PanelGlu(*w.chunk(2)) if post == "silu_glu"
                           else panel_gemm.PanelWeight(w, b))
            self.w = self.b = None
        elif backend == "amx":  # one layout for every M, the epilogue in the kernel
            self._kernel = amx_gemm.AmxWeight(w, b, post)
            self.w = self.b = None
            self.own_post = False

    def packed(self, m: int) -> torch.Tensor:
        """The packed layout for ``m`` rows: one for single rows (the libraries' matrix-vector path sums in
        another order) and one, made at the first call with more, that serves every other row count."""
        key = min(m, 2)
        p = self._packed.get(key)
        if p is None:
            w = self.w if self.w is not None else self.make()[0]
            if self.backend == "mkl":
                p = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
            else:
                p = torch.ops.mkldnn._reorder_linear_weight(w, m)
            self._packed[key] = p
            self.w = None
        return p

    @property
    def takes_residual(self) -> bool:
        """``__call__(x, residual)`` adds the residual inside the kernel (our AMX backend)."""
        return self.backend == "amx"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] -> [..., N] (+ residual [..., N], only where ``takes_residual``)."""
        x2 = x.reshape(-1, x.shape[-1])
        if residual is not None:
            if not self.takes_residual:
                raise ValueError(f"backend {self.backend!r} does not add a residual; add it after the call")
            return self._kernel(x2, residual.reshape(-1, self.out_features)).view(*x.shape[:-1], self.out_features)
        if self.backend == "amx" or (self.backend == "panel" and self.post == "silu_glu"):
            y = self._kernel(x2)  # the epilogue fused into our kernel
        elif self.backend == "onednn" and self.post == "gelu_tanh" and not self.own_post:
            y = torch.ops.mkldnn._linear_pointwise(x2, self.packed(x2.shape[0]), self.b, "gelu", [], "tanh")
        else:
            y = self._gemm(x2)
            y = (bf16_rows.gelu_tanh_(y) if self.post == "gelu_tanh" else bf16_rows.silu_glu(y)) if self.own_post \
                else epilogue(y, self.post)
        return y.view(*x.shape[:-1], self.out_features)

    def _gemm(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K] W^T + b [M, N], no epilogue."""
        m = x2.shape[0]
        if self.backend == "aten":
            return F.linear(x2, self.w, self.b)
        if self.backend in ("panel", "amx"):
            return self._kernel(x2)
        if self.backend == "mkl":
            return torch.ops.mkl._mkl_linear(x2, self.packed(m), self._origin, self.b, m)
        return torch.ops.mkldnn._linear_pointwise(x2, self.packed(m), self.b, "none", [], "")


def with_residual(gemm, x: torch.Tensor, residual: torch.Tensor | None, dtype: torch.dtype,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``gemm(x)`` (a GEMM computing in ``dtype``) in ``out_dtype`` (default x's), ``residual +`` it when given:
    added in the kernel's epilogue with one rounding where the GEMM ``takes_residual`` and x, the residual
    and the output are all ``dtype``; else after the GEMM (x cast to ``dtype``, its output back)."""
    out_dtype = out_dtype or x.dtype
    if (residual is not None and x.dtype == residual.dtype == dtype == out_dtype
            and getattr(gemm, "takes_residual", False)):
        return gemm(x, residual)
    y = gemm(x if x.dtype == dtype else x.to(dtype))
    y = y if y.dtype == out_dtype else y.to(out_dtype)
    return y if residual is None else residual + y


def out_features(w: torch.Tensor, post: str) -> int:
    """Output width of a GEMM with weight ``w`` [N, K] and epilogue ``post``."""
    if post == "silu_glu" and w.shape[0] % 2:
        raise ValueError(f"silu_glu takes a [2I, K] gate/up weight, got {tuple(w.shape)}")
    return w.shape[0] // 2 if post == "silu_glu" else w.shape[0]


def epilogue(y: torch.Tensor, post: str) -> torch.Tensor:
    """``post`` applied to a GEMM output y [..., N] the caller owns (paths that do not fuse it); GELU works
    in place (the same values as F.gelu, one pass and no second buffer)."""
    if post == "gelu_tanh":
        return torch.ops.aten.gelu_(y, approximate="tanh")
    if post == "silu_glu":
        gate, up = y.split(y.shape[-1] // 2, dim=-1)
        return F.silu(gate) * up
    return y


def concat(weights: Sequence[tuple[torch.Tensor, "torch.Tensor | None"]], dtype: torch.dtype):
    """Weights [(W_i [N_i, K], b_i | None)] -> (W [sum N_i, K], b [sum N_i] | None), contiguous, in dtype."""
    ws = [w for w, _ in weights]
    w = torch.cat([t.to(dtype) for t in ws], dim=0) if len(ws) > 1 else ws[0].to(dtype).contiguous()
    if w is ws[0]:
        w = w.clone()  # own the memory: the source may be a view of a mapped file
    if all(b is None for _, b in weights):
        return w, None
    bs = [b if b is not None else torch.zeros(wi.shape[0], dtype=wi.dtype, device=wi.device) for wi, b in weights]
    return w, torch.cat([t.to(dtype) for t in bs], dim=0)


def gemm_factory(params):
    """``(make, post) -> Gemm`` for an impl whose ``backend`` (and ``epilogue``) parameters pick the GEMM path."""
    backend, epilogue = params.get("backend", "aten"), params.get("epilogue", "library")
    return lambda make, post: Gemm(make, backend, post, epilogue)

"""CUDA-graph capture and replay of an engine phase over static buffers (CUDA only).

    decode = CapturedPhase(engine.decode, (prefix, noise))   # at activate: warm-up + capture, timed
    actions = decode(prefix, noise)                          # per chunk: copy inputs in, replay

The whole Euler loop (every step, every layer) becomes one graph launch; the vision tower
(``model.embed_images``) is captured the same way where the camera count is fixed. Arguments may be
nested lists/tuples/dicts/dataclasses of tensors (the engine's Prefix); non-tensor leaves are part
of the graph and must be equal at replay. The returned outputs are the graph's static buffers:
consume or clone them before the next replay.

Kernels cache tensors derived from their inputs per input object (additive masks, packed masks,
whole-width RoPE tables). Warm-up therefore runs on clones and the capture on fresh static buffers,
so that every such derivation is first made inside the capture and is recomputed by each replay.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch


def flatten(tree: Any) -> tuple[list[torch.Tensor], Any]:
    """Tensors of a nested structure, in order, and a spec to rebuild it (non-tensors kept in the spec)."""
    leaves: list[torch.Tensor] = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            leaves.append(x)
            return ("T", len(leaves) - 1)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return ("D", type(x), tuple((f.name, walk(getattr(x, f.name))) for f in dataclasses.fields(x)))
        if isinstance(x, (list, tuple)):
            return ("L" if isinstance(x, list) else "U", tuple(walk(v) for v in x))
        if isinstance(x, dict):
            return ("M", tuple((k, walk(v)) for k, v in x.items()))
        return ("C", x)

    return leaves, walk(tree)


def unflatten(spec: Any, leaves: list[torch.Tensor]) -> Any:
    tag = spec[0]
    if tag == "T":
        return leaves[spec[1]]
    if tag == "D":
        return spec[1](**{name: unflatten(s, leaves) for name, s in spec[2]})
    if tag in ("L", "U"):
        items = [unflatten(s, leaves) for s in spec[1]]
        return items if tag == "L" else tuple(items)
    if tag == "M":
        return {k: unflatten(s, leaves) for k, s in spec[1]}
    return spec[1]


def same_structure(a: Any, b: Any) -> bool:
    """Specs equal up to tensor positions (constants compared by value)."""
    return a == b


class CapturedPhase:
    """``fn(*args)`` captured once into a CUDA graph; calls copy new arguments in and replay it."""

    def __init__(self, fn: Callable, example_args: tuple, warmup: int = 2, pool=None):
        leaves, self.spec = flatten(tuple(example_args))
        if not torch.cuda.is_available():
            raise ValueError("CUDA graphs need a CUDA device; this machine has none")
        off = [tuple(t.shape) for t in leaves if t.device.type != "cuda"]
        if off:
            raise ValueError(f"every tensor argument must be on the GPU to capture a graph; {len(off)} are not "
                             f"(shapes {off[:4]})")
        self.fn = fn
        self.static_in = [t.clone() for t in leaves]
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(warmup):  # clones: caches keyed by input objects must not keep these
                fn(*unflatten(self.spec, [t.clone() for t in leaves]))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool), torch.no_grad():
            self.static_out = fn(*unflatten(self.spec, self.static_in))
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0

    def __call__(self, *args):
        leaves, spec = flatten(tuple(args))
        if not same_structure(spec, self.spec):
            raise ValueError("arguments differ in structure or constants from the captured ones; capture again")
        for dst, src in zip(self.static_in, leaves):
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(f"captured for {tuple(dst.shape)} {dst.dtype}, got {tuple(src.shape)} {src.dtype}")
            dst.copy_(src, non_blocking=True)
        self.graph.replay()
        return self.static_out

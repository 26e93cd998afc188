"""CPU replay of a captured call: the ops of ``fn(*args)`` recorded once, on static buffers, and run again
without the Python between them (the CPU's counterpart of graphs.CapturedPhase).

    step = CpuGraph(fn, example_args)     # fn runs once on static copies of the arguments, recording
    step.load(*args)                      # copy new values into the static buffers (None: keep a part)
    out = step.replay()                   # every recorded op again, in order; out is a static buffer

A Euler step of the action expert is ~130 kernel calls on 50 rows; each costs 10-30 us of Python (module
calls, argument checks, output allocation) around a 15-100 us kernel, and the other OpenMP thread spins
meanwhile. The replay keeps the kernels and drops the Python:
- native kernels (``edgefm_kernels.native``) are recorded as the C function and its converted arguments
  (raw pointers into tensors the graph keeps alive) and called again with the same arguments;
- torch ops are recorded by a TorchDispatchMode: views cost nothing again (they alias recorded tensors),
  in-place and ``out=`` ops run again as they were called, fresh results are recomputed and copied into the
  tensors the capture made (later ops read those), ``empty`` buffers are left as they are;
- a host value read from a tensor (``bool(mask.all())``: a kernel's branch) becomes a guard: replay reads it
  again and raises GuardFailed when it differs, and the caller runs ``fn`` eagerly instead.
A warm-up call on clones comes first, so that lazy preparations (a weight packed for a new row count) are
made once, outside the recording. The capture then runs on fresh static buffers, so kernels that cache
something derived from an input object (-sin of RoPE tables, packed masks) derive it inside the capture, and
every replay derives it again.
A capture is checked before it is used: every tensor the capture made is overwritten with a poison value,
and a replay on the capture's own inputs must give the eager output bit for bit (a kernel call that escaped
the recording would leave poison behind), or CaptureError is raised.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from edgefm_kernels import native

from .graphs import flatten, same_structure, unflatten


POISON = 1234.5  # written into every made tensor before the check replay (finite: 0 * poison stays 0)


class CaptureError(RuntimeError):
    """fn cannot be captured (a random op, a replay that differs from the eager run)."""


class GuardFailed(RuntimeError):
    """A host value read during the capture differs at replay: run fn eagerly for these inputs."""


def _tensors(x: Any) -> list[torch.Tensor]:
    return flatten(x)[0]


_SCRATCH = (torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like)  # written by later ops


def _draws(func, args: tuple, kwargs: dict) -> bool:
    """A seeded op that draws at this call: attention with dropout_p 0 (SDPA's CPU kernels) does not."""
    names = [a.name for a in func._schema.arguments]
    if "dropout_p" in names:
        i = names.index("dropout_p")
        return float(kwargs.get("dropout_p", args[i] if i < len(args) else 0.0)) != 0.0
    return True


class _Recorder(TorchDispatchMode):
    """Turns every torch op and native call made while active into a zero-argument replay entry."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing here is compiled: no lazy import of torch._dynamo (0.9 s, 140 MB) on first use

    def __init__(self):
        super().__init__()
        self.entries: list[Callable[[], None]] = []
        self.keep: list[Any] = []  # every tensor and argument a recorded entry points to
        self.made: list[torch.Tensor] = []  # tensors the recorded ops made (not views)

    # -- native kernels (native.recording calls this) ------------------------------------------------
    def native(self, fn, args: tuple, result: Any) -> None:
        self.keep.append(args)

        def call():
            if fn(*args) != result:  # the kernels' status codes (0: done)
                raise GuardFailed(f"native kernel {getattr(fn, '__name__', fn)} returned another status")

        self.entries.append(call)

    # -- torch ops ---------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs):
            raise CaptureError(f"{func} draws random numbers: a replay would repeat the capture's draws")
        out = func(*args, **kwargs)
        self.keep.append((args, kwargs, out))
        aliases = [r.alias_info for r in func._schema.returns if r.alias_info is not None]
        outs = _tensors(out)
        if any(a.is_write for a in aliases):  # in place or out=: run again as called
            self.entries.append(lambda: func(*args, **kwargs))
        elif aliases:  # a view of a recorded tensor: nothing to do again
            pass
        elif not outs:  # a host value (item, is_nonzero, equal, ...): a guard
            def guard():
                if func(*args, **kwargs) != out:
                    raise GuardFailed(f"{func} read another value than at capture ({out!r})")

            self.entries.append(guard)
        else:
            self.made.extend(outs)
            if func.overloadpacket not in _SCRATCH:  # a fresh result: recomputed into the capture's tensor
                def recompute():
                    for dst, src in zip(outs, _tensors(func(*args, **kwargs))):
                        dst.copy_(src)

                self.entries.append(recompute)
        return out


class CpuGraph:
    """``fn(*args)`` captured once on static copies of ``example_args``' tensors; see the module doc."""

    def __init__(self, fn: Callable, example_args: tuple):
        leaves, self.spec = flatten(tuple(example_args))
        if any(t.device.type != "cpu" for t in leaves):
            raise ValueError("CpuGraph captures CPU tensors only (CUDA: graphs.CapturedPhase)")
        self.parts = [len(flatten(a)[0]) for a in example_args]  # leaves per positional argument
        self.static_in = [t.clone() for t in leaves]
        t0 = time.perf_counter()
        with torch.no_grad():  # warm-up on clones: lazy preparations (weights packed for this row count) are
            fn(*unflatten(self.spec, [t.clone() for t in leaves]))  # made once, not recorded and redone
        rec = _Recorder()
        with torch.no_grad(), native.recording(rec), rec:
            out = fn(*unflatten(self.spec, self.static_in))
        self.entries, self._keep = rec.entries, rec.keep
        self.static_out = out
        eager = [t.clone() for t in _tensors(out)]
        self.capture_s = time.perf_counter() - t0
        with torch.no_grad():
            for t in rec.made:
                if t.layout == torch.strided and not t.is_mkldnn and t.is_floating_point():
                    t.fill_(POISON)
        self.replay()
        if not all(torch.equal(a, b) for a, b in zip(_tensors(self.static_out), eager)):
            raise CaptureError("a replay of the capture differs from its eager run")

    def fits(self, *args) -> bool:
        """The same structure, constants, shapes and dtypes as the captured arguments (strides may differ:
        load() copies values into the static buffers the capture ran on)."""
        leaves, spec = flatten(tuple(args))
        return same_structure(spec, self.spec) and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            for a, b in zip(leaves, self.static_in))

    def load(self, *args) -> None:
        """Copy positional arguments into the static buffers; an argument given as None keeps its values."""
        if len(args) != len(self.parts):
            raise ValueError(f"CpuGraph.load takes {len(self.parts)} arguments, got {len(args)}")
        start = 0
        for arg, n in zip(args, self.parts):
            if arg is not None:
                for dst, src in zip(self.static_in[start:start + n], flatten(arg)[0]):
                    dst.copy_(src)
            start += n

    def replay(self):
        """Run every recorded op again; returns the static output (read or clone it before the next replay)."""
        with torch.no_grad():
            for entry in self.entries:
                entry()
        return self.static_out

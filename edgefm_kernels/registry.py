"""Registry of operator implementations, keyed by (op_kind, impl_id).

An implementation is a factory: ``impl.build(spec, params, **operands)`` returns the callable the model
runs (an ``nn.Module`` when it owns weights). ``impl.rejects(spec, params)`` returns why it cannot serve
a spec (shape, dtype, hardware), or None. Registration happens once, at import of the op modules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

OP_KINDS = ("attention", "linear", "mlp", "rms_norm", "layer_norm", "rope", "patch_embed", "pixel_shuffle",
            "kv", "cast")


@dataclass(frozen=True)
class OpSpec:
    """One operator instance the model executes, as the dispatch table sees it."""

    op_kind: str
    op_name: str  # unique path, e.g. "vlm.layers.3.self_attn.qkv"
    layer_role: str  # e.g. "vlm_qkv", "expert_cross_attn"
    stage: str  # "prefill" | "decode"
    shape_sig: str  # e.g. "960->960+320+320", "h15/5xd64"
    hw_profile: str
    model: str = "smolvla"
    dims: Mapping[str, int] = field(default_factory=dict)  # named sizes the impl may check


@dataclass(frozen=True)
class Impl:
    op_kind: str
    impl_id: str
    build: Callable[..., Any]
    reference: bool = False
    # hardware profiles this impl runs on: prefixes as in the table ("" = any)
    hw_prefixes: tuple[str, ...] = ("",)
    # tunable parameters and their candidate values (for `edgefm-vla tune`)
    param_space: Mapping[str, tuple] = field(default_factory=dict)
    # accuracy class: "exact" (fp32, reference-equivalent up to summation order) or a low precision
    precision: str = "fp32"
    check: Callable[[OpSpec, Mapping[str, Any]], str | None] | None = None
    doc: str = ""

    def rejects(self, spec: OpSpec, params: Mapping[str, Any]) -> str | None:
        """Why this impl cannot serve ``spec`` with ``params``; None when it can."""
        if spec.op_kind != self.op_kind:
            return f"impl {self.impl_id!r} is a {self.op_kind} kernel, not {spec.op_kind}"
        if not any(spec.hw_profile.startswith(p) for p in self.hw_prefixes):
            return f"impl {self.impl_id!r} needs hardware {self.hw_prefixes}, this is {spec.hw_profile!r}"
        unknown = sorted(set(params) - set(self.param_space))
        if unknown:
            return f"impl {self.impl_id!r} has no parameter(s) {unknown}; known: {sorted(self.param_space)}"
        for k, v in params.items():
            allowed = self.param_space[k]
            if allowed and v not in allowed:
                return f"impl {self.impl_id!r} parameter {k}={v!r} not in {list(allowed)}"
        return self.check(spec, params) if self.check is not None else None


_REGISTRY: dict[tuple[str, str], Impl] = {}


def register(impl: Impl) -> Impl:
    if impl.op_kind not in OP_KINDS:
        raise ValueError(f"unknown op_kind {impl.op_kind!r}; known: {OP_KINDS}")
    key = (impl.op_kind, impl.impl_id)
    if key in _REGISTRY:
        raise ValueError(f"impl {impl.impl_id!r} for {impl.op_kind} registered twice")
    _REGISTRY[key] = impl
    return impl


def get_impl(op_kind: str, impl_id: str) -> Impl:
    try:
        return _REGISTRY[(op_kind, impl_id)]
    except KeyError:
        known = sorted(i for (k, i) in _REGISTRY if k == op_kind)
        raise KeyError(f"no impl {impl_id!r} registered for op_kind {op_kind!r}; registered: {known}") from None


def impls_for(op_kind: str) -> list[Impl]:
    return [impl for (k, _), impl in _REGISTRY.items() if k == op_kind]


def op_kinds() -> tuple[str, ...]:
    return OP_KINDS



"""edgefm_kernels: operator implementations selected by the runtime's dispatch table.

One module per op family. Each registers implementations by ``impl_id`` in the registry; every op kind
has a PyTorch reference (``reference=True``) that defines the op's semantics and that every other
implementation is tested against. Importing this package registers all implementations.
"""
from . import registry  # noqa: F401
from . import attention, linear, mlp, norm, rope, vision  # noqa: F401  (registration side effects)
from .registry import Impl, OpSpec, get_impl, impls_for, op_kinds

__all__ = ["Impl", "OpSpec", "get_impl", "impls_for", "op_kinds"]

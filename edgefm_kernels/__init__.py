"""edgefm_kernels: operator implementations selected by the runtime's dispatch table.

One module per op family. Each registers implementations by ``impl_id`` in the registry; every op kind
has a PyTorch reference (``reference=True``) that defines the op's semantics and that every other
implementation is tested against. Importing this package registers all implementations.
"""
from . import registry  # noqa: F401
from . import attention, cast, linear, mlp, norm, quant, rope, vision  # noqa: F401  (registration side effects)
from . import cuda_linear, flashinfer_ops, triton_ops  # noqa: F401  (GPU skills; import no GPU library)
from . import kv  # noqa: F401  (KV-cache codecs)
from .registry import Impl, OpSpec, get_impl, impls_for, op_kinds

__all__ = ["Impl", "OpSpec", "get_impl", "impls_for", "op_kinds"]

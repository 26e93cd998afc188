#!/usr/bin/env python
"""LeRobot 0.4.4 goldens with SmolVLM's *fixed* vision position ids (transformers 5 / LeRobot >= 0.5).

The reference harness (../shared/reference/lerobot_harness) runs LeRobot 0.4.4 on transformers 4.57, whose
SmolVLM vision embeddings use the legacy ids (fractional coordinate scaled by 1 - 1e-6 before bucketing).
Everything else SmolVLA computes is the same in LeRobot 0.6.x, so running the harness's own
make_goldens.py with only the embeddings' position ids switched to the fixed rule gives the goldens
LeRobot 0.6.x would give for the same checkpoint, inputs and noise. For TINY that is checked against
../shared/reference/smolvla-tiny/golden-lerobot-0.6.1 (made with LeRobot 0.6.1 itself).

Run with the harness's interpreter, from a writable copy of the harness (it writes next to itself):

  cd /work/lerobot_harness && /work/lerobot-venv/bin/python /work/main/benchmarks/lerobot_goldens_fixed.py \
      --harness . --variants tiny full

Writes <harness>/artifacts-fixed/<variant>/{checkpoint,golden}/ (the checkpoint is the same seeded
random weights as artifacts/<variant>/checkpoint). tests/runtime/test_full_parity.py reads the FULL one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def fixed_bucket_ids(n: int, side: int, dtype) -> "torch.Tensor":  # noqa: F821
    """Bucket (in ``side`` bins) of each of ``n`` patches along one axis, transformers 5's rule:
    float32 coordinate i * (1 / n), clamped below 1, cast to the pixels' dtype, bucketed right-closed."""
    import torch

    bounds = torch.arange(1 / side, 1.0, 1 / side)
    frac = torch.arange(n, dtype=torch.float32) * (1.0 / torch.tensor(n))
    frac = torch.clamp(frac, max=1.0 - 1e-6).to(dtype)
    return torch.bucketize(frac, bounds, right=True)


def patched_embeddings_forward(self, pixel_values, patch_attention_mask):
    """SmolVLMVisionEmbeddings.forward with the fixed position ids (the rest as in 4.57: conv, flatten, add)."""
    import torch

    b = pixel_values.shape[0]
    x = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # [B, N, H]
    side = self.num_patches_per_side
    ids = torch.zeros(b, x.shape[1], dtype=torch.long)
    for i, valid in enumerate(patch_attention_mask):
        rows = fixed_bucket_ids(int(valid[:, 0].sum()), side, pixel_values.dtype)
        cols = fixed_bucket_ids(int(valid[0].sum()), side, pixel_values.dtype)
        ids[i, valid.reshape(-1).cpu()] = (rows[:, None] * side + cols).flatten()
    return x + self.position_embedding(ids.to(self.position_embedding.weight.device))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", type=Path, required=True, help="writable copy of the LeRobot harness folder")
    ap.add_argument("--variants", nargs="+", default=["tiny", "full"], choices=("tiny", "full"))
    ap.add_argument("--out", default="artifacts-fixed", help="folder under --harness (default artifacts-fixed)")
    args = ap.parse_args()
    harness = args.harness.resolve()
    sys.path.insert(0, str(harness))
    import common  # noqa: F401  (offline env + torchvision shim, before transformers/lerobot)

    import make_goldens
    from transformers.models.smolvlm import modeling_smolvlm

    modeling_smolvlm.SmolVLMVisionEmbeddings.forward = patched_embeddings_forward
    make_goldens.ARTIFACTS = harness / args.out
    for name in args.variants:
        make_goldens.run_variant(make_goldens.VARIANTS[name], skip_reload=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

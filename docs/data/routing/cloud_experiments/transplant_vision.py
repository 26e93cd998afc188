"""A copy of checkpoint SRC with the tensors of ENC.pt (localize_vision.py's output) in place of its own.

    python docs/data/routing/cloud_experiments/transplant_vision.py SRC ENC.pt OUT
"""
import sys, shutil, torch
from pathlib import Path
from edgefm_ros.runtime.safetensors_mmap import load_all
from safetensors.torch import save_file
src, enc, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
if out.exists(): shutil.rmtree(out)
shutil.copytree(src, out)
w = load_all(out / "model.safetensors"); w = {k: v.clone() for k, v in w.items()}
e = torch.load(enc)
assert set(e) <= set(w), set(e) - set(w)
for k, v in e.items():
    assert w[k].shape == v.shape; w[k] = v.to(w[k].dtype).contiguous()
save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
print("replaced", len(e), "tensors ->", out)

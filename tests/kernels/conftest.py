"""Kernel tests: make ``edgefm_kernels`` importable from the source tree when the package is not installed."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# the suite imports test files by path (--import-mode=importlib): make kernel_helpers.py importable
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:  # installed (pip/colcon) as edgefm_kernels
    import edgefm_kernels  # noqa: F401
except ImportError:  # source tree without an install: its edgefm_kernels/ folder is the package
    sys.path.insert(0, str(ROOT))
    import edgefm_kernels  # noqa: F401


@pytest.fixture
def gen() -> torch.Generator:
    """A generator seeded fresh each run (the seed is printed on failure through the test id)."""
    seed = torch.randint(0, 2**31 - 1, (1,)).item()
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def goldens_tiny(shared_reference):
    """(ModelInputs, outputs incl. the noise) of the TINY golden run."""
    from edgefm_ros.runtime.preprocess import ModelInputs
    from edgefm_ros.runtime.safetensors_mmap import load_all

    g = load_all(shared_reference / "smolvla-tiny" / "golden" / "inputs.safetensors")
    out = load_all(shared_reference / "smolvla-tiny" / "golden" / "outputs.safetensors")
    inputs = ModelInputs((g["images.0"], g["images.1"]), (g["img_masks.0"].bool(), g["img_masks.1"].bool()),
                         g["lang_tokens"], g["lang_masks"].bool(), g["state"])
    return inputs, {"actions": out["actions"], "noise": g["noise"]}

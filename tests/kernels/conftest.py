"""Kernel tests: make ``edgefm_kernels`` importable from the source tree when the package is not installed."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
# the suite imports test files by path (--import-mode=importlib): make kernel_helpers.py importable
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:  # installed (pip/colcon) as edgefm_kernels
    import edgefm_kernels  # noqa: F401
except ImportError:  # source tree: kernels/ is the package
    spec = importlib.util.spec_from_file_location("edgefm_kernels", KERNELS / "__init__.py",
                                                  submodule_search_locations=[str(KERNELS)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["edgefm_kernels"] = module
    spec.loader.exec_module(module)


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

"""Fixtures for runtime tests: the tiny reference checkpoint, its goldens, engines per mode."""
import pytest

from edgefm_ros.runtime.safetensors_mmap import load_all


@pytest.fixture(scope="session")
def tiny(shared_reference):
    """(checkpoint dir, vlm dir, golden dir) of the TINY LeRobot reference."""
    return (shared_reference / "smolvla-tiny", shared_reference / "vlm" / "smolvlm-tiny",
            shared_reference / "smolvla-tiny" / "golden")


@pytest.fixture(scope="session")
def goldens(tiny):
    """(inputs, outputs, intermediates) of LeRobot 0.4.4 (transformers 4.57: legacy vision position ids)."""
    g = tiny[2]
    return load_all(g / "inputs.safetensors"), load_all(g / "outputs.safetensors"), load_all(g / "intermediates.safetensors")


@pytest.fixture(scope="session")
def goldens_by_convention(tiny, goldens):
    """{vision position-id convention: (inputs, outputs, intermediates)}: legacy = LeRobot 0.4.4's goldens,
    fixed = LeRobot 0.6.1's (transformers 5) for the same checkpoint, inputs and noise."""
    g = tiny[0] / "golden-lerobot-0.6.1"
    return {"legacy": goldens,
            "fixed": (goldens[0], load_all(g / "outputs.safetensors"), load_all(g / "intermediates.safetensors"))}


@pytest.fixture(scope="session")
def exact_engine(tiny):
    """Exact mode with the goldens' (LeRobot 0.4.4) vision position ids."""
    from edgefm_ros.runtime.engine import Engine

    return Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="exact", vision_position_ids="legacy")


@pytest.fixture(scope="session")
def golden_inputs(goldens):
    """The goldens' sample_actions arguments as ModelInputs."""
    from edgefm_ros.runtime.preprocess import ModelInputs

    g = goldens[0]
    return ModelInputs((g["images.0"], g["images.1"]), (g["img_masks.0"].bool(), g["img_masks.1"].bool()),
                       g["lang_tokens"], g["lang_masks"].bool(), g["state"])

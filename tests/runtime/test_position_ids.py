"""SmolVLM vision position ids: the two conventions' tables, and how a checkpoint's convention is chosen."""
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from edgefm_ros.models.siglip import patch_position_ids
from edgefm_ros.runtime.checkpoint import (DEFAULT_VISION_POSITION_IDS, NUMERICS_FILE, CheckpointError,
                                           detect_vision_position_ids, read_numerics, resolve_vision_position_ids,
                                           write_numerics)
from edgefm_ros.runtime.engine import Engine, EngineConfig


def rederived(grid_h: int, grid_w: int, side: int, convention: str) -> np.ndarray:
    """The ids re-derived one patch at a time in numpy float32 (transformers' arithmetic, IEEE single):
    legacy  f32(i / n) * f32(1 - 1e-6);  fixed  min(f32(i) * f32(1 / n), f32(1 - 1e-6));
    each bucketed against the boundaries k/side with x in [b[j-1], b[j]) -> j."""
    bounds = np.arange(1 / side, 1.0, 1 / side).astype(np.float32)
    shrink = np.float32(1 - 1e-6)

    def coord(i: int, n: int) -> np.float32:
        if convention == "legacy":
            return np.float32(np.float32(i) / np.float32(n)) * shrink
        return min(np.float32(i) * (np.float32(1) / np.float32(n)), shrink)

    def bucket(x) -> int:
        return int(np.searchsorted(bounds, x, side="right"))

    return np.array([bucket(coord(r, grid_h)) * side + bucket(coord(c, grid_w))
                     for r in range(grid_h) for c in range(grid_w)])


@pytest.mark.parametrize("convention", ["legacy", "fixed"])
@pytest.mark.parametrize("grid_h,grid_w,side", [(8, 8, 8), (32, 32, 32), (27, 27, 27), (24, 24, 24), (14, 14, 14),
                                                (5, 7, 8), (27, 13, 27), (3, 3, 3)])
def test_id_table_matches_a_direct_rederivation(grid_h, grid_w, side, convention):
    got = patch_position_ids(grid_h, grid_w, side, convention)
    assert got.dtype == torch.int64 and got.shape == (grid_h * grid_w,)
    np.testing.assert_array_equal(got.numpy(), rederived(grid_h, grid_w, side, convention))


@pytest.mark.parametrize("n", [8, 16, 32])
def test_power_of_two_grid_rows(n):
    """The documented shapes: legacy repeats row/column 0 and never reaches n-1; fixed is the identity."""
    legacy = patch_position_ids(n, n, n, "legacy").view(n, n)
    fixed = patch_position_ids(n, n, n, "fixed").view(n, n)
    assert legacy[0].tolist() == [0, 0] + list(range(1, n - 1))
    assert legacy[:, 0].tolist() == [0, 0] + [r * n for r in range(1, n - 1)]
    assert fixed.flatten().tolist() == list(range(n * n))


def test_unknown_convention_named():
    with pytest.raises(ValueError, match="'newest'"):
        patch_position_ids(8, 8, 8, "newest")


# ---- the sidecar and "auto" ---------------------------------------------------------------------------
def test_sidecar_roundtrip_and_validation(tmp_path):
    path = write_numerics(tmp_path, "legacy", written_by="test")
    assert path.name == NUMERICS_FILE
    assert read_numerics(tmp_path) == {"format": 1, "vision_position_ids": "legacy", "written_by": "test"}
    with pytest.raises(ValueError, match="'both'"):
        write_numerics(tmp_path, "both")
    with pytest.raises(ValueError, match="reserved"):
        write_numerics(tmp_path, "fixed", format=2)
    (tmp_path / NUMERICS_FILE).write_text(json.dumps({"format": 1, "vision_position_ids": "sideways"}))
    with pytest.raises(CheckpointError, match="'sideways'"):
        read_numerics(tmp_path)
    (tmp_path / NUMERICS_FILE).write_text(json.dumps({"format": 9, "vision_position_ids": "fixed"}))
    with pytest.raises(CheckpointError, match="format 9"):
        read_numerics(tmp_path)


@pytest.mark.parametrize("files,expected", [
    ({"README.md": "| Training steps | 20000 |\n| LeRobot version | 0.6.1 |\n"}, "fixed"),
    ({"README.md": "| LeRobot version | 0.4.4 |\n"}, "legacy"),
    ({"README.md": "| LeRobot version | 0.3.3 |\n"}, "fixed"),
    ({"train_config.json": {"rename_map": {}, "tolerance_s": 1e-4, "policy": {}}}, "legacy"),
    ({"train_config.json": {"rename_map": {}, "cudnn_deterministic": False, "policy": {}}}, "fixed"),
    ({"config.json": {"type": "smolvla", "pretrained_revision": None}}, "fixed"),
    # the sidecar wins over everything LeRobot wrote
    ({NUMERICS_FILE: {"format": 1, "vision_position_ids": "legacy"}, "README.md": "| LeRobot version | 0.6.1 |"},
     "legacy"),
])
def test_auto_reads_the_checkpoints_record(tmp_path, files, expected):
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    found, why = detect_vision_position_ids(tmp_path)
    assert found == expected, why
    assert resolve_vision_position_ids(tmp_path, "auto") == (found, why)


def test_nothing_recorded_falls_back_to_the_default_with_a_warning(tmp_path, caplog):
    (tmp_path / "config.json").write_text(json.dumps({"type": "smolvla"}))  # LeRobot 0.4/0.5-shaped
    (tmp_path / "README.md").write_text("# my policy\n")
    with caplog.at_level(logging.WARNING, logger="edgefm_ros.runtime.checkpoint"):
        assert resolve_vision_position_ids(tmp_path, "auto") == (DEFAULT_VISION_POSITION_IDS, "default")
    assert DEFAULT_VISION_POSITION_IDS == "fixed"
    assert "cannot tell" in caplog.text and NUMERICS_FILE in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgefm_ros.runtime.checkpoint"):
        assert resolve_vision_position_ids(tmp_path, "legacy") == ("legacy", "requested")  # explicit: no guess
    assert not caplog.text


def test_bad_choice_named():
    with pytest.raises(ValueError, match="'newest'"):
        resolve_vision_position_ids(".", "newest")
    with pytest.raises(ValueError, match="'newest'"):
        EngineConfig(vision_position_ids="newest")


def test_engine_auto_follows_the_sidecar_to_parity(tiny, tmp_path, goldens_by_convention, golden_inputs):
    """A copy of the TINY checkpoint (made by LeRobot 0.4.4) with a sidecar saying legacy: "auto" picks it up
    and matches LeRobot 0.4.4; an explicit choice still overrides the sidecar."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny[0], ckpt, ignore=shutil.ignore_patterns("golden*"))
    write_numerics(ckpt, "legacy")
    inputs, outputs, _ = goldens_by_convention["legacy"]
    engine = Engine.from_checkpoint(ckpt, vlm_dir=tiny[1])
    assert engine.vision_position_ids == "legacy"
    assert (engine.sample(golden_inputs, inputs["noise"]) - outputs["actions"]).abs().max() <= 1e-4
    fixed = Engine.from_checkpoint(ckpt, vlm_dir=tiny[1], vision_position_ids="fixed")
    got = fixed.sample(golden_inputs, inputs["noise"])
    assert (got - goldens_by_convention["fixed"][1]["actions"]).abs().max() <= 1e-4


def test_generated_checkpoints_record_their_convention(tmp_path):
    from edgefm_ros.training.random_checkpoint import make_checkpoint

    out = make_checkpoint(tmp_path / "demo", seed=1)
    assert read_numerics(out)["vision_position_ids"] == "fixed"
    assert "vision_position_ids" not in json.loads((out / "config.json").read_text())  # LeRobot's file untouched
    assert Engine.from_checkpoint(out).vision_position_ids == "fixed"


def test_node_and_cloud_settings_take_the_choice():
    from edgefm_ros.cloud.server.settings import ServeConfig, model_settings
    from edgefm_ros.cloud.tasks.vla import VlaRuntimeConfig as RuntimeConfig
    from edgefm_ros.params.vla import VlaNodeConfig

    make_config = VlaNodeConfig.from_values

    base = dict(checkpoint="/m", camera_topics=["/c"], camera_keys=["observation.images.c"],
                state_joint_names=["j"])
    assert make_config(base).vision_position_ids == "auto"
    assert make_config({**base, "vision_position_ids": "legacy"}).vision_position_ids == "legacy"
    with pytest.raises(ValueError, match="vision_position_ids"):
        make_config({**base, "vision_position_ids": "newest"})
    cfg = ServeConfig("/m", vision_position_ids="legacy")
    extra = model_settings(cfg, {"parameters": {"extra": {}}})["parameters"]["extra"]
    assert RuntimeConfig.from_extra(extra).vision_position_ids == "legacy"
    with pytest.raises(ValueError, match="'newest'"):
        ServeConfig("/m", vision_position_ids="newest")
    with pytest.raises(ValueError, match="'newest'"):
        RuntimeConfig("/m", vision_position_ids="newest")

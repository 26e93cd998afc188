"""Random-weight checkpoints (training/random_checkpoint.py, `edgefm-vla make-checkpoint`) and training share one
table of architectures (recipe.ARCHS); the chunk size of a random checkpoint is its caller's, SmolVLA's 50
unless told, while ARCHS' chunk_size is training's default."""
import json

import pytest

from edgefm_ros.training import random_checkpoint, recipe
from edgefm_ros.training.random_checkpoint import CHUNK_SIZE, make_checkpoint


def config(path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_one_table_of_architectures():
    assert random_checkpoint.ARCHS is recipe.ARCHS
    assert {"tiny", "small", "compact128", "full"} <= set(recipe.ARCHS)
    # training's defaults, which the committed checkpoints' recipes and the training tests rely on
    assert recipe.ARCHS["tiny"]["chunk_size"] == 16 and recipe.ARCHS["compact128"]["chunk_size"] == 50


def test_chunk_size_is_the_callers(tmp_path):
    default = config(make_checkpoint(tmp_path / "a", "tiny", cameras=1, raw_hw=(32, 32), dim=4))
    assert CHUNK_SIZE == 50 and default["chunk_size"] == default["n_action_steps"] == 50  # as the demo's always was
    told = config(make_checkpoint(tmp_path / "b", "tiny", cameras=1, raw_hw=(32, 32), dim=4, chunk_size=16))
    assert told["chunk_size"] == told["n_action_steps"] == 16
    # only the chunk differs: the architecture is the table's
    for key in ("num_vlm_layers", "resize_imgs_with_padding", "num_steps"):
        assert default[key] == told[key]
    assert default["resize_imgs_with_padding"] == recipe.ARCHS["tiny"]["resize"]


@pytest.mark.parametrize("kw, word", [(dict(arch="huge"), "huge"), (dict(chunk_size=0), "chunk_size"),
                                      (dict(cameras=9), "cameras")])
def test_bad_values_are_named(tmp_path, kw, word):
    with pytest.raises(ValueError, match=word):
        make_checkpoint(tmp_path / "x", **kw)

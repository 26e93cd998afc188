"""Bad observations get a clear error naming the bad value, never a wrong answer."""
import numpy as np
import pytest

from edgefm_ros.runtime.preprocess import InputError
from edgefm_ros.types import Observation


def good(engine, rng):
    cfg = engine.model_config
    images = {k: rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8) for k in cfg.camera_keys}
    return images, rng.standard_normal(cfg.state_dim).astype(np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_good_observation_runs(exact_engine, rng):
    images, state = good(exact_engine, rng)
    chunk = exact_engine.predict(Observation(images, state, "open the drawer"))
    assert chunk.actions.shape == (exact_engine.model_config.chunk_size, exact_engine.model_config.action_dim)
    assert np.isfinite(chunk.actions).all()


@pytest.mark.parametrize("bad, match", [
    (lambda im: im[:, :, :2], r"\(H, W, 3\)"),  # two channels
    (lambda im: im.astype(np.int16), "dtype"),
    (lambda im: im.transpose(2, 0, 1).astype(np.float32) * 2.0, r"\[0, 1\]"),  # float out of range
    (lambda im: np.full((3, 4, 4), np.nan, np.float32), "non-finite"),
])
def test_bad_image_names_camera(exact_engine, rng, bad, match):
    images, state = good(exact_engine, rng)
    key = exact_engine.model_config.camera_keys[0]
    images[key] = bad(images[key])
    with pytest.raises(InputError, match=match) as e:
        exact_engine.predict(Observation(images, state, "open the drawer"))
    assert key in str(e.value)


def test_nan_state_rejected(exact_engine, rng):
    images, state = good(exact_engine, rng)
    state[2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        exact_engine.predict(Observation(images, state, "open the drawer"))


def test_wrong_state_size_rejected(exact_engine, rng):
    images, _ = good(exact_engine, rng)
    with pytest.raises(InputError, match="state must have 6 values"):
        exact_engine.predict(Observation(images, np.ones(4, np.float32), "open the drawer"))


def test_unknown_camera_rejected(exact_engine, rng):
    images, state = good(exact_engine, rng)
    images["observation.images.wrist"] = next(iter(images.values()))
    with pytest.raises(InputError, match="observation.images.wrist"):
        exact_engine.predict(Observation(images, state, "open the drawer"))


def test_missing_camera_needs_declaration(exact_engine, rng):
    images, state = good(exact_engine, rng)
    key = exact_engine.model_config.camera_keys[1]
    del images[key]
    with pytest.raises(InputError, match=key):
        exact_engine.predict(Observation(images, state, "open the drawer"))
    # declared missing: runs, with that camera masked out
    chunk = exact_engine.predict(Observation(images, state, "open the drawer", missing=(key,)))
    assert np.isfinite(chunk.actions).all()


@pytest.mark.parametrize("task, match", [("", "non-empty"), ("   ", "non-empty"),
                                         ("pick up the cube " * 40, "over tokenizer_max_length")])
def test_bad_task_rejected(exact_engine, rng, task, match):
    images, state = good(exact_engine, rng)
    with pytest.raises(InputError, match=match):
        exact_engine.predict(Observation(images, state, task))


def test_bad_noise_shape_rejected(exact_engine, rng):
    images, state = good(exact_engine, rng)
    with pytest.raises(InputError, match="noise must have shape"):
        exact_engine.predict(Observation(images, state, "open the drawer"), noise=np.ones((3, 3), np.float32))


def test_masked_camera_does_not_change_actions(exact_engine, rng):
    """Whatever a masked camera's pixels are, the actions are the same (its tokens are never keys)."""
    images, state = good(exact_engine, rng)
    key = exact_engine.model_config.camera_keys[1]
    noise = rng.standard_normal((exact_engine.model_config.chunk_size, exact_engine.model_config.max_action_dim)).astype(np.float32)
    a = exact_engine.predict(Observation(images, state, "open the drawer", missing=(key,)), noise=noise).actions
    images[key] = 255 - images[key]
    b = exact_engine.predict(Observation(images, state, "open the drawer", missing=(key,)), noise=noise).actions
    np.testing.assert_array_equal(a, b)

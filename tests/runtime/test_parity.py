"""LeRobot parity on the TINY reference: actions, every prefix KV layer, every denoise step, from raw.

Each vision position-id convention against the LeRobot release that uses it: legacy = LeRobot 0.4.4
(transformers 4.57), fixed = LeRobot 0.6.1 (transformers 5)."""
import pytest
import torch

from edgefm_ros.runtime.engine import Engine

ATOL = 1e-4
CONVENTIONS = ("legacy", "fixed")


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("mode", ["reference", "exact"])
def test_actions_and_intermediates_match_lerobot(tiny, goldens_by_convention, golden_inputs, mode, convention):
    inputs, outputs, inter = goldens_by_convention[convention]
    engine = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode=mode, vision_position_ids=convention)
    assert engine.vision_position_ids == convention
    prefix = engine.prefill(golden_inputs)
    assert torch.equal(prefix.pad_mask, inter["prefix_pad_masks"])
    for layer, (k, v) in enumerate(prefix.vlm_kv):  # ours [B, Hkv, P, D]; golden [B, P, Hkv, D]
        assert (k.transpose(1, 2) - inter[f"kv.{layer}.key_states"]).abs().max() <= ATOL, f"kv.{layer} keys"
        assert (v.transpose(1, 2) - inter[f"kv.{layer}.value_states"]).abs().max() <= ATOL, f"kv.{layer} values"
    trace = []
    actions = engine.decode(prefix, inputs["noise"], trace)
    assert len(trace) == engine.model_config.num_steps
    for step, (v_t, x_t) in enumerate(trace):
        assert (v_t - inter[f"denoise.{step}.v_t"]).abs().max() <= ATOL, f"denoise step {step} v_t"
        assert (x_t - inter[f"denoise.{step}.x_t"]).abs().max() <= ATOL, f"denoise step {step} x_t"
    assert actions.shape == outputs["actions"].shape
    assert (actions - outputs["actions"]).abs().max() <= ATOL


def test_prefix_embeddings_match(exact_engine, goldens, golden_inputs):
    inputs, _, inter = goldens
    m = exact_engine.model
    inp = golden_inputs
    img = torch.cat([m.embed_images(x) for x in inp.images], dim=1)
    ref = inter["prefix_embs"]
    n_img = img.shape[1]
    assert (img - ref[:, :n_img]).abs().max() <= ATOL
    lang = m.embed_language(inp.lang_tokens)
    assert (lang - ref[:, n_img:n_img + lang.shape[1]]).abs().max() <= ATOL
    assert (m.embed_state(inp.state) - ref[:, -1:]).abs().max() <= ATOL


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_from_raw_matches_unnormalized(goldens_by_convention, tiny, convention):
    import json

    inputs, outputs, _ = goldens_by_convention[convention]
    exact_engine = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="exact", vision_position_ids=convention)
    cfg = exact_engine.model_config
    frames = {k: inputs[f"raw.{k}"] for k in cfg.camera_keys}
    masks = {k: inputs[f"raw.{k}_padding_mask"] for k in cfg.camera_keys if f"raw.{k}_padding_mask" in inputs}
    tasks = json.loads((tiny[2] / "meta.json").read_text())["tasks"]
    inp = exact_engine.preprocess(frames, inputs[f"raw.{cfg.state_key}"], tasks, masks)
    # each preprocessing stage against LeRobot's own processed tensors
    for i, (img, mask) in enumerate(zip(inp.images, inp.img_masks)):
        assert (img - inputs[f"images.{i}"]).abs().max() <= 1e-6, f"images.{i}"
        assert torch.equal(mask, inputs[f"img_masks.{i}"].bool())
    assert torch.equal(inp.lang_tokens, inputs["lang_tokens"])
    assert torch.equal(inp.lang_masks, inputs["lang_masks"].bool())
    assert (inp.state - inputs["state"]).abs().max() <= 1e-6
    actions = exact_engine.preprocess.actions(exact_engine.sample(inp, inputs["noise"]))
    assert (actions - outputs["actions_unnormalized"]).abs().max() <= ATOL


def test_predict_single_observation_matches_batch_row(exact_engine, goldens):
    """The robot path (uint8 frames in an Observation) agrees with the batch path for sample 0."""
    import numpy as np

    from edgefm_ros.types import Observation

    inputs, outputs, _ = goldens
    cfg = exact_engine.model_config
    # float32 CHW frames are accepted as-is; sample 0 has both cameras and the long task
    obs = Observation({k: inputs[f"raw.{k}"][0].numpy() for k in cfg.camera_keys},
                      inputs[f"raw.{cfg.state_key}"][0].numpy(), "Pick up the red cube and place it in the blue bowl.")
    chunk = exact_engine.predict(obs, noise=inputs["noise"][0].numpy())
    assert chunk.actions.shape == (cfg.chunk_size, cfg.action_dim)
    np.testing.assert_allclose(chunk.actions, outputs["actions_unnormalized"][0].numpy(), atol=ATOL)
    assert chunk.prefill_s > 0 and chunk.decode_s > 0 and chunk.inference_s >= chunk.prefill_s + chunk.decode_s


def test_the_two_conventions_are_told_apart_by_the_goldens(tiny, goldens_by_convention, golden_inputs):
    """Each convention misses the other release's goldens by far more than the tolerance: the parity
    tests above could not pass with the wrong convention."""
    inputs = goldens_by_convention["legacy"][0]
    for convention, other in (("legacy", "fixed"), ("fixed", "legacy")):
        engine = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="exact", vision_position_ids=convention)
        actions = engine.sample(golden_inputs, inputs["noise"])
        assert (actions - goldens_by_convention[other][1]["actions"]).abs().max() > 50 * ATOL, (convention, other)


def test_fast_mode_follows_the_convention(tiny, exact_engine):
    """Fast mode gathers its (bf16-cast) vision position table with the same ids as exact mode."""
    fast = {c: Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="fast", vision_position_ids=c)
            for c in CONVENTIONS}
    assert torch.equal(fast["legacy"].model.vision.pos, exact_engine.model.vision.pos)
    assert not torch.equal(fast["fixed"].model.vision.pos, exact_engine.model.vision.pos)

"""LeRobot parity on the TINY reference: actions, every prefix KV layer, every denoise step, from raw."""
import pytest
import torch

from edgefm_ros.runtime.engine import Engine

ATOL = 1e-4


@pytest.mark.parametrize("mode", ["reference", "exact"])
def test_actions_and_intermediates_match_lerobot(tiny, goldens, golden_inputs, mode):
    inputs, outputs, inter = goldens
    engine = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode=mode)
    prefix = engine.prefill(golden_inputs)
    assert torch.equal(prefix.pad_mask, inter["prefix_pad_masks"])
    for layer, (k, v) in enumerate(prefix.vlm_kv):  # ours [B, Hkv, P, D]; golden [B, P, Hkv, D]
        assert (k.transpose(1, 2) - inter[f"kv.{layer}.key_states"]).abs().max() <= ATOL, f"kv.{layer} keys"
        assert (v.transpose(1, 2) - inter[f"kv.{layer}.value_states"]).abs().max() <= ATOL, f"kv.{layer} values"
    trace = []
    actions = engine.decode(prefix, inputs["noise"], trace)
    assert len(trace) == engine.cfg.num_steps
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


def test_from_raw_matches_unnormalized(exact_engine, goldens, tiny):
    import json

    inputs, outputs, _ = goldens
    cfg = exact_engine.cfg
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
    cfg = exact_engine.cfg
    # float32 CHW frames are accepted as-is; sample 0 has both cameras and the long task
    obs = Observation({k: inputs[f"raw.{k}"][0].numpy() for k in cfg.camera_keys},
                      inputs[f"raw.{cfg.state_key}"][0].numpy(), "Pick up the red cube and place it in the blue bowl.")
    chunk = exact_engine.predict(obs, noise=inputs["noise"][0].numpy())
    assert chunk.actions.shape == (cfg.chunk_size, cfg.action_dim)
    np.testing.assert_allclose(chunk.actions, outputs["actions_unnormalized"][0].numpy(), atol=ATOL)
    assert chunk.prefill_s > 0 and chunk.decode_s > 0 and chunk.inference_s >= chunk.prefill_s + chunk.decode_s

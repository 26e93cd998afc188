"""edgefm_ros.training: the flow-matching objective, batches, the training forward against the Engine,
a short overfit run and its checkpoint loaded by the Engine."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth import make_demos, write_demos  # noqa: E402

from edgefm_ros.runtime.checkpoint import load_checkpoint, read_numerics  # noqa: E402
from edgefm_ros.runtime.engine import Engine  # noqa: E402
from edgefm_ros.runtime.preprocess import Preprocessor, Tokenizer  # noqa: E402
from edgefm_ros.runtime.safetensors_mmap import load_all  # noqa: E402
from edgefm_ros.training.data import ChunkBatcher, episode_ends  # noqa: E402
from edgefm_ros.training.flow import flow_loss, noisy_actions, prefix_time, sample_prefix, sample_time  # noqa: E402
from edgefm_ros.training.model import TrainableSmolVLA  # noqa: E402
from edgefm_ros.training.recipe import TrainConfig, lr_factor  # noqa: E402
from edgefm_ros.training.trainer import train  # noqa: E402
from edgefm_ros.types import Observation  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """Synthetic demos written and read back through edgefm_ros.sim.dataset; episode 5 failed."""
    return write_demos(tmp_path_factory.mktemp("data") / "demos", make_demos(episodes=6, length=12), failed=(5,))


@pytest.fixture(scope="module")
def trained(demos, tmp_path_factory):
    """A short overfit run (the loss test and the checkpoint tests share it)."""
    out = tmp_path_factory.mktemp("ckpt") / "policy"
    lines = []
    cfg = TrainConfig(steps=40, batch_size=8, lr=1e-3, log_every=10, save_every=20, seed=3)
    result = train(demos, out, cfg, arch="tiny", log=lines.append)
    return result, lines


def _perturbed(weights: dict, seed: int) -> dict:
    """Non-trivial norms and biases (a fresh init has ones and zeros, which hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}


def test_beta_time_distribution():
    t32 = sample_time(200_000, torch.Generator().manual_seed(0))
    assert t32.dtype == torch.float32 and t32.shape == (200_000,)
    t = t32.double()
    assert 0.001 <= float(t.min()) and float(t.max()) <= 1.0
    # Beta(1.5, 1): mean 0.6, variance 1.5 / (2.5^2 * 3.5); scaled by 0.999, shifted by 0.001
    assert abs(float(t.mean()) - (0.6 * 0.999 + 0.001)) < 3e-3
    assert abs(float(t.var()) - 0.999 ** 2 * 1.5 / (2.5 ** 2 * 3.5)) < 2e-3
    # the same law as torch.distributions.Beta (what LeRobot samples): two-sample KS distance
    torch.manual_seed(1)
    ref = torch.distributions.Beta(1.5, 1.0).sample((200_000,)).double() * 0.999 + 0.001
    grid = torch.linspace(0, 1, 501, dtype=torch.float64)
    cdf = lambda x: torch.searchsorted(x.sort().values, grid).double() / len(x)  # noqa: E731
    assert float((cdf(t) - cdf(ref)).abs().max()) < 0.01
    # mass towards the noise end: P(t < x) = ((x - 0.001) / 0.999)^1.5
    for x in (0.1, 0.5, 0.9):
        assert abs(float((t < x).double().mean()) - ((x - 0.001) / 0.999) ** 1.5) < 5e-3


def test_flow_targets_and_masked_loss():
    a, n = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    t = torch.tensor([0.25, 1.0])
    x, u = noisy_actions(a, n, t)
    torch.testing.assert_close(x[0], 0.25 * n[0] + 0.75 * a[0])
    torch.testing.assert_close(x[1], n[1])
    torch.testing.assert_close(u, n - a)
    # integrating the exact velocity from t to 0 recovers the actions
    torch.testing.assert_close(x - t[:, None, None] * u, a)
    v = u.clone()
    v[..., 2:] += 100.0  # padded action dims: ignored
    v[1, 2] += 7.0  # a padded chunk step: ignored
    pad = torch.tensor([[False, False, False], [False, False, True]])
    assert float(flow_loss(v, u, pad, action_dim=2)) == 0.0
    v[0, 0, 1] += 3.0  # one valid entry of 2 * (3 + 2) = 10
    assert math.isclose(float(flow_loss(v, u, pad, action_dim=2)), 9.0 / 10.0, rel_tol=1e-6)


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=3000, lr=1e-3, decay_lr=1e-5)
    assert cfg.warmup_steps == 100
    assert math.isclose(lr_factor(0, cfg), 1 / 101)
    assert math.isclose(lr_factor(100, cfg), (1 - 0.01) * 0.5 * (1 + math.cos(math.pi * 100 / 3000)) + 0.01)
    f = [lr_factor(s, cfg) for s in range(0, 3001, 50)]
    peak = int(np.argmax(f))
    assert all(np.diff(f[:peak + 1]) > 0) and all(np.diff(f[peak:]) < 0)
    assert math.isclose(lr_factor(3000, cfg), 0.01)


@pytest.mark.parametrize("kwargs, name", [
    (dict(steps=0), "steps"), (dict(batch_size=-2), "batch_size"), (dict(lr=float("nan")), "lr"),
    (dict(decay_lr=1.0, lr=1e-3), "decay_lr"), (dict(warmup_fraction=1.0), "warmup_fraction"),
    (dict(betas=(0.9, 1.5)), "betas"), (dict(grad_clip_norm=0.0), "grad_clip_norm"),
    (dict(chunk_size=8, n_action_steps=9), "n_action_steps"), (dict(vision_position_ids="new"), "vision_position_ids"),
    (dict(save_every=-1), "save_every"), (dict(start_frames=-1), "start_frames"),
    (dict(start_weight=0.0), "start_weight"), (dict(start_weight=float("inf")), "start_weight"),
])
def test_train_config_rejects_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TrainConfig(**kwargs)


def test_bad_dataset_and_arch_are_named(demos, tmp_path):
    with pytest.raises(ValueError, match="unknown arch 'huge'"):
        train(demos, tmp_path / "a", TrainConfig(steps=1), arch="huge", log=lambda s: None)
    broken = make_demos(episodes=2, length=4)
    broken.episode_index = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    with pytest.raises(ValueError, match="not contiguous"):
        episode_ends(broken.episode_index)
    broken = make_demos(episodes=2, length=4)
    broken.task_index = broken.task_index + 5
    with pytest.raises(ValueError, match="task_index"):
        train(broken, tmp_path / "b", TrainConfig(steps=1), arch="tiny", log=lambda s: None)


def test_task_filter_trains_on_named_tasks_only(demos, tmp_path):
    lines = []
    train(demos, tmp_path / "t", TrainConfig(steps=1, batch_size=2, log_every=1, save_every=0), arch="tiny",
          log=lines.append, tasks=["task1"])
    meta = json.loads((tmp_path / "t" / "edgefm_train.json").read_text())
    assert meta["tasks"] == ["task1"] and meta["episodes"] == 2  # episodes 1, 3 (5 failed)
    assert any("24 frames, 2 episodes, 1 tasks" in ln for ln in lines)
    with pytest.raises(ValueError, match="task\\(s\\) \\['pick'\\] not in the dataset"):
        train(demos, tmp_path / "u", TrainConfig(steps=1), arch="tiny", log=lambda s: None, tasks=["pick"])


def test_task_weights_draw_a_task_more_often(trained, demos, tmp_path):
    ck = load_checkpoint(trained[0].out)
    pre = Preprocessor(ck.config, ck.stats, Tokenizer(ck.tokenizer_path, ck.config.tokenizer_max_length))
    names = demos.episode_task
    weights = {e: (5.0 if t == "task1" else 1.0) for e, t in names.items()}
    b = ChunkBatcher(demos, ck.config.camera_keys, ck.config.chunk_size, ck.config.max_action_dim, pre,
                     episode_weights=weights)
    g = torch.Generator().manual_seed(int(np.random.default_rng().integers(1 << 30)))
    picks = torch.multinomial(b.probs, 4000, replacement=True, generator=g).numpy()
    eps = demos.episode_index[b.frames[picks]]
    share = np.mean([names[int(e)] == "task1" for e in eps])
    n1 = sum(names[int(e)] == "task1" for e in demos.episode_index[b.frames])
    expect = 5 * n1 / (5 * n1 + (len(b.frames) - n1))
    assert abs(share - expect) < 0.04, (share, expect)
    with pytest.raises(ValueError, match="episode_weights"):
        ChunkBatcher(demos, ck.config.camera_keys, ck.config.chunk_size, ck.config.max_action_dim, pre,
                     episode_weights={e: -1.0 for e in names})
    lines = []
    train(demos, tmp_path / "w", TrainConfig(steps=1, batch_size=2, log_every=1, save_every=0), arch="tiny",
          log=lines.append, task_weights={"task1": 3.0})
    assert json.loads((tmp_path / "w" / "edgefm_train.json").read_text())["task_weights"] == {"task1": 3.0}
    with pytest.raises(ValueError, match="pick"):
        train(demos, tmp_path / "x", TrainConfig(steps=1), arch="tiny", log=lambda s: None, task_weights={"pick": 2})


def test_start_weight_draws_each_episodes_first_frames_more_often(trained, demos):
    """(K, W): the first K frames of every episode (episodes contiguous, of any length) drawn W times as often,
    on top of the episode's own weight; a bad pair is refused, naming it."""
    ck = load_checkpoint(trained[0].out)
    pre = Preprocessor(ck.config, ck.stats, Tokenizer(ck.tokenizer_path, ck.config.tokenizer_max_length))
    args = (demos, ck.config.camera_keys, ck.config.chunk_size, ck.config.max_action_dim, pre)
    k, w = int(np.random.default_rng().integers(1, 4)), float(np.random.default_rng().uniform(2, 6))
    b = ChunkBatcher(*args, start_weight=(k, w))
    ep = demos.episode_index[b.frames]
    pos = np.array([i - np.flatnonzero(demos.episode_index == e)[0] for i, e in zip(b.frames, ep)])
    p = b.probs.numpy()
    assert np.allclose(p[pos < k] / p[pos >= k].mean(), w) and np.allclose(p[pos >= k], p[pos >= k][0])
    names = demos.episode_task
    both = ChunkBatcher(*args, episode_weights={e: (3.0 if t == "task1" else 1.0) for e, t in names.items()},
                        start_weight=(k, w)).probs.numpy()
    task1 = np.array([names[int(e)] == "task1" for e in ep])
    assert np.isclose(both[task1 & (pos < k)][0] / both[~task1 & (pos >= k)][0], 3.0 * w)
    assert ChunkBatcher(*args, start_weight=(k, 1.0)).probs is None  # W = 1: uniform, as without it
    for bad in ((-1, 2.0), (2, 0.0), (2, float("nan"))):
        with pytest.raises(ValueError, match="start_weight"):
            ChunkBatcher(*args, start_weight=bad)


def test_chunks_pad_at_episode_end(trained, demos):
    ck = load_checkpoint(trained[0].out)
    pre = Preprocessor(ck.config, ck.stats, Tokenizer(ck.tokenizer_path, ck.config.tokenizer_max_length))
    b = ChunkBatcher(demos, ck.config.camera_keys, ck.config.chunk_size, ck.config.max_action_dim, pre)
    last, first = 11, 12  # last frame of episode 0, first frame of episode 1 (length 12)
    batch = b.batch(np.array([last, first, 2]))
    c = ck.config.chunk_size
    assert batch.actions.shape == (3, c, ck.config.max_action_dim)
    assert batch.is_pad[0].tolist() == [False] + [True] * (c - 1)
    assert batch.is_pad[1].tolist() == [False] * 12 + [True] * (c - 12)
    assert batch.is_pad[2].tolist() == [False] * 10 + [True] * (c - 10)
    raw = pre.actions(batch.actions)  # back to raw units through the checkpoint's stats
    torch.testing.assert_close(raw[0], torch.tensor(demos.action[last]).expand(c, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(raw[1, :12], torch.tensor(demos.action[12:24]), atol=1e-5, rtol=0)
    assert float(batch.actions[..., 4:].abs().max()) == 0.0
    # the state is normalised with the dataset's stats, the images are in [-1, 1]
    s = demos.stats["observation.state"]
    torch.testing.assert_close(batch.inputs.state[1, :4], torch.tensor((demos.state[first] - s["mean"]) / s["std"]),
                               atol=1e-5, rtol=1e-5)
    img = batch.inputs.images[0]
    assert img.shape == (3, 3, 64, 64) and -1.0 <= float(img.min()) and float(img.max()) <= 1.0


def test_training_velocity_equals_engine_denoise_steps(trained, demos, tmp_path):
    """Same weights, same inputs: the training forward's v_t equals the Engine's decode velocity at every
    Euler step (exact mode), with padded language and a masked camera in the batch."""
    import shutil

    src = trained[0].out
    ckdir = tmp_path / "ck"
    shutil.copytree(src, ckdir)
    weights = _perturbed(load_all(ckdir / "model.safetensors"), seed=5)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in weights.items()}, str(ckdir / "model.safetensors"))
    engine = Engine.from_checkpoint(ckdir, mode="exact")
    cfg = engine.model_config
    model = TrainableSmolVLA(cfg, engine.ckpt.vlm, weights, read_numerics(ckdir)["vision_position_ids"])
    g = torch.Generator().manual_seed(0)
    frames = {k: torch.rand(2, 3, 32, 32, generator=g) for k in cfg.camera_keys}
    inp = engine.preprocess(frames, torch.randn(2, 4, generator=g), ["reach the red square", "press"],
                            {cfg.camera_keys[1]: torch.tensor([True, False])})
    assert not bool(inp.lang_masks.all())  # the shorter task is padded
    noise = torch.randn(2, cfg.chunk_size, cfg.max_action_dim, generator=g)
    trace = []
    engine.decode(engine.prefill(inp), noise, trace)
    x = noise
    with torch.no_grad():
        for k, (v_engine, x_next) in enumerate(trace):
            t = torch.full((2,), 1.0 + k * engine.euler_dt)
            v_train = model.velocity(inp, x, t)
            torch.testing.assert_close(v_train, v_engine.float(), atol=2e-5, rtol=1e-4)
            x = x_next
    # and the velocity depends on what differs between the samples (not a constant)
    assert float((v_train[0] - v_train[1]).abs().max()) > 1e-3


def test_gradients_reach_every_trained_weight(trained, demos):
    ck = load_checkpoint(trained[0].out)
    model = TrainableSmolVLA(ck.config, ck.vlm, load_all(ck.weights_path), "legacy")
    pre = Preprocessor(ck.config, ck.stats, Tokenizer(ck.tokenizer_path, 48))
    b = ChunkBatcher(demos, ck.config.camera_keys, ck.config.chunk_size, ck.config.max_action_dim, pre)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):  # twice: the build-time views and the position table stay differentiable
        batch = b.sample(4, g)
        t = sample_time(4, g)
        x, u = noisy_actions(batch.actions, torch.randn(batch.actions.shape, generator=g), t)
        model.zero_grad(set_to_none=True)
        flow_loss(model.velocity(batch.inputs, x, t), u, batch.is_pad, 4).backward()
    last = ck.config.num_vlm_layers - 1
    # never read by SmolVLA: the text model's final norm, the last VLM layer's query and output half
    unread = ("text_model.norm.weight", f"text_model.layers.{last}.self_attn.o_proj",
              f"text_model.layers.{last}.self_attn.q_proj",
              f"text_model.layers.{last}.mlp", f"text_model.layers.{last}.post_attention_layernorm")
    missing = [k for k in model.keys if not any(u in k for u in unread)
               and (model.params[model.names[k]].grad is None
                    or float(model.params[model.names[k]].grad.abs().sum()) == 0.0)]
    assert missing == []


def test_overfit_loss_decreases_and_logs_progress(trained):
    result, lines = trained
    assert result.final_loss < 0.7 * result.first_loss, (result.first_loss, result.final_loss)
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert len(steps) == 4 and all("steps/s" in ln and "ETA" in ln and "loss" in ln for ln in steps)
    assert any("saved checkpoint (step 20)" in ln for ln in lines)
    assert any("1 failed episode(s) left out" in ln for ln in lines)
    assert any("60 frames, 5 episodes" in ln for ln in lines)


def test_checkpoint_round_trip_in_engine(trained, demos):
    out = trained[0].out
    meta = json.loads((out / "edgefm_train.json").read_text())
    assert meta["step"] == 40 and meta["recipe"]["seed"] == 3
    assert read_numerics(out)["vision_position_ids"] == "legacy"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["type"] == "smolvla" and cfg["vlm_model_name"] == "vlm"
    assert set(cfg["input_features"]) == {"observation.images.scene", "observation.images.wrist", "observation.state"}
    assert cfg["input_features"]["observation.images.scene"]["shape"] == [3, 32, 32]
    engine = Engine.from_checkpoint(out, mode="exact")
    s = demos.stats["action"]
    torch.testing.assert_close(engine.ckpt.stats.action_mean, torch.from_numpy(s["mean"]).float())
    torch.testing.assert_close(engine.ckpt.stats.action_std, torch.from_numpy(s["std"]).float())
    i = 3
    obs = Observation({"observation.images.scene": demos.images["scene"][i],
                       "observation.images.wrist": demos.images["wrist"][i]}, demos.state[i], demos.tasks[0])
    chunk = engine.predict(obs, noise=np.zeros((cfg["chunk_size"], 32), np.float32))
    assert chunk.actions.shape == (cfg["chunk_size"], 4) and np.isfinite(chunk.actions).all()
    # the saved weights are the trained ones (they moved from the seeded initialisation)
    saved = load_all(out / "model.safetensors")
    assert "model.vlm_with_expert.vlm.lm_head.weight" in saved
    key = "model.action_out_proj.weight"
    assert float(saved[key].abs().sum()) > 0


def test_seeded_runs_repeat(demos, tmp_path):
    cfg = TrainConfig(steps=3, batch_size=4, log_every=1, save_every=0, seed=11)
    a = train(demos, tmp_path / "a", cfg, arch="tiny", log=lambda s: None)
    b = train(demos, tmp_path / "b", cfg, arch="tiny", log=lambda s: None)
    wa, wb = load_all(a.out / "model.safetensors"), load_all(b.out / "model.safetensors")
    assert a.final_loss == b.final_loss
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fine_tune_from_init_checkpoint(trained, demos, tmp_path):
    """--init: starts from the checkpoint's weights (its loss, not a fresh model's) and keeps its backbone."""
    src = trained[0].out
    lines = []
    cfg = TrainConfig(steps=2, batch_size=8, log_every=1, save_every=0, lr=1e-9, decay_lr=0.0, seed=3)
    r = train(demos, tmp_path / "ft", cfg, arch=None, init=src, log=lines.append)
    fresh = train(demos, tmp_path / "fresh", cfg, arch="tiny", log=lambda s: None)
    # same batches, noise and times (same seed): the trained start fits them better than a fresh model
    assert r.first_loss + r.final_loss < 0.75 * (fresh.first_loss + fresh.final_loss), (r, fresh)
    start, tuned = load_all(src / "model.safetensors"), load_all(tmp_path / "ft" / "model.safetensors")
    assert set(start) == set(tuned) and all(torch.allclose(start[k], tuned[k], atol=1e-6) for k in start)
    meta = json.loads((tmp_path / "ft" / "edgefm_train.json").read_text())
    assert meta["init"] == str(src) and meta["arch"] is None
    assert (tmp_path / "ft" / "vlm" / "tokenizer.json").read_bytes() == (src / "vlm" / "tokenizer.json").read_bytes()
    Engine.from_checkpoint(tmp_path / "ft", mode="exact")  # loads as is


def test_freeze_vision_trains_all_but_the_vision_tower(trained, demos, tmp_path):
    """--freeze-vision: the vision tower's weights come out exactly as they went in, every other trained weight
    moves, and the written config says so (LeRobot's freeze_vision_encoder)."""
    from edgefm_ros.training.model import VISION_PREFIX
    src = trained[0].out
    lines = []
    cfg = TrainConfig(steps=3, batch_size=4, log_every=1, save_every=0, lr=1e-3, seed=5, freeze_vision=True)
    train(demos, tmp_path / "fz", cfg, arch=None, init=src, log=lines.append)
    start, tuned = load_all(src / "model.safetensors"), load_all(tmp_path / "fz" / "model.safetensors")
    vision = [k for k in start if k.startswith(VISION_PREFIX)]
    assert vision and all(torch.equal(start[k], tuned[k]) for k in vision)
    moved = [k for k in start if not k.startswith(VISION_PREFIX) and not torch.equal(start[k], tuned[k])]
    assert any("connector" in k for k in moved) and any("lm_expert" in k for k in moved), moved[:5]
    assert json.loads((tmp_path / "fz" / "config.json").read_text())["freeze_vision_encoder"] is True
    assert any("vision tower frozen" in s for s in lines)
    with pytest.raises(ValueError, match="freeze_vision"):
        TrainConfig(freeze_vision="yes")


def test_rtc_prefix_times_give_the_prefix_clean():
    """Training-time RTC: per-action times are 0 on each sample's given prefix (which the loss leaves out) and
    the sample's t after it; on the prefix x_t is the demonstration's actions exactly."""
    g = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    b, c, a = 16, 12, 5
    t = sample_time(b, g)
    given = sample_prefix(b, 7, g)
    assert int(given.min()) >= 0 and int(given.max()) <= 7
    tt, mask = prefix_time(t, given, c)
    for i in range(b):
        d = int(given[i])
        assert mask[i].tolist() == [j < d for j in range(c)]
        assert torch.equal(tt[i, :d], torch.zeros(d)) and torch.equal(tt[i, d:], t[i].expand(c - d))
    actions, noise = torch.randn(b, c, a, generator=g), torch.randn(b, c, a, generator=g)
    x, u = noisy_actions(actions, noise, tt)
    assert torch.equal(x[mask], actions[mask])
    x1, u1 = noisy_actions(actions, noise, t)  # one time per sample: the rows after the prefix agree
    assert torch.equal(x[~mask], x1[~mask]) and torch.equal(u, u1)
    # the given rows are out of the loss: any velocity there changes nothing
    v = torch.randn(b, c, a, generator=g)
    v2 = v.clone()
    v2[mask] = 1e3
    pad = torch.zeros(b, c, dtype=torch.bool)
    assert flow_loss(v, u, pad | mask, a) == flow_loss(v2, u, pad | mask, a)


def test_training_velocity_with_given_prefix_equals_engine_prefix_decode(trained, demos, tmp_path):
    """The training forward with per-action times (0 on a given prefix) equals the Engine's "prefix" decode
    velocity at every Euler step: what the model is trained on is what the runtime asks of it."""
    import dataclasses
    import shutil

    from safetensors.torch import save_file

    from edgefm_ros.runtime.rtc_guidance import RtcConfig, rtc_inputs

    ckdir = tmp_path / "ck"
    shutil.copytree(trained[0].out, ckdir)
    weights = _perturbed(load_all(ckdir / "model.safetensors"), seed=7)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(ckdir / "model.safetensors"))
    base = Engine.from_checkpoint(ckdir, mode="exact")
    engine = Engine(base.ckpt, dataclasses.replace(base.config, rtc=RtcConfig(guidance="prefix")), base.hardware)
    cfg = engine.model_config
    model = TrainableSmolVLA(cfg, engine.ckpt.vlm, weights, read_numerics(ckdir)["vision_position_ids"])
    g = torch.Generator().manual_seed(1)
    frames = {k: torch.rand(1, 3, 32, 32, generator=g) for k in cfg.camera_keys}
    inp = engine.preprocess(frames, torch.randn(1, 4, generator=g), ["reach the red square"])
    c, a = cfg.chunk_size, cfg.max_action_dim
    d = int(torch.randint(1, c, (1,), generator=g))
    rtc = rtc_inputs(torch.randn(c, cfg.action_dim, generator=g), d, engine.rtc, c, a)
    noise = torch.randn(1, c, a, generator=g)
    trace = []
    engine.decode(engine.prefill(inp), noise, trace, rtc=rtc)
    x = rtc.weights * rtc.prev + (1 - rtc.weights) * noise
    with torch.no_grad():
        for k, (v_engine, x_next) in enumerate(trace):
            t, _ = prefix_time(torch.full((1,), 1.0 + k * engine.euler_dt), torch.tensor([d]), c)
            v_train = model.velocity(inp, x, t)
            torch.testing.assert_close(v_train[:, d:], v_engine[:, d:].float(), atol=2e-5, rtol=1e-4)
            assert float(v_engine[:, :d].abs().max()) == 0.0  # the given rows stay
            x = x_next


def test_rtc_prefix_max_is_recorded_and_the_engine_runs_rtc_by_it(trained, demos, tmp_path):
    """--rtc-prefix-max: written to edgefm_numerics.json; the Engine's default guidance ("auto") is then
    "prefix", and "constant" for a checkpoint trained without it. Bad values are refused by name."""
    from edgefm_ros.runtime.checkpoint import RTC_PREFIX_KEY, CheckpointError

    src = trained[0].out
    lines = []
    cfg = TrainConfig(steps=2, batch_size=4, log_every=1, save_every=0, seed=2, rtc_prefix_max=5)
    r = train(demos, tmp_path / "rp", cfg, arch=None, init=src, log=lines.append)
    assert math.isfinite(r.final_loss)
    assert read_numerics(tmp_path / "rp")[RTC_PREFIX_KEY] == 5
    assert any("RTC prefix of 0-5 actions given" in s for s in lines)
    assert Engine.from_checkpoint(tmp_path / "rp", mode="exact").rtc.guidance == "prefix"
    assert Engine.from_checkpoint(src, mode="exact").rtc.guidance == "constant"
    numerics = tmp_path / "rp" / "edgefm_numerics.json"
    numerics.write_text(numerics.read_text().replace('"rtc_prefix_max": 5', '"rtc_prefix_max": -2'))
    with pytest.raises(CheckpointError, match="rtc_prefix_max"):
        Engine.from_checkpoint(tmp_path / "rp", mode="exact")
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="rtc_prefix_max"):
            TrainConfig(rtc_prefix_max=bad)
    with pytest.raises(ValueError, match="rtc_prefix_max 8 must be below chunk_size 8"):
        TrainConfig(rtc_prefix_max=8, chunk_size=8)

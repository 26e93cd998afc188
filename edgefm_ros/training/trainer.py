"""The training loop: a SmolVLA checkpoint from demonstrations (from scratch or from ``init``).

    train(demos, "ckpt/", TrainConfig(steps=4000), arch="tiny")

Seeded (model init, batch order, noise and time all come from ``cfg.seed``); AdamW with LeRobot's
warm-up + cosine schedule; a progress line every ``log_every`` steps (loss, lr, steps/s, ETA); the
checkpoint in ``out`` rewritten every ``save_every`` steps and at the end, loadable by the Engine at
any time.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from edgefm_ros.models.config import SmolVLAConfig, VlmConfig
from edgefm_ros.runtime.checkpoint import RTC_PREFIX_KEY, load_checkpoint, write_numerics
from edgefm_ros.runtime.preprocess import Preprocessor, Tokenizer
from edgefm_ros.runtime.safetensors_mmap import load_all

from . import export
from .augment import make_augment
from .data import ChunkBatcher, Demos
from .flow import flow_loss, noisy_actions, prefix_time, sample_noise, sample_prefix, sample_time
from .model import VISION_PREFIX, TrainableSmolVLA
from .recipe import ARCHS, TrainConfig, lr_factor

CAMERA_PREFIX = "observation.images."


@dataclass(frozen=True)
class TrainResult:
    out: Path
    steps: int
    final_loss: float  # mean over the last log window
    first_loss: float  # mean over the first log window
    seconds: float


def camera_shapes(demos: Demos) -> dict[str, tuple[int, int]]:
    """checkpoint camera key -> (H, W) of the dataset's frames."""
    shapes = {}
    for key, frames in sorted(demos.images.items()):
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"camera {key!r}: expected uint8 [N, H, W, 3] frames, got shape {frames.shape}")
        name = key if key.startswith(CAMERA_PREFIX) else CAMERA_PREFIX + key
        shapes[name] = (int(frames.shape[1]), int(frames.shape[2]))
    if not shapes:
        raise ValueError("dataset has no camera images")
    return shapes


def _setup(demos: Demos, out: Path, cfg: TrainConfig, arch: str | None, init: str | Path | None):
    """(policy config dict, initial weights) with out/vlm written; from ARCHS[arch] or the init checkpoint."""
    cams = camera_shapes(demos)
    state_dim, action_dim = int(demos.state.shape[1]), int(demos.action.shape[1])
    if init is not None:
        ck = load_checkpoint(init)
        c = ck.config
        if set(c.camera_keys) != set(cams):
            raise ValueError(f"--init checkpoint cameras {list(c.camera_keys)} differ from the dataset's {list(cams)}")
        if (c.state_dim, c.action_dim) != (state_dim, action_dim):
            raise ValueError(f"--init checkpoint state/action dims {(c.state_dim, c.action_dim)} differ from the "
                             f"dataset's {(state_dim, action_dim)}")
        config = json.loads((Path(init) / "config.json").read_text())
        chunk = cfg.chunk_size or c.chunk_size
        config.update({"chunk_size": chunk, "n_action_steps": cfg.n_action_steps or min(config.get(
            "n_action_steps", chunk), chunk), "vlm_model_name": "vlm"})
        config["freeze_vision_encoder"] = cfg.freeze_vision
        for key, hw in cams.items():
            config["input_features"][key]["shape"] = [3, *hw]
        export.write_config(out, config, ck.vlm_dir, export.stats_tensors(demos.stats))
        weights = load_all(ck.weights_path)
        if export.LM_HEAD_KEY not in weights:
            weights[export.LM_HEAD_KEY] = torch.zeros(ck.vlm.text.vocab, ck.vlm.text.hidden)
        return config, weights
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    a = ARCHS[arch]
    chunk = cfg.chunk_size or a["chunk_size"]
    n_exec = cfg.n_action_steps or max(1, chunk // 2)
    if n_exec > chunk:
        raise ValueError(f"n_action_steps {n_exec} exceeds chunk_size {chunk}")
    out.mkdir(parents=True, exist_ok=True)
    vlm_dict = export.write_backbone(out / "vlm", a, list(demos.tasks))
    config = export.new_policy_config(a, cams, state_dim, action_dim, chunk, n_exec)
    config["freeze_vision_encoder"] = cfg.freeze_vision
    export.write_config(out, config, out / "vlm", export.stats_tensors(demos.stats))
    weights = export.initial_weights(SmolVLAConfig.from_dict(config), VlmConfig.from_dict(vlm_dict), cfg.seed)
    return config, weights


def train(demos: Demos, out: str | Path, cfg: TrainConfig, arch: str | None = "tiny", init: str | Path | None = None,
          log: Callable[[str], None] = print, meta: dict | None = None, tasks: Sequence[str] | None = None,
          task_weights: Mapping[str, float] | None = None) -> TrainResult:
    """``tasks``: train on these tasks' episodes only (the dataset's per-episode task names; default all).
    ``task_weights``: task name -> how much more often its frames are drawn than the others' (default 1)."""
    out = Path(out)
    names = getattr(demos, "episode_task", None) or {}  # episode -> task name
    unknown = sorted((set(tasks or ()) | set(task_weights or ())) - set(names.values()))
    if unknown:
        raise ValueError(f"task(s) {unknown} not in the dataset (its tasks: {sorted(set(names.values()))})")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    config, weights = _setup(demos, out, cfg, arch, init)
    export.save_weights(out, weights, {"step": 0})  # loadable from the start
    # what the Engine must build with: the vision position ids, and RTC by the given prefix where trained for it
    write_numerics(out, cfg.vision_position_ids, written_by="edgefm-vla train",
                   **({RTC_PREFIX_KEY: cfg.rtc_prefix_max} if cfg.rtc_prefix_max else {}))
    ck = load_checkpoint(out)  # what the Engine will read: config, backbone, stats
    pcfg = ck.config
    pre = Preprocessor(pcfg, ck.stats, Tokenizer(ck.tokenizer_path, pcfg.tokenizer_max_length))
    pre.tokenizer(list(demos.tasks))  # every instruction fits tokenizer_max_length (raises naming it)
    success = getattr(demos, "episode_success", None) or {}
    episodes = sorted(int(e) for e in np.unique(demos.episode_index) if success.get(int(e), True))
    if len(episodes) < len(np.unique(demos.episode_index)):
        log(f"train: {len(np.unique(demos.episode_index)) - len(episodes)} failed episode(s) left out")
    if tasks:
        episodes = [e for e in episodes if names.get(e) in set(tasks)]
    batcher = ChunkBatcher(demos, pcfg.camera_keys, pcfg.chunk_size, pcfg.max_action_dim, pre, episodes,
                           augment=make_augment(cfg.augment, cfg.seed),
                           episode_weights={e: task_weights.get(names.get(e), 1.0) for e in episodes}
                           if task_weights else None, start_weight=(cfg.start_frames, cfg.start_weight))
    model = TrainableSmolVLA(pcfg, ck.vlm, weights, cfg.vision_position_ids)
    if cfg.freeze_vision:
        model.freeze(VISION_PREFIX)
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    gen = torch.Generator().manual_seed(cfg.seed)
    trained = sorted(set(names[e] for e in episodes if e in names)) or list(demos.tasks)
    log(f"train: {batcher.size} frames, {len(episodes)} episodes, {len(trained)} tasks; "
        f"{n_params / 1e6:.2f} M parameters; chunk {pcfg.chunk_size}, batch {cfg.batch_size}, {cfg.steps} steps, "
        f"lr {cfg.lr:g} (warm-up {cfg.warmup_steps}), threads {cfg.threads}, seed {cfg.seed}, augment {cfg.augment}"
        + (f", first {cfg.start_frames} frames x{cfg.start_weight:g}" if cfg.start_frames and cfg.start_weight != 1
           else "") + (", vision tower frozen" if cfg.freeze_vision else "")
        + (f", RTC prefix of 0-{cfg.rtc_prefix_max} actions given" if cfg.rtc_prefix_max else ""))
    info = {"recipe": cfg.as_dict(), "arch": arch if init is None else None, "init": str(init) if init else None,
            "parameters": n_params, "frames": batcher.size, "episodes": len(episodes),
            # the tasks trained on (the sim's eval reads this): task names when the dataset has them, else texts
            "tasks": trained, **({"task_weights": dict(task_weights)} if task_weights else {}),
            **(meta or {})}

    def save(step: int, loss: float, seconds: float) -> None:
        record = {**info, "step": step, "loss": round(loss, 5), "train_seconds": round(seconds, 1)}
        export.save_weights(out, model.state_dict_lerobot(), record)
        export.write_readme(out, record)

    t0 = time.perf_counter()
    window, first, last = [], math.nan, math.nan
    t_win = t0
    model.train()
    for step in range(1, cfg.steps + 1):
        b = batcher.sample(cfg.batch_size, gen)
        noise = sample_noise(tuple(b.actions.shape), gen)
        t = sample_time(cfg.batch_size, gen)
        is_pad = b.is_pad
        if cfg.rtc_prefix_max:  # the given prefix: clean, at time 0, out of the loss
            t, given = prefix_time(t, sample_prefix(cfg.batch_size, cfg.rtc_prefix_max, gen), b.actions.shape[1])
            is_pad = is_pad | given
        x_t, u_t = noisy_actions(b.actions, noise, t)
        loss = flow_loss(model.velocity(b.inputs, x_t, t), u_t, is_pad, pcfg.action_dim)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm))
        opt.step()
        sched.step()
        window.append(loss.item())
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            rate = len(window) / max(now - t_win, 1e-9)
            last = float(np.mean(window))
            first = last if math.isnan(first) else first
            eta = (cfg.steps - step) / max(rate, 1e-9)
            log(f"step {step}/{cfg.steps}  loss {last:.4f}  lr {sched.get_last_lr()[0]:.2e}  grad {gnorm:.2f}  "
                f"{rate:.2f} steps/s  elapsed {now - t0:.0f}s  ETA {eta:.0f}s")
            window, t_win = [], now
        if cfg.save_every and step % cfg.save_every == 0 and step != cfg.steps:
            save(step, last, time.perf_counter() - t0)
            log(f"saved checkpoint (step {step}) to {out}")
    seconds = time.perf_counter() - t0
    save(cfg.steps, last, seconds)
    log(f"done: {cfg.steps} steps in {seconds:.0f}s, final loss {last:.4f}; checkpoint {out}")
    return TrainResult(out, cfg.steps, last, first, seconds)

"""The synchronous closed loop (no ROS): the policy blocks simulated time, so this is the upper bound of
task success with no latency (``edgefm-sim eval --exec sync``).

    result = run_episode(env, policy, "reach", seed=1000, n_action_steps=8)

``policy(images, state, instruction) -> float [T, 4]``: an action chunk of absolute commands (xyz + gripper)
at the env's control rate, from {camera: uint8 [H, W, 3]}, state float32 [4] and the instruction. An
optional ``policy.reset(seed)`` is called at each episode start. The first ``n_action_steps`` commands of
each chunk are executed, one per control period, then the policy is asked again. With ``delay_s`` > 0 the
arm holds its last command for that long (simulated) before each new chunk starts: inference that the
robot waits for. ``conditions`` / ``phrasings`` choose the episode's camera condition and instruction wording
from its seed (sim.episode), as every executor does.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.episode import episode_setup
from edgefm_ros.sim.report import EpisodeOutcome, make_report
from edgefm_ros.sim.tasks import TASKS, get_task


class ChunkPolicy(Protocol):
    def __call__(self, images: Mapping[str, np.ndarray], state: np.ndarray, instruction: str) -> np.ndarray: ...


@dataclass
class EpisodeResult:
    task: str
    seed: int
    success: bool
    time_to_success_s: float  # simulated seconds; NaN when the episode failed
    commands: np.ndarray  # float32 [N, 4]: one per control period, as commanded
    boundaries: tuple[int, ...]  # indices into commands where a chunk's first action was commanded
    inference_s: list[float] = field(default_factory=list)  # wall seconds per policy call
    condition: str = "clean"  # the camera condition the episode ran under
    instruction: str = ""

    def outcome(self) -> EpisodeOutcome:
        return EpisodeOutcome(self.task, self.seed, self.success, self.time_to_success_s, self.commands,
                              self.boundaries, condition=self.condition, instruction=self.instruction)


def run_episode(env: SimEnv, policy: ChunkPolicy, task: str, seed: int, *, n_action_steps: int,
                max_seconds: float | None = None, delay_s: float = 0.0, conditions: str = "clean",
                phrasings: str = "canonical") -> EpisodeResult:
    """One episode from reset to success or the time limit (``max_seconds``, default the task's)."""
    spec = get_task(task)
    setup = episode_setup(task, seed, conditions, phrasings)
    camera = setup.camera()
    if n_action_steps < 1:
        raise ValueError(f"n_action_steps must be >= 1, got {n_action_steps!r}")
    if not (delay_s >= 0 and math.isfinite(delay_s)):
        raise ValueError(f"delay_s must be finite and >= 0, got {delay_s!r}")
    limit = spec.max_seconds if max_seconds is None else max_seconds
    env.reset(task, seed)
    if hasattr(policy, "reset"):
        policy.reset(seed)
    dt = 1.0 / env.config.control_hz
    commands: list[np.ndarray] = []
    boundaries: list[int] = []
    inference: list[float] = []
    t_success = math.nan
    while env.sim_time < limit - 1e-9 and math.isnan(t_success):
        t0 = time.perf_counter()
        chunk = np.asarray(policy(camera(env.render()), env.state(), setup.instruction), dtype=np.float64)
        inference.append(time.perf_counter() - t0)
        if chunk.ndim != 2 or chunk.shape[1] != 4 or len(chunk) < 1:
            raise ValueError(f"policy returned a chunk of shape {chunk.shape}, expected [T >= 1, 4]")
        if delay_s > 0:
            env.advance(delay_s)
            if env.success():
                t_success = env.sim_time
                break
        boundaries.append(len(commands))
        for cmd in chunk[:n_action_steps]:
            env.set_command(cmd)
            commands.append(cmd.astype(np.float32))
            env.advance(dt)
            if env.success():
                t_success = env.sim_time
                break
            if env.sim_time >= limit - 1e-9:
                break
    return EpisodeResult(task, int(seed), not math.isnan(t_success), t_success,
                         np.asarray(commands, dtype=np.float32).reshape(-1, 4), tuple(boundaries), inference,
                         setup.condition.name, setup.instruction)


class EnginePolicy:
    """Our runtime Engine on a checkpoint as a ChunkPolicy: camera "scene" -> "observation.images.scene".

    Flow-matching noise comes from a generator seeded by the episode's seed (``reset``), so a seed's episode
    is the same whatever ran before it."""

    def __init__(self, engine, cameras: Sequence[str]):
        self.engine = engine
        spec = engine.spec
        self.keys = {c: f"observation.images.{c}" for c in cameras}
        missing = [k for k in spec.camera_keys if k not in self.keys.values()]
        if missing:
            raise ValueError(f"checkpoint cameras {missing} are not simulated (cameras: {list(cameras)})")
        if spec.state_dim != 4 or spec.action_dim < 4:
            raise ValueError(f"checkpoint state_dim {spec.state_dim} / action_dim {spec.action_dim}: the sim "
                             "needs state 4 (xyz + gripper) and action 4")
        self.shape = (spec.chunk_size, spec.max_action_dim)
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, images, state, instruction) -> np.ndarray:
        from edgefm_ros.types import Observation

        obs = Observation({self.keys[c]: img for c, img in images.items() if self.keys[c] in
                           self.engine.spec.camera_keys}, np.asarray(state, dtype=np.float32), instruction)
        noise = self.rng.standard_normal(self.shape).astype(np.float32)
        return self.engine.predict(obs, noise=noise).actions[:, :4]


def checkpoint_settings(checkpoint: str | Path) -> dict:
    """What the sim needs from a checkpoint's config.json: image_hw, cameras, n_action_steps, chunk_size."""
    cfg_path = Path(checkpoint) / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"checkpoint {checkpoint}: {cfg_path} is missing")
    d = json.loads(cfg_path.read_text())
    feats = d.get("input_features", {})
    cams = {k.removeprefix("observation.images."): f["shape"] for k, f in feats.items()
            if k.startswith("observation.images.")}
    if not cams:
        raise ValueError(f"checkpoint {checkpoint}: config.json names no observation.images.* inputs")
    shapes = {tuple(s[-2:]) for s in cams.values()}
    if len(shapes) != 1:
        raise ValueError(f"checkpoint {checkpoint}: cameras have different sizes {sorted(shapes)}")
    return {"image_hw": tuple(int(v) for v in shapes.pop()), "cameras": tuple(cams),
            "n_action_steps": int(d.get("n_action_steps", d.get("chunk_size", 50))),
            "chunk_size": int(d.get("chunk_size", 50))}


def checkpoint_tasks(checkpoint: str | Path) -> list[str]:
    """The tasks a checkpoint was trained on, when its training record says so (edgefm_train.json "tasks":
    task names or instruction texts), else every task."""
    for name in ("edgefm_train.json", "train_info.json"):
        p = Path(checkpoint) / name
        if p.exists():
            try:
                d = json.loads(p.read_text())
            except json.JSONDecodeError:
                continue
            names = d.get("tasks") or d.get("dataset_tasks")
            if isinstance(names, list):
                known = [t for t in names if t in TASKS]
                by_text = [n for n, s in TASKS.items() if s.instruction in names]
                if known or by_text:
                    return known or by_text
    return list(TASKS)


def run_sync_eval(checkpoint: str | None, tasks: str | Sequence[str] | None, seeds: Sequence[int], *,
                  delay_ms: float = 0.0, n_action_steps: int | None = None, vlm_dir: str | None = None,
                  max_seconds: float | None = None, log: Callable[[str], None] = print, engine_mode: str = "exact",
                  conditions: str = "clean", phrasings: str = "canonical", image_hw: tuple[int, int] | None = None
                  ) -> dict:
    """``edgefm-sim eval --exec sync``: every task x seed in one process with our Engine (``engine_mode``); the
    shared report. ``conditions``/``phrasings``: per-episode camera condition set and instruction wording;
    ``image_hw``: the cameras' resolution (default the checkpoint's input size; the Engine resizes)."""
    # the Engine (torch) only when an evaluation runs: the helpers above serve light callers (checkpoint
    # settings and tasks for the CLIs and the ROS harness)
    from edgefm_ros.runtime.engine import Engine
    from edgefm_ros.sim.tasks import parse_tasks

    if checkpoint is None:
        from edgefm_ros.sim.paths import default_checkpoint

        checkpoint = str(default_checkpoint())
    st = checkpoint_settings(checkpoint)
    names = parse_tasks(tasks) if isinstance(tasks, str) else list(tasks or checkpoint_tasks(checkpoint))
    steps = n_action_steps or st["n_action_steps"]
    sim = SimConfig(image_hw=tuple(image_hw or st["image_hw"]), cameras=st["cameras"])
    engine = Engine.from_checkpoint(checkpoint, vlm_dir=vlm_dir, mode=engine_mode)
    policy = EnginePolicy(engine, sim.cameras)
    outcomes, latency = [], []
    t0 = time.perf_counter()
    total = len(names) * len(seeds)
    with SimEnv(sim) as env:
        for i, (seed, task) in enumerate((s, t) for s in seeds for t in names):
            r = run_episode(env, policy, task, seed, n_action_steps=steps, delay_s=delay_ms / 1e3,
                            max_seconds=max_seconds, conditions=conditions, phrasings=phrasings)
            outcomes.append(r.outcome())
            latency.extend(r.inference_s)
            log(f"[eval sync] {i + 1}/{total} {task}:{seed} [{r.condition}] {'success' if r.success else 'fail'}"
                + (f" in {r.time_to_success_s:.2f} s" if r.success else "")
                + f" ({len(r.boundaries)} chunks, {time.perf_counter() - t0:.0f} s elapsed)")
    lat = np.asarray(latency) * 1e3
    timing = {"inference_latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                       "max": float(lat.max()), "count": int(lat.size),
                                       "note": "policy compute per chunk (wall); simulated time is blocked"},
              "queue_underruns": {"total": 0, "after_warmup": 0, "ticks": int(sum(len(o.commands) for o in outcomes)),
                                  "note": "none by construction in sync mode"}}
    settings = {"seeds": f"{min(seeds)}-{max(seeds)}" if list(seeds) == list(range(min(seeds), max(seeds) + 1))
                else ",".join(map(str, seeds)), "delay_ms": delay_ms, "n_action_steps": steps,
                "image_hw": list(sim.image_hw), "cameras": list(sim.cameras), "max_seconds": max_seconds,
                "engine_mode": engine_mode, "conditions": conditions, "phrasings": phrasings}
    return make_report(outcomes, exec_mode="sync", checkpoint=str(checkpoint), control_hz=sim.control_hz,
                       timing=timing, settings=settings)

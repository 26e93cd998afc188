"""Expert demonstrations -> a LeRobot-layout dataset (``edgefm-sim collect``).

Each frame is recorded at the control rate: the cameras and the state, then the expert's command (the
frame's action), which the controller then tracks for one control period (plus small seeded xyz noise on
what is executed, not on what is recorded, so the demonstrations include recoveries). An episode runs from reset to
the expert's success plus ``tail_s`` (the arm settles on its goal), or to the task's time limit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgefm_ros.sim.dataset import DatasetWriter
from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.expert import EXPERT_SPEED, run_expert_episode
from edgefm_ros.sim.tasks import PHRASINGS, TRAIN_SEEDS, episode_instruction, get_task


@dataclass(frozen=True)
class CollectConfig:
    tasks: tuple[str, ...]
    episodes_per_task: int
    first_seed: int = TRAIN_SEEDS.start
    tail_s: float = 0.5  # recorded after success
    expert_speed: float = EXPERT_SPEED
    noise_m: float = 0.005  # xyz noise on the executed command, not on the recorded action (DART)
    start_jitter_m: float = 0.0  # > 0: each episode starts with the hand moved within this of its reset position
    only_success: bool = True  # False: failed episodes are written too, flagged success=False
    phrasings: str = "varied"  # the episode's instruction: drawn from the training phrasings, or "canonical"

    def __post_init__(self) -> None:
        for t in self.tasks:
            get_task(t)
        if not self.tasks:
            raise ValueError("CollectConfig.tasks is empty")
        if self.episodes_per_task < 1:
            raise ValueError(f"CollectConfig.episodes_per_task must be >= 1, got {self.episodes_per_task!r}")
        last = self.first_seed + self.episodes_per_task - 1
        if self.first_seed not in TRAIN_SEEDS or last not in TRAIN_SEEDS:
            raise ValueError(f"seeds {self.first_seed}-{last} leave TRAIN_SEEDS {TRAIN_SEEDS}")
        if not (0 <= self.noise_m < 0.1):
            raise ValueError(f"CollectConfig.noise_m must be in [0, 0.1) m, got {self.noise_m!r}")
        if not (0 <= self.start_jitter_m <= 0.2):
            raise ValueError(f"CollectConfig.start_jitter_m must be in [0, 0.2] m, got {self.start_jitter_m!r}")
        if self.phrasings not in PHRASINGS:
            raise ValueError(f"CollectConfig.phrasings must be one of {PHRASINGS}, got {self.phrasings!r}")
        if not (0 <= self.tail_s < 10):
            raise ValueError(f"CollectConfig.tail_s must be in [0, 10), got {self.tail_s!r}")


def collect(out: str | Path, cfg: CollectConfig, sim: SimConfig = SimConfig(),
            log: Callable[[str], None] = print) -> dict:
    """Write the demonstrations to ``out``; returns a summary dict (episodes, frames, successes, seconds)."""
    t0 = time.perf_counter()
    summary = {"episodes": 0, "frames": 0, "successes": {}, "seconds": 0.0, "out": str(out)}
    total = len(cfg.tasks) * cfg.episodes_per_task
    done = 0
    with SimEnv(sim) as env, DatasetWriter(out, fps=sim.control_hz, image_hw=sim.image_hw,
                                           cameras=sim.cameras) as writer:
        for task in cfg.tasks:
            ok = 0
            for seed in range(cfg.first_seed, cfg.first_seed + cfg.episodes_per_task):
                frames: dict[str, list[np.ndarray]] = {c: [] for c in sim.cameras}
                states, actions = [], []

                def record(state: np.ndarray, command: np.ndarray) -> None:
                    for c, img in env.render().items():
                        frames[c].append(img)
                    states.append(state)
                    actions.append(command)

                success, _ = run_expert_episode(env, task, seed, tail_seconds=cfg.tail_s, on_frame=record,
                                                speed=cfg.expert_speed, noise_m=cfg.noise_m,
                                                start_jitter_m=cfg.start_jitter_m)
                ok += success
                done += 1
                if success or not cfg.only_success:
                    writer.add_episode({c: np.stack(v) for c, v in frames.items()}, np.stack(states),
                                       np.stack(actions), episode_instruction(task, seed, cfg.phrasings),
                                       success=success, task=task, seed=seed)
                    summary["episodes"] += 1
                    summary["frames"] += len(states)
                if done % 10 == 0 or done == total:
                    el = time.perf_counter() - t0
                    log(f"[collect] {done}/{total} episodes, {summary['frames']} frames, {el:.0f} s elapsed, "
                        f"~{el / done * (total - done):.0f} s left")
            summary["successes"][task] = f"{ok}/{cfg.episodes_per_task}"
            log(f"[collect] {task}: expert success {ok}/{cfg.episodes_per_task}")
    summary["seconds"] = time.perf_counter() - t0
    return summary

"""The scripted expert: Meta-World's own policy for the task (``metaworld.policies``) turned into our absolute
command. It reads the env's full observation (object and goal positions), which the learned policy never sees.

Meta-World's policies give a hand displacement d in [-1, 1]^3 per physics tick (times 1 cm) and a gripper
effort. Held for one control period of k ticks, that is the target ``reference + k * 1 cm * d``, where
reference is where the controller holds the hand now: the same motion Meta-World would make, decided at the
control rate instead of every tick.

    python -m edgefm_ros.sim.expert --episodes 20        # expert success and times per task (train seeds)
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

from edgefm_ros.sim.env import MAX_STEP_M, SimConfig, SimEnv
from edgefm_ros.sim.tasks import TASKS, TRAIN_SEEDS, get_task, parse_tasks


EXPERT_SPEED = 0.5  # the demonstrations' speed cap: half Meta-World's 0.8 m/s (smoother, 25-50 frames a demo)


class Expert:
    """``expert(env) -> float32 [4]``: the next absolute command for the env's current task."""

    def __init__(self, task: str, speed: float = EXPERT_SPEED):
        from metaworld.policies import ENV_POLICY_MAP

        if not (0.0 < speed <= 1.0):
            raise ValueError(f"Expert speed must be in (0, 1] (a fraction of Meta-World's 0.8 m/s), got {speed!r}")
        self.speed = speed
        spec = get_task(task)
        if spec.env_name not in ENV_POLICY_MAP:
            raise ValueError(f"task {task!r}: metaworld.policies has no policy for {spec.env_name!r}")
        self.task = spec.name
        self.policy = ENV_POLICY_MAP[spec.env_name]()

    def __call__(self, env: SimEnv) -> np.ndarray:
        if env.task is None or env.task.name != self.task:
            raise ValueError(f"expert for {self.task!r} asked about task {getattr(env.task, 'name', None)!r}")
        return self.command(env.observation(), env.reference(), env.config.ticks_per_command)

    def command(self, observation: np.ndarray, reference: np.ndarray, ticks_per_command: int) -> np.ndarray:
        """The next absolute command from Meta-World's observation [39] and the target the controller holds
        now (xyz, m): ``reference`` moved by what the policy asks for over ``ticks_per_command`` ticks."""
        with warnings.catch_warnings():  # "Constant(s) may be too high": its gains saturate by design
            warnings.simplefilter("ignore", UserWarning)
            a = np.asarray(self.policy.get_action(np.asarray(observation, dtype=np.float64)), dtype=np.float64)
        d = np.clip(a[:3], -self.speed, self.speed)  # a velocity cap; the gain near the target stays
        xyz = np.asarray(reference, dtype=np.float64) + ticks_per_command * MAX_STEP_M * d
        return np.concatenate([xyz, [np.clip(a[3], -1.0, 1.0)]]).astype(np.float32)


START_MOVE_S = 0.4  # time given to the move to a jittered start (0.8 m/s: covers 0.2 m per axis twice over)


def run_expert_episode(env: SimEnv, task: str, seed: int, max_seconds: float | None = None,
                       tail_seconds: float = 0.0, on_frame=None, speed: float = EXPERT_SPEED,
                       noise_m: float = 0.0, start_jitter_m: float = 0.0) -> tuple[bool, float]:
    """Run the expert from reset until success (+ ``tail_seconds``) or the time limit.

    ``start_jitter_m`` > 0: before the first frame, the hand is moved (unrecorded, ``START_MOVE_S``) to a start
    drawn uniformly within that distance of its reset position per axis (seeded by ``seed``; never lower than
    the reset height less half of it), so that where the hand is mid-episode does not tell where it is going.

    ``on_frame(state [4], command [4])`` is called before each command is applied (the moment an image and
    the state would be recorded). ``noise_m`` > 0: the arm is sent the command plus Gaussian xyz noise of this
    std (seeded by ``seed``) while ``on_frame`` sees the clean command, so demonstrations show how the expert
    recovers from small deviations (DART). Returns (success, time_to_success_s or nan)."""
    if not (0.0 <= noise_m < 0.1):
        raise ValueError(f"noise_m must be in [0, 0.1) m, got {noise_m!r}")
    if not (0.0 <= start_jitter_m <= 0.2):
        raise ValueError(f"start_jitter_m must be in [0, 0.2] m, got {start_jitter_m!r}")
    expert = Expert(task, speed)
    rng = np.random.default_rng(seed)
    env.reset(task, seed)
    if start_jitter_m > 0:
        jitter_rng = np.random.default_rng([seed, 0x6A6974])  # its own stream: the DART noise stays the same
        lo = np.array([-1.0, -1.0, -0.5]) * start_jitter_m
        start = env.state()[:3] + jitter_rng.uniform(lo, start_jitter_m)
        env.set_command(np.concatenate([start, [env.command()[3]]]))
        env.advance(START_MOVE_S)
    dt = 1.0 / env.config.control_hz
    limit = max_seconds if max_seconds is not None else env.task.max_seconds
    t_success = float("nan")
    end = limit
    while env.sim_time < end - 1e-9:
        cmd = expert(env)
        if on_frame is not None:
            on_frame(env.state(), cmd)
        if noise_m > 0:
            cmd = cmd.copy()
            cmd[:3] += rng.normal(0.0, noise_m, 3)
        env.set_command(cmd)
        env.advance(dt)
        if env.success() and t_success != t_success:
            t_success = env.sim_time
            end = min(limit, t_success + tail_seconds)
    return t_success == t_success, t_success


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Expert success per task through the position-control interface")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=TRAIN_SEEDS.start)
    ap.add_argument("--control-hz", type=float, default=SimConfig().control_hz)
    ap.add_argument("--speed", type=float, default=EXPERT_SPEED, help="expert speed, fraction of 0.8 m/s")
    ap.add_argument("--noise-m", type=float, default=0.0, help="xyz noise on the executed command (m)")
    ap.add_argument("--max-seconds", type=float, default=None, help="override the tasks' time limit")
    args = ap.parse_args(argv)
    env = SimEnv(SimConfig(control_hz=args.control_hz))
    for task in parse_tasks(args.tasks):
        t0 = time.perf_counter()
        ok, times, failed = 0, [], []
        for seed in range(args.first_seed, args.first_seed + args.episodes):
            s, t = run_expert_episode(env, task, seed, args.max_seconds, speed=args.speed, noise_m=args.noise_m)
            ok += s
            if s:
                times.append(t)
            else:
                failed.append(seed)
        wall = time.perf_counter() - t0
        ts = np.array(times) if times else np.array([np.nan])
        print(f"{task:22s} success {ok}/{args.episodes}  time to success mean {np.mean(ts):.2f} s "
              f"max {np.max(ts):.2f} s (limit {TASKS[task].max_seconds} s)  failed seeds {failed[:10]}  "
              f"[{wall:.1f} s wall]", flush=True)
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

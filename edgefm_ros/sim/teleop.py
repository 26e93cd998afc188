"""A simulated teleoperation device: the scripted expert (edgefm_ros.sim.expert) as the operator's hand.

A person teaching a robot with a spacemouse or a leader arm moves a target; the device reports it as an
absolute command many times a second, and the robot's controller follows it. ``TeleopOperator`` does the same
from what a person would see of the scene: the simulator's ground truth (Meta-World's observation: the hand,
the gripper, the objects' poses and the goal; ``GROUND_TRUTH_NAMES``), which sim_node publishes on request
and which no policy ever reads. Each period the expert's displacement is added to the device's own target
(as a spacemouse integrates its deflection), so the device never needs the controller's internals; a person's
imprecision is optional: Gaussian noise on each command sent (a tremor around the intended target, which
does not accumulate) and hesitations (the target held for a while, as a person pausing to look).

    op = TeleopOperator(TeleopConfig(noise_m=0.003))
    op.begin("drawer-open", seed=3, observation=obs)        # an episode starts (hand where the reset left it)
    cmd = op.command(obs, t)                                 # float32 [4]: xyz target (m, world) + gripper

No ROS here: tools/teleop_node.py puts it on the graph (ground truth in, commands out on action_node's topic).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from edgefm_ros.sim.env import WORKSPACE_HIGH, WORKSPACE_LOW, SimConfig
from edgefm_ros.sim.expert import EXPERT_SPEED, Expert

# Meta-World v3's observation, in order: the hand and gripper, two object poses (position + quaternion w x y z;
# zeros where a task has one object), the same 18 values one physics tick earlier, and the goal position.
_FRAME = (["hand_x", "hand_y", "hand_z", "gripper_distance"]
          + [f"obj{i}_{c}" for i in (1, 2) for c in ("x", "y", "z", "qw", "qx", "qy", "qz")])
GROUND_TRUTH_NAMES: tuple[str, ...] = tuple(_FRAME + [f"prev_{n}" for n in _FRAME] + ["goal_x", "goal_y", "goal_z"])


def ground_truth_vector(names, values) -> np.ndarray:
    """A ground-truth message's (names, values) -> float64 [39] in GROUND_TRUTH_NAMES order; ValueError naming
    what is wrong (other names, a wrong count, non-finite values)."""
    names, v = tuple(names), np.asarray(list(values), dtype=np.float64)
    if names != GROUND_TRUTH_NAMES:
        missing = [n for n in GROUND_TRUTH_NAMES if n not in names]
        raise ValueError(f"ground truth names are not Meta-World's {len(GROUND_TRUTH_NAMES)} observation names "
                         f"(missing {missing[:5]}, got {len(names)} names starting {list(names[:4])})")
    if v.shape != (len(GROUND_TRUTH_NAMES),):
        raise ValueError(f"ground truth holds {v.size} values for {len(names)} names")
    if not np.all(np.isfinite(v)):
        bad = [n for n, x in zip(names, v) if not math.isfinite(x)]
        raise ValueError(f"ground truth holds non-finite values at {bad}")
    return v


@dataclass(frozen=True)
class TeleopConfig:
    rate_hz: float = 20.0  # commands per second (the robot's control rate, the dataset's fps)
    speed: float = EXPERT_SPEED  # the expert's speed cap, a fraction of Meta-World's 0.8 m/s
    noise_m: float = 0.0  # std (m) of the xyz noise on each command sent; the intended target stays clean
    hesitate_per_s: float = 0.0  # hesitations per second of teaching (Poisson); 0: none
    hesitate_s: tuple[float, float] = (0.2, 0.6)  # a hesitation's length, drawn uniformly from this range
    seed: int = 0  # noise and hesitations: drawn from (seed, task, episode seed), the same every run

    def __post_init__(self) -> None:
        SimConfig(control_hz=self.rate_hz)  # a whole number of physics ticks per command (ValueError naming it)
        if not (0.0 < self.speed <= 1.0):
            raise ValueError(f"TeleopConfig.speed must be in (0, 1], got {self.speed!r}")
        if not (0.0 <= self.noise_m < 0.05):
            raise ValueError(f"TeleopConfig.noise_m must be in [0, 0.05) m, got {self.noise_m!r}")
        if not (0.0 <= self.hesitate_per_s <= 5.0):
            raise ValueError(f"TeleopConfig.hesitate_per_s must be in [0, 5], got {self.hesitate_per_s!r}")
        lo, hi = self.hesitate_s
        if not (0.0 < lo <= hi <= 5.0):
            raise ValueError(f"TeleopConfig.hesitate_s must be (min, max) with 0 < min <= max <= 5 s, "
                             f"got {self.hesitate_s!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"TeleopConfig.seed must be an integer >= 0, got {self.seed!r}")

    @property
    def ticks_per_command(self) -> int:
        return SimConfig(control_hz=self.rate_hz).ticks_per_command


class TeleopOperator:
    """The device for one episode at a time: ``begin`` at the episode's start, ``command`` once a period,
    ``end`` when the episode ends. Not thread-safe."""

    def __init__(self, cfg: TeleopConfig = TeleopConfig()):
        self.cfg = cfg
        self._experts: dict[str, Expert] = {}
        self.expert: Expert | None = None
        self.task: str | None = None
        self.seed: int | None = None
        self._target = np.zeros(3)  # the intended (clean) xyz target: integrated from the expert's moves
        self._sent: np.ndarray | None = None  # the last command sent (held while hesitating)
        self._hold_until = -math.inf
        self._rng = np.random.default_rng(0)
        self.commands = 0
        self.hesitations = 0

    @property
    def active(self) -> bool:
        return self.expert is not None

    def prepare(self, tasks) -> None:
        """Build the expert of each task now (the first one imports Meta-World's policies: about 0.6 s), so
        that an episode's first command is not late."""
        for task in tasks:
            if task not in self._experts:
                self._experts[task] = Expert(task, self.cfg.speed)  # ValueError naming an unknown task

    def begin(self, task: str, seed: int, observation) -> None:
        """Start teaching ``task`` (layout ``seed``); ``observation``: the ground truth after the reset, where
        the controller holds the hand (the device's target starts there)."""
        obs = np.asarray(observation, dtype=np.float64)
        if obs.shape != (len(GROUND_TRUTH_NAMES),):
            raise ValueError(f"observation must have {len(GROUND_TRUTH_NAMES)} values, got shape {obs.shape}")
        self.prepare([task])
        self.expert, self.task, self.seed = self._experts[task], task, int(seed)
        self._target = np.clip(obs[:3], WORKSPACE_LOW, WORKSPACE_HIGH)
        self._sent = None
        self._hold_until = -math.inf
        self._rng = np.random.default_rng([self.cfg.seed, zlib.crc32(task.encode()), int(seed)])
        self.commands = self.hesitations = 0

    def end(self) -> None:
        self.expert = None

    def command(self, observation, t: float) -> np.ndarray:
        """The command to send now (float32 [4]: xyz target + gripper effort), from the ground truth ``observation``
        [39]; ``t``: seconds on any steady clock (hesitations are timed on it)."""
        if self.expert is None:
            raise RuntimeError("TeleopOperator.command: no episode (call begin first)")
        cfg = self.cfg
        if self._sent is not None and t < self._hold_until:  # hesitating: the device is held still
            self.commands += 1
            return self._sent.copy()
        if self._sent is not None and cfg.hesitate_per_s > 0 and \
                self._rng.random() < -math.expm1(-cfg.hesitate_per_s / cfg.rate_hz):
            self._hold_until = t + float(self._rng.uniform(*cfg.hesitate_s))
            self.hesitations += 1
            self.commands += 1
            return self._sent.copy()
        cmd = self.expert.command(np.asarray(observation, dtype=np.float64), self._target, cfg.ticks_per_command)
        self._target = np.clip(cmd[:3].astype(np.float64), WORKSPACE_LOW, WORKSPACE_HIGH)
        sent = np.concatenate([self._target, cmd[3:]])
        if cfg.noise_m > 0:
            sent[:3] = np.clip(sent[:3] + self._rng.normal(0.0, cfg.noise_m, 3), WORKSPACE_LOW, WORKSPACE_HIGH)
        self._sent = sent.astype(np.float32)
        self.commands += 1
        return self._sent.copy()

"""The simulated tasks (Meta-World v3 on MuJoCo) served by one multi-task policy, and the seed sets.

Every seed is a fresh random layout (object and goal positions drawn from the task's own reset ranges with a
generator seeded by it). Training demonstrations use ``TRAIN_SEEDS``, evaluation ``EVAL_SEEDS``, the router's
calibration ``CALIBRATION_SEEDS``: three disjoint ranges.

Instructions: each task has its canonical instruction, more phrasings used in training, and phrasings held
out (never in a training set). ``episode_instruction(task, seed, "varied")`` draws an episode's wording from
its seed: training seeds from the training phrasings, every other seed from all of them (held-out included).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TaskSpec:
    name: str  # our name, e.g. "drawer-open"
    env_name: str  # Meta-World v3 environment, e.g. "drawer-open-v3"
    instruction: str  # the natural-language instruction given to the policy
    max_seconds: float  # episode time limit (simulated seconds)
    goal_marker_m: float = 0.0  # > 0: the goal site drawn as a sphere of this radius; 0: goal site hidden
    phrasings: tuple[str, ...] = ()  # more wordings of the instruction, used in training
    heldout: tuple[str, ...] = ()  # wordings never used in training (evaluation and calibration only)

    def __post_init__(self) -> None:
        if not self.name or not self.env_name.endswith("-v3"):
            raise ValueError(f"TaskSpec {self.name!r}: env_name {self.env_name!r} is not a Meta-World v3 name")
        if not self.instruction.strip():
            raise ValueError(f"TaskSpec {self.name!r}: empty instruction")
        if not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise ValueError(f"TaskSpec {self.name!r}: max_seconds must be positive, got {self.max_seconds!r}")
        if not (0.0 <= self.goal_marker_m < 0.2):
            raise ValueError(f"TaskSpec {self.name!r}: goal_marker_m must be in [0, 0.2), got {self.goal_marker_m!r}")
        every = (self.instruction, *self.phrasings, *self.heldout)
        if any(not p.strip() for p in every) or len(set(every)) != len(every):
            raise ValueError(f"TaskSpec {self.name!r}: phrasings must be distinct and non-empty, got {every!r}")

    @property
    def train_phrasings(self) -> tuple[str, ...]:
        return (self.instruction, *self.phrasings)

    @property
    def all_phrasings(self) -> tuple[str, ...]:
        return (*self.train_phrasings, *self.heldout)


# max_seconds: more than twice the expert's slowest time to success over 100 training seeds (1.3-2.3 s,
# `python -m edgefm_ros.sim.expert --episodes 100`).
TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("button-press-topdown", "button-press-topdown-v3", "press the button down from above", 5.0,
             phrasings=("push the button down", "press the red button", "hit the button from the top"),
             heldout=("press down on the button", "push the red button down from above")),
    TaskSpec("drawer-open", "drawer-open-v3", "pull the drawer open", 5.0,
             phrasings=("open the drawer", "pull out the drawer", "slide the drawer open"),
             heldout=("pull the drawer out toward you", "get the drawer open")),
    TaskSpec("window-open", "window-open-v3", "slide the window open", 6.0,
             phrasings=("open the window", "push the window open", "slide the window pane open"),
             heldout=("move the window so it is open", "open the sliding window")),
    TaskSpec("push", "push-v3", "push the puck onto the green spot", 5.0, goal_marker_m=0.03,
             phrasings=("push the puck to the green dot", "slide the puck onto the green mark",
                        "move the puck to the green goal"),
             heldout=("shove the puck onto the green spot", "push the disc to the green target")),
    TaskSpec("reach", "reach-v3", "move the gripper to the red ball", 5.0, goal_marker_m=0.03,
             phrasings=("reach for the red ball", "touch the red ball", "move the hand to the red sphere"),
             heldout=("bring the gripper to the red ball", "go to the red dot")),
    TaskSpec("door-close", "door-close-v3", "push the door closed", 5.0,
             phrasings=("close the door", "shut the door", "swing the door shut"),
             heldout=("push the door shut", "close the open door")),
    # not in the committed checkpoint's training set: the fine-tuning walkthrough's new task (docs/recordings.md)
    TaskSpec("drawer-close", "drawer-close-v3", "push the drawer closed", 5.0,
             phrasings=("close the drawer", "shut the drawer", "slide the drawer shut"),
             heldout=("push the drawer in", "close the open drawer")),
)}

# Layout seeds: demonstrations are drawn from TRAIN_SEEDS, evaluation from EVAL_SEEDS, the router's calibration
# (shadow-mode outcome logs) from CALIBRATION_SEEDS (disjoint ranges).
TRAIN_SEEDS = range(0, 1000)
EVAL_SEEDS = range(1000, 2000)
CALIBRATION_SEEDS = range(2000, 3000)
SEED_SETS = {"train": TRAIN_SEEDS, "eval": EVAL_SEEDS, "calibration": CALIBRATION_SEEDS}

PHRASINGS = ("canonical", "varied")  # episode_instruction's modes
_PHRASING_SALT = zlib.crc32(b"edgefm instruction phrasing")


def episode_instruction(task: str, seed: int, phrasings: str = "canonical") -> str:
    """The instruction of ``task``'s episode ``seed``: "canonical" -> TaskSpec.instruction; "varied" -> drawn
    from the seed (training seeds: the training phrasings; other seeds: all phrasings, held-out included)."""
    spec = get_task(task)
    if phrasings not in PHRASINGS:
        raise ValueError(f"phrasings must be one of {PHRASINGS}, got {phrasings!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if phrasings == "canonical":
        return spec.instruction
    pool = spec.train_phrasings if seed in TRAIN_SEEDS else spec.all_phrasings
    rng = np.random.default_rng([_PHRASING_SALT, zlib.crc32(spec.name.encode()), int(seed)])
    return pool[int(rng.integers(len(pool)))]


def get_task(name: str) -> TaskSpec:
    """TaskSpec by name; ValueError naming the unknown task and the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; tasks: {sorted(TASKS)}") from None


def parse_tasks(text: str | None) -> list[str]:
    """'a,b' -> ['a', 'b'] (validated); None or '' or 'all' -> every task."""
    if not text or text == "all":
        return list(TASKS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        get_task(n)
    if len(set(names)) != len(names):
        raise ValueError(f"tasks {text!r} name a task twice")
    return names


def parse_seeds(text: str) -> list[int]:
    """'A-B' (inclusive) or 'A,B,C' or 'A' -> seeds; ValueError naming the bad text."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise ValueError(f"seeds {text!r}: expected 'A-B', 'A,B,...' or 'A' with integers A <= B") from None
    if not out or min(out) < 0:
        raise ValueError(f"seeds {text!r}: need at least one seed, all >= 0")
    return out

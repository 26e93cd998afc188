"""The simulated tasks (Meta-World v3 on MuJoCo) served by one multi-task policy, and the seed sets.

Every seed is a fresh random layout (object and goal positions drawn from the task's own reset ranges with a
generator seeded by it). Training demonstrations use ``TRAIN_SEEDS``, evaluation ``EVAL_SEEDS``: disjoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    name: str  # our name, e.g. "drawer-open"
    env_name: str  # Meta-World v3 environment, e.g. "drawer-open-v3"
    instruction: str  # the natural-language instruction given to the policy
    max_seconds: float  # episode time limit (simulated seconds)
    goal_marker_m: float = 0.0  # > 0: the goal site drawn as a sphere of this radius; 0: goal site hidden

    def __post_init__(self) -> None:
        if not self.name or not self.env_name.endswith("-v3"):
            raise ValueError(f"TaskSpec {self.name!r}: env_name {self.env_name!r} is not a Meta-World v3 name")
        if not self.instruction.strip():
            raise ValueError(f"TaskSpec {self.name!r}: empty instruction")
        if not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise ValueError(f"TaskSpec {self.name!r}: max_seconds must be positive, got {self.max_seconds!r}")
        if not (0.0 <= self.goal_marker_m < 0.2):
            raise ValueError(f"TaskSpec {self.name!r}: goal_marker_m must be in [0, 0.2), got {self.goal_marker_m!r}")


# max_seconds: more than twice the expert's slowest time to success over 100 training seeds (1.3-2.3 s,
# `python -m edgefm_ros.sim.expert --episodes 100`).
TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("button-press-topdown", "button-press-topdown-v3", "press the button down from above", 5.0),
    TaskSpec("drawer-open", "drawer-open-v3", "pull the drawer open", 5.0),
    TaskSpec("window-open", "window-open-v3", "slide the window open", 6.0),
    TaskSpec("push", "push-v3", "push the puck onto the green spot", 5.0, goal_marker_m=0.03),
    TaskSpec("reach", "reach-v3", "move the gripper to the red ball", 5.0, goal_marker_m=0.03),
    TaskSpec("door-close", "door-close-v3", "push the door closed", 5.0),
)}

# Layout seeds: demonstrations are drawn from TRAIN_SEEDS, evaluation from EVAL_SEEDS (disjoint ranges).
TRAIN_SEEDS = range(0, 1000)
EVAL_SEEDS = range(1000, 2000)


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

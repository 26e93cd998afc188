"""What an episode's seed decides besides the layout: its camera condition and its instruction's wording.

    setup = episode_setup("reach", 1003, conditions="mixed", phrasings="varied")
    camera = setup.camera()                    # applies setup.condition to every frame of the episode
    images = camera(env.render()); text = setup.instruction

Every executor (sync, async, sim_node) builds its episodes through this, so the same seed gets the same
condition and instruction everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgefm_ros.sim.conditions import Condition, ConditionedCamera, draw_condition
from edgefm_ros.sim.tasks import episode_instruction


@dataclass(frozen=True)
class EpisodeSetup:
    task: str
    seed: int
    condition: Condition
    instruction: str

    def camera(self) -> ConditionedCamera:
        """A fresh per-episode applier (its per-frame randomness starts from the seed)."""
        return ConditionedCamera(self.condition, self.seed)


def episode_setup(task: str, seed: int, conditions: str = "clean", phrasings: str = "canonical") -> EpisodeSetup:
    """``conditions``: a condition set name (sim.conditions.CONDITION_SETS); ``phrasings``: "canonical" or
    "varied" (sim.tasks.episode_instruction)."""
    return EpisodeSetup(task, int(seed), draw_condition(conditions, task, seed),
                        episode_instruction(task, seed, phrasings))

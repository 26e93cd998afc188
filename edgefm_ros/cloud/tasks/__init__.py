"""The task registry: what ``edgefm-cloud serve --task`` can serve; each module is one adapter over
the shared core (cloud/core/): vla.py (action chunks), vqa.py (scene questions, streamed)."""
from __future__ import annotations

from edgefm_ros.cloud.core.task import Task
from edgefm_ros.cloud.tasks import vla, vqa

TASKS: dict[str, Task] = {t.name: t for t in (vla.TASK, vqa.TASK)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {name!r}")
    return TASKS[name]

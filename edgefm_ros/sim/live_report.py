"""What sim_node reports of its LiveSim (live.py), without ROS: the diagnostics values and status line, and each
finished episode's result appended as a JSON line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from edgefm_ros.sim.live import LiveSim


def live_values(live: LiveSim, joint_names: Sequence[str]) -> dict[str, object]:
    """Episodes started, done and succeeded, commands applied, refused and stale; the current episode (index,
    task, seed, time slipped, longest physics gap) and the arm's state by joint name."""
    v: dict[str, object] = {"phase": live.phase, "episodes_started": live.count, "episodes_done": len(live.finished),
                            "successes": sum(r.outcome == "success" for r in live.finished),
                            "commands_applied": live.applied_total, "commands_rejected": live.rejected_total,
                            "commands_stale": live.stale_total}
    cur = live.current
    if cur is not None:
        v.update({"episode": cur.index, "task": cur.episode.task, "seed": cur.episode.seed,
                  "episode_slipped_s": cur.slipped_s, "episode_max_physics_gap_ms": cur.max_lag_s * 1e3})
        v.update({n: float(x) for n, x in zip(joint_names, live.env.state())})
    return v


def live_message(live: LiveSim) -> str:
    """The status line while no refused command is recent: done, the current episode and phase, or running."""
    if live.phase == "done":
        return f"done: {len(live.finished)} episodes"
    cur = live.current
    return f"episode {cur.index} ({cur.episode.key}) {live.phase}" if cur is not None else "running"


def append_result(path: str | Path, result: dict) -> None:
    """One JSON line appended to ``path`` (~ expanded, its folder made); OSError when it cannot be written."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(result) + "\n")

"""The simulated robot on the wall clock (sim_node's state, no ROS): a list of episodes run one after the
other, physics advanced to the current time on every update whether or not a command came (the robot does
not wait for its policy), commands checked before they reach the arm.

    live = LiveSim(env, tasks, episodes, LiveConfig(timeout_s=0.0, settle_s=0.5))
    events = live.update(now)             # physics thread, every few ms: advance, success / timeout / next
    live.command(names, positions, stamp, now)  # executor thread: the newest command, applied at the next update

Times are seconds on one clock (sim_node passes ROS time). Simulated time follows the wall clock 1:1 while
an episode runs; an update that comes late advances physics by the whole gap (at most ``max_catchup_s``;
beyond that the simulation slips, counted, and the real-time factor drops below 1).

Each episode's camera condition and instruction wording come from its seed (``LiveConfig.conditions``,
``phrasings``; sim.episode), as in the sync and async executors; ``camera(frames)`` applies the current
episode's condition to rendered frames before they are published.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from edgefm_ros.sim.conditions import CONDITION_SETS, ConditionedCamera, draw_condition
from edgefm_ros.sim.tasks import PHRASINGS, episode_instruction


@dataclass(frozen=True)
class Episode:
    task: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.task}:{self.seed}"


def parse_episode(text: str, tasks) -> Episode:
    """'task:seed' -> Episode; ValueError naming the bad item (unknown task, seed not an integer)."""
    task, sep, seed = text.strip().rpartition(":")
    if not sep or not task:
        raise ValueError(f"episode {text!r} is not 'task:seed'")
    if task not in tasks:
        raise ValueError(f"episode {text!r}: unknown task {task!r}; tasks: {sorted(tasks)}")
    try:
        s = int(seed)
    except ValueError:
        raise ValueError(f"episode {text!r}: seed {seed!r} is not an integer") from None
    if s < 0:
        raise ValueError(f"episode {text!r}: seed must be >= 0")
    return Episode(task, s)


@dataclass(frozen=True)
class LiveConfig:
    timeout_s: float = 0.0  # 0: the task's max_seconds
    settle_s: float = 0.5  # the arm holds this long after an episode ends
    start_delay_s: float = 0.0  # hold before the first episode
    wait_for_start: bool = False  # hold before the first episode until request(None)
    repeat: bool = False  # start over after the last episode
    max_catchup_s: float = 0.25  # the most physics one update advances; a longer gap slips
    command_guard_s: float = 0.0  # commands stamped less than this after an episode start are ignored
    joint_names: tuple[str, ...] = ("ee_x", "ee_y", "ee_z", "gripper")
    conditions: str = "clean"  # camera condition set (sim.conditions.CONDITION_SETS), drawn per episode
    phrasings: str = "canonical"  # instruction wording per episode (sim.tasks.episode_instruction)

    def __post_init__(self) -> None:
        if self.conditions not in CONDITION_SETS:
            raise ValueError(f"LiveConfig.conditions {self.conditions!r}: one of {sorted(CONDITION_SETS)}")
        if self.phrasings not in PHRASINGS:
            raise ValueError(f"LiveConfig.phrasings {self.phrasings!r}: one of {PHRASINGS}")
        for name in ("timeout_s", "settle_s", "start_delay_s", "command_guard_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"LiveConfig.{name} must be a number >= 0, got {v!r}")
        if not (self.max_catchup_s > 0 and math.isfinite(self.max_catchup_s)):
            raise ValueError(f"LiveConfig.max_catchup_s must be positive, got {self.max_catchup_s!r}")
        if len(self.joint_names) != 4 or len(set(self.joint_names)) != 4:
            raise ValueError(f"LiveConfig.joint_names {list(self.joint_names)} must be 4 distinct names")


def command_target(names: Sequence[str], positions: Sequence[float], joint_names: Sequence[str]) -> np.ndarray:
    """A command message's (names, positions) -> float64 (4,) target in ``joint_names`` order.

    ``names`` empty (Float64MultiArray): the positions are in ``joint_names`` order. ValueError naming the
    problem for unknown, missing or duplicate names, a wrong length and non-finite values."""
    p = np.asarray(list(positions), dtype=np.float64)
    want = tuple(joint_names)
    if len(names) == 0:
        if p.shape != (len(want),):
            raise ValueError(f"command holds {p.size} values, expected {len(want)} ({list(want)})")
        out = p
    else:
        names = tuple(names)
        if len(names) != p.size:
            raise ValueError(f"command names {list(names)} but {p.size} values")
        unknown = [n for n in names if n not in want]
        if unknown:
            raise ValueError(f"command names unknown joints {unknown}; joints: {list(want)}")
        if len(set(names)) != len(names):
            raise ValueError(f"command names duplicate joints: {list(names)}")
        missing = [n for n in want if n not in names]
        if missing:
            raise ValueError(f"command lacks joints {missing}")
        out = p[[names.index(n) for n in want]]
    bad = [n for n, x in zip(want, out) if not math.isfinite(x)]
    if bad:
        raise ValueError(f"command holds non-finite values for {bad}: {out.tolist()}")
    return out


@dataclass
class EpisodeRecord:
    """What happened in one episode (``result()`` is the JSON line sim_node writes)."""

    index: int
    episode: Episode
    instruction: str
    start: float  # clock time of the reset
    sim_start: float
    end: float = math.nan
    outcome: str = ""  # success | timeout | reset
    time_to_success_s: float = math.nan
    commands: int = 0  # applied
    rejected: int = 0  # refused (never reached the arm)
    stale: int = 0  # stamped before the episode started: ignored
    slipped_s: float = 0.0  # wall time physics could not keep up with
    max_lag_s: float = 0.0  # longest gap between two physics updates
    sim_end: float = math.nan
    condition: str = "clean"  # the camera condition of the episode

    def result(self) -> dict:
        wall = self.end - self.start
        sim = self.sim_end - self.sim_start
        return {"episode": self.index, "task": self.episode.task, "seed": self.episode.seed,
                "instruction": self.instruction, "condition": self.condition, "success": self.outcome == "success",
                "outcome": self.outcome,
                "time_to_success_s": self.time_to_success_s, "duration_s": wall, "sim_duration_s": sim,
                "real_time_factor": sim / wall if wall > 0 else math.nan, "slipped_s": self.slipped_s,
                "max_physics_gap_ms": self.max_lag_s * 1e3, "commands": self.commands,
                "rejected_commands": self.rejected, "stale_commands": self.stale, "start_time": self.start}


@dataclass
class _Pending:
    target: np.ndarray | None = None
    stamp: float = -math.inf


class LiveSim:
    """Episodes on the wall clock. Thread-safe: ``command``/``request`` from one thread, ``update`` from another."""

    def __init__(self, env, tasks: Mapping[str, object], episodes: Sequence[Episode], cfg: LiveConfig,
                 clock: Callable[[], float] | None = None):
        if not episodes:
            raise ValueError("LiveSim needs at least one episode")
        unknown = [e.task for e in episodes if e.task not in tasks]
        if unknown:
            raise ValueError(f"unknown tasks {unknown}; tasks: {sorted(tasks)}")
        self.env, self.tasks, self.episodes, self.cfg = env, tasks, tuple(episodes), cfg
        self.clock = clock  # read again after a reset (which may take a while): the episode starts then
        self.lock = threading.Lock()
        self.phase = "waiting"  # waiting (holding between episodes) | running | done
        self.next_index = 0  # position in the episode list
        self.count = 0  # episodes started
        self.current: EpisodeRecord | None = None
        self.finished: list[EpisodeRecord] = []
        self._wait_until = math.nan
        self._requested: Episode | None = None
        self._end_requested = False
        self._pending = _Pending()
        self._last_update = math.nan
        self._wall_ref = math.nan  # clock time of the reset (moved on by what slipped)
        self._asked = 0.0  # seconds of physics asked of the simulator since the reset
        self.rejected_total = 0
        self.last_rejection = ""
        self.applied_total = 0
        self.stale_total = 0
        self._camera: ConditionedCamera | None = None  # the current episode's condition (physics thread)

    def camera(self, frames: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rendered frames {camera: uint8 [H, W, 3]} as the current episode's camera delivers them (its
        condition applied; unchanged before the first episode). Call from the physics thread."""
        return dict(frames) if self._camera is None else self._camera(frames)

    # inputs (executor thread) --------------------------------------------------------------------------------
    def command(self, names: Sequence[str], positions: Sequence[float], stamp: float, now: float) -> bool:
        """Keep the newest valid command for the next update; False (counted, reason kept) when refused."""
        try:
            target = command_target(names, positions, self.cfg.joint_names)
        except ValueError as e:
            self.refuse(str(e))
            return False
        stamp = stamp if stamp > 0 else now
        with self.lock:
            cur = self.current
            if cur is None or self.phase != "running" or stamp < cur.start + self.cfg.command_guard_s:
                self.stale_total += 1
                if cur is not None:
                    cur.stale += 1
                return False
            if stamp >= self._pending.stamp:
                self._pending = _Pending(target.astype(np.float32), stamp)
        return True

    def refuse(self, reason: str) -> None:
        """Count a command that cannot be used (malformed message); the arm keeps its target."""
        with self.lock:
            self.rejected_total += 1
            self.last_rejection = reason
            if self.current is not None:
                self.current.rejected += 1

    def request(self, episode: Episode | None) -> None:
        """Start ``episode`` now, or (None) end the current one as 'reset' and go on with the list (between
        episodes: start the next one now)."""
        with self.lock:
            if episode is not None:
                if episode.task not in self.tasks:
                    raise ValueError(f"unknown task {episode.task!r}; tasks: {sorted(self.tasks)}")
                self._requested = episode
            else:
                self._end_requested = True

    # physics (one thread) ------------------------------------------------------------------------------------
    def update(self, now: float) -> list[dict]:
        """Advance to ``now``; returns the events that happened (dicts: event, episode, task, seed, t, ...)."""
        events: list[dict] = []
        with self.lock:
            requested, self._requested = self._requested, None
            end_requested, self._end_requested = self._end_requested, False
            pending, self._pending = self._pending, _Pending()
        if math.isnan(self._wait_until):  # the first update: the start delay counts from here
            self._wait_until = math.inf if self.cfg.wait_for_start else now + self.cfg.start_delay_s
        if end_requested and self.phase == "waiting":  # between episodes: the next one starts now
            self._wait_until = now
        if requested is not None:
            if self.phase == "running":
                events.append(self._finish("reset", now))
            events.append(self._start(requested, now))
            return events
        if self.phase == "running":
            if pending.target is not None:
                self.env.set_command(pending.target)
                self.current.commands += 1
                self.applied_total += 1
            self._advance(now)
            cur = self.current
            if self.env.success():
                cur.time_to_success_s = now - cur.start
                events.append(self._finish("success", now))
            elif end_requested:
                events.append(self._finish("reset", now))
            elif now - cur.start >= self._timeout(cur.episode):
                events.append(self._finish("timeout", now))
            return events
        self._hold(now)
        if self.phase == "waiting" and now >= self._wait_until:
            if self.next_index >= len(self.episodes):
                if not self.cfg.repeat:
                    self.phase = "done"
                    return [{"event": "done", "t": now, "episodes": self.count}]
                self.next_index = 0
            ep = self.episodes[self.next_index]
            self.next_index += 1
            events.append(self._start(ep, now))
        return events

    def _timeout(self, ep: Episode) -> float:
        return self.cfg.timeout_s or float(getattr(self.tasks[ep.task], "max_seconds"))

    def _start(self, ep: Episode, now: float) -> dict:
        self.env.reset(ep.task, ep.seed)
        if self.clock is not None:
            now = self.clock()
        if self.cfg.phrasings == "canonical":
            instruction = str(getattr(self.tasks[ep.task], "instruction"))
        else:
            instruction = episode_instruction(ep.task, ep.seed, self.cfg.phrasings)
        condition = draw_condition(self.cfg.conditions, ep.task, ep.seed)
        self._camera = ConditionedCamera(condition, ep.seed)
        with self.lock:
            self.current = EpisodeRecord(self.count, ep, instruction, now, float(self.env.sim_time),
                                         condition=condition.name)
            self._pending = _Pending()
        self.count += 1
        self.phase = "running"
        self._wall_ref, self._asked = now, 0.0
        self._last_update = now
        return {"event": "start", "t": now, "episode": self.current.index, "task": ep.task, "seed": ep.seed,
                "instruction": instruction, "condition": condition.name}

    def _finish(self, outcome: str, now: float) -> dict:
        cur = self.current
        cur.outcome, cur.end, cur.sim_end = outcome, now, float(self.env.sim_time)
        self.finished.append(cur)
        self.phase = "waiting"
        self._wait_until = now + self.cfg.settle_s
        ev = {"event": outcome, "t": now, "episode": cur.index, "task": cur.episode.task, "seed": cur.episode.seed,
              "instruction": cur.instruction, "elapsed_s": now - cur.start}
        if outcome == "success":
            ev["time_to_success_s"] = cur.time_to_success_s
        return ev

    def _advance(self, now: float) -> None:
        """Physics to the wall clock: seconds asked of the simulator since the reset = now - wall_ref (the
        simulator runs whole ticks and carries the remainder, so its sim_time trails by less than a tick)."""
        cur = self.current
        gap = now - self._last_update
        if gap > cur.max_lag_s:
            cur.max_lag_s = gap
        self._last_update = now
        cur.slipped_s += self._catch_up(now)

    def _catch_up(self, now: float) -> float:
        """Advance by the time behind (at most max_catchup_s); returns the seconds that slipped."""
        behind = (now - self._wall_ref) - self._asked
        slip = 0.0
        if behind > self.cfg.max_catchup_s:
            slip = behind - self.cfg.max_catchup_s
            self._wall_ref += slip
            behind = self.cfg.max_catchup_s
        if behind > 0:
            self.env.advance(behind)
            self._asked += behind
        return slip

    def _hold(self, now: float) -> None:
        """Between episodes the arm holds its last command: physics goes on (the video shows the end)."""
        if self.phase == "waiting" and self.current is not None:
            self._catch_up(now)

    @property
    def episode(self) -> EpisodeRecord | None:
        return self.current

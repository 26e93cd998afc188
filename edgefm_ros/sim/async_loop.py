"""The asynchronous closed loop in simulated time (no ROS): the robot keeps executing while a chunk is computed.

    r = run_async_episode(env, engine, "reach", 1000, aggregate="rtc", latency_s=0.25)

What the ROS graph does (action_node's queue, vla_node's chunk requests, real-time chunking), with the
same control/ code, but on the simulator's clock: a chunk requested at tick k from the observation of
tick k arrives ``latency_s`` later (inference + any injected delay), meanwhile the queue keeps commanding.
So the comparison of aggregations against latency does not depend on how busy the machine is; the ROS
graph (``--exec ros``) measures the same with real timing.

Per tick: the chunk in flight is merged when its time has come (ActionQueue: rows already past are
skipped, overlap aggregated, or replaced for ``rtc``), the tick's action is commanded (the last one held
when the queue is empty), then, when the queue asks for a chunk (queue_state, ``threshold``) and none is
in flight, the next is started. With ``aggregate="rtc"`` the new chunk's denoising is guided toward the
last chunk's actions from the observation on (ChunkContinuation), with the delay estimated in ticks.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from edgefm_ros.control.queue import ActionQueue, TickGrid
from edgefm_ros.control.request import queue_state
from edgefm_ros.runtime.engine import Engine
from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.episode import episode_setup
from edgefm_ros.sim.report import make_report
from edgefm_ros.sim.rollout import EpisodeResult, checkpoint_settings, checkpoint_tasks
from edgefm_ros.sim.tasks import get_task, parse_tasks
from edgefm_ros.sim.tiers import EngineTier, EpisodeServing, RtcState

_EPS = 1e-9


def run_async_episode(env: SimEnv, engine, task: str, seed: int, *, aggregate: str, latency_s: float,
                      threshold: float = 0.5, max_seconds: float | None = None,
                      cameras: Sequence[str] = ("scene", "wrist"), conditions: str = "clean",
                      phrasings: str = "canonical", restamp_held: bool = True) -> EpisodeResult:
    """One episode; commands and chunk boundaries as in the sync loop (a boundary: the first tick commanded
    from a new chunk). ``aggregate="rtc"`` turns real-time chunking on in the policy too. ``conditions`` /
    ``phrasings``: the episode's camera condition and instruction from its seed, as in the sync loop."""
    if not (latency_s >= 0 and math.isfinite(latency_s)):
        raise ValueError(f"latency_s must be finite and >= 0, got {latency_s!r}")
    return run_served_episode(env, EngineTier("edge", engine, latency_s), task, seed, aggregate=aggregate,
                              threshold=threshold, max_seconds=max_seconds, cameras=cameras,
                              conditions=conditions, phrasings=phrasings, restamp_held=restamp_held)


def run_served_episode(env: SimEnv, tier, task: str, seed: int, *, aggregate: str, threshold: float = 0.5,
                       max_seconds: float | None = None, cameras: Sequence[str] = ("scene", "wrist"),
                       conditions: str = "clean", phrasings: str = "canonical",
                       serving: EpisodeServing | None = None, on_request=None,
                       restamp_held: bool = True) -> EpisodeResult:
    """One episode whose chunks come from ``tier`` (sim.tiers: one model at one placement, or a chooser among
    them), each arriving its ``Served.latency_s`` after the observation. ``serving``: filled with what each
    request went where; ``on_request(images, state, instruction, now, rtc)``: called before each request
    (shadow logging) and may return the request's feature vector for ``serving``. ``restamp_held``: a chunk
    requested while the arm holds starts at its arrival (False: at its observation, rows of the wait skipped)."""
    spec = get_task(task)
    setup = episode_setup(task, seed, conditions, phrasings)
    camera = setup.camera()
    limit = spec.max_seconds if max_seconds is None else max_seconds
    env.reset(task, seed)
    rng = np.random.default_rng(seed)  # the noise of a seed's chunks, whatever ran before
    dt = 1.0 / env.config.control_hz
    tier.start(dt, seed)
    keys = {c: f"observation.images.{c}" for c in cameras}
    queue = ActionQueue(TickGrid(0.0, dt), aggregate)
    rtc = RtcState() if aggregate == "rtc" else None
    pending = None  # (ready time, actions [C, action_dim], stamp, seq)
    chunk_ticks, seq, last_seq = 0, 0, -1
    commands: list[np.ndarray] = []
    boundaries: list[int] = []
    inference: list[float] = []
    last_cmd = None
    t_success = math.nan
    k = 0
    while k * dt < limit - _EPS:
        now = k * dt
        if pending is not None and pending[0] <= now + _EPS:
            _, actions, stamp, s = pending
            r = queue.merge(actions[:, :4], stamp, dt, now, s)
            if r.scheduled:
                chunk_ticks = actions.shape[0]  # rows are one tick apart
                if rtc is not None:
                    rtc.last = (np.asarray(actions, dtype=np.float32).copy(), float(stamp), float(dt))
            pending = None
        item = queue.pop(k)
        if item is not None:
            cmd, s = item
            if s != last_seq:
                boundaries.append(len(commands))
                last_seq = s
            last_cmd = cmd
        if last_cmd is not None:
            env.set_command(last_cmd)
            commands.append(np.asarray(last_cmd, dtype=np.float32))
        qs = queue_state(len(queue), chunk_ticks, threshold)
        if pending is None and (qs.request_chunk or qs.must_go):
            images = {keys[c]: img for c, img in camera(env.render()).items()}
            state = env.state().astype(np.float32)
            if rtc is not None and qs.must_go:
                rtc.last = None  # holding: nothing of the last chunk runs
            feats = on_request(images, state, setup.instruction, now, rtc) if on_request is not None else None
            t0 = time.perf_counter()
            served = tier.serve(images, state, setup.instruction, rng, now, rtc, dt)
            inference.append(time.perf_counter() - t0)
            if serving is not None:
                serving.add(served, () if feats is None else feats)
            seq += 1
            # a chunk asked for while the arm holds (nothing queued) plans from where it stands, and it stands
            # there until the chunk arrives: it starts at its arrival, row 0 first (else the rows of the wait
            # would be skipped as past, and the arm jump to where the plan expected it by then)
            stamp = now + served.latency_s if qs.must_go and restamp_held else now
            pending = (now + served.latency_s, served.actions, stamp, seq)
        env.advance(dt)
        k += 1
        if env.success():
            t_success = env.sim_time
            break
    return EpisodeResult(task, int(seed), not math.isnan(t_success), t_success,
                         np.asarray(commands, dtype=np.float32).reshape(-1, 4), tuple(boundaries), inference,
                         setup.condition.name, setup.instruction)


def run_async_eval(checkpoint: str, tasks: str | Sequence[str] | None, seeds: Sequence[int], *,
                   aggregate: str = "weighted_average", delay_ms: float = 0.0, compute_ms: float = 50.0,
                   threshold: float = 0.5, max_seconds: float | None = None, vlm_dir: str | None = None,
                   log=print, engine_mode: str = "exact", conditions: str = "clean", phrasings: str = "canonical",
                   image_hw: tuple[int, int] | None = None) -> dict:
    """``edgefm-sim eval --exec async``: every task x seed with chunks arriving ``compute_ms + delay_ms``
    (simulated) after their observation; the shared report, with the smoothness of the commands.
    ``conditions``, ``phrasings``, ``image_hw``: as run_sync_eval's."""
    st = checkpoint_settings(checkpoint)
    names = parse_tasks(tasks) if isinstance(tasks, str) else list(tasks or checkpoint_tasks(checkpoint))
    sim = SimConfig(image_hw=tuple(image_hw or st["image_hw"]), cameras=st["cameras"])
    engine = Engine.from_checkpoint(checkpoint, vlm_dir=vlm_dir, mode=engine_mode)
    latency_s = (compute_ms + delay_ms) / 1e3
    outcomes, wall = [], []
    t0 = time.perf_counter()
    total = len(names) * len(seeds)
    with SimEnv(sim) as env:
        for i, (seed, task) in enumerate((s, t) for s in seeds for t in names):
            r = run_async_episode(env, engine, task, seed, aggregate=aggregate, latency_s=latency_s,
                                  threshold=threshold, max_seconds=max_seconds, cameras=sim.cameras,
                                  conditions=conditions, phrasings=phrasings)
            outcomes.append(r.outcome())
            wall.extend(r.inference_s)
            log(f"[eval async {aggregate} {latency_s * 1e3:.0f} ms] {i + 1}/{total} {task}:{seed} [{r.condition}] "
                f"{'success' if r.success else 'fail'}" + (f" in {r.time_to_success_s:.2f} s" if r.success else "")
                + f" ({len(r.boundaries)} chunks, {time.perf_counter() - t0:.0f} s elapsed)")
    settings = {"seeds": ",".join(map(str, seeds)), "aggregate": aggregate, "delay_ms": delay_ms,
                "compute_ms": compute_ms, "latency_ms": latency_s * 1e3, "chunk_size_threshold": threshold,
                "engine_mode": engine_mode, "conditions": conditions, "phrasings": phrasings,
                "image_hw": list(sim.image_hw),
                "clock": "simulated: chunks arrive latency_ms after their observation, the arm keeps executing"}
    timing = {"policy_wall_ms": {"p50": float(np.percentile(np.asarray(wall) * 1e3, 50)), "count": len(wall)}}
    return make_report(outcomes, exec_mode="async-sim", checkpoint=str(checkpoint), control_hz=sim.control_hz,
                       timing=timing, settings=settings)

"""Where a chunk is computed: on the edge engine, or on the cloud (a RemotePolicy) with a fallback to the
edge, and in shadow mode (shadow.py) also on the other placement; real-time chunking's prefix and delay go
the same way to each. vla_node gathers the observation, the route decision and the queue state, calls this,
publishes what it returns and reports diagnostics.

    placer = Placement(engine, PlacementConfig(dt=0.1, cloud_deadline_s=0.25), rtc=continuation, shadow=shadow)
    # or, from vla_node's parameters: vla_build.make_placement(engine, cfg, run_id, lat, log)
    out = placer.compute(obs, decision, seq, remote, queue_empty)  # Rejected: the model refused obs
    # out is None when ``active()`` turned False before the edge ran (stopping: no fallback)
    ... publish out.chunk as out.source ("edge", "cloud" or "edge-fallback"), stamped by the caller ...
    placer.published(out, chunk_sent, latency_s)  # RTC bookkeeping, then the shadow run of the other placement

Rules (as they were in vla_node): a decision routed to the cloud calls ``remote.predict`` within
``cloud_deadline_s``; an exception, a late answer or a chunk of the wrong action_dim falls back to the edge
(source "edge-fallback"). A shadowed request (``shadow.wants(decision)``) draws its flow-matching noise first
and uses it on both placements; after publishing, the placement that did not serve runs on the same
observation, noise and RTC request (the cloud with raw images: the best reference) and both runs are given
to ``shadow.record``. A fallback logs the failed cloud run as the pair at once (no second edge run).
Latencies go to ``lat`` (prefill, decode, compute: served chunks; cloud_call: every successful cloud call).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from edgefm_ros.cloud.images import Encoding
from edgefm_ros.control.rtc import ChunkContinuation, RtcRequest
from edgefm_ros.control.stats import RollingStats
from edgefm_ros.placement.runs import PlacementRun
from edgefm_ros.placement.shadow import ShadowSink
from edgefm_ros.types import ActionChunk, Observation, RouteDecision

LAT_KEYS = ("prefill", "decode", "compute", "cloud_call")


@dataclass(frozen=True)
class PlacementConfig:
    dt: float  # control period (s): the chunk's row spacing
    cloud_deadline_s: float  # time budget of a cloud call (s)
    run_id: str = "run"  # shadow log request ids: <run_id>-<seq>

    def __post_init__(self) -> None:
        if not (math.isfinite(self.dt) and self.dt > 0):
            raise ValueError(f"PlacementConfig.dt must be > 0, got {self.dt!r}")
        if not (math.isfinite(self.cloud_deadline_s) and self.cloud_deadline_s > 0):
            raise ValueError(f"PlacementConfig.cloud_deadline_s must be > 0, got {self.cloud_deadline_s!r}")


class Rejected(Exception):
    """The edge model refused the observation (the engine's ValueError); the caller refuses the request."""


@dataclass(frozen=True)
class Computed:
    """A chunk and what the shadow run after publishing needs."""

    chunk: ActionChunk  # as the placement returned it
    source: str  # "edge" | "cloud" | "edge-fallback"
    served: PlacementRun
    obs: Observation
    decision: RouteDecision | None
    seq: int
    rtc: RtcRequest | None  # the prefix and delay it was computed with
    noise: np.ndarray | None  # f32 (chunk_size, max_action_dim): shadowed requests only
    remote: object | None  # the RemotePolicy asked (or None)

    @property
    def shadowed(self) -> bool:
        return self.noise is not None


def _log_nothing(kind: str, message: str) -> None:
    pass


def rtc_kwargs(rtc: RtcRequest | None) -> dict:
    """predict's real-time-chunking keywords, the same for the engine and the remote policy ({} when off)."""
    return {} if rtc is None else {"rtc_prefix": rtc.prefix, "rtc_delay": rtc.delay}


class Placement:
    """Runs a request on the edge or the cloud, with fallback, shadow runs and RTC (module docstring).

    ``log(kind, message)``: kind "cloud_failed", "shadow_failed" (warnings) or "shadow_log" (an error);
    ``lat``: latency statistics by LAT_KEYS (the caller's, so they outlive this object)."""

    def __init__(self, engine, cfg: PlacementConfig, *, rtc: ChunkContinuation | None = None,
                 shadow: ShadowSink | None = None, lat: dict[str, RollingStats] | None = None,
                 log: Callable[[str, str], None] = _log_nothing):
        self.engine, self.cfg, self.rtc, self.shadow, self.log = engine, cfg, rtc, shadow, log
        self.lat = lat if lat is not None else {k: RollingStats() for k in LAT_KEYS}
        self.rtc_chunks = 0  # chunks published with a real-time-chunking prefix
        self.last_rtc: RtcRequest | None = None
        self.rtc_estimate = (float("nan"), 0)  # (latency s, delay ticks) after the last published chunk

    # the request -----------------------------------------------------------------------------------------
    def rtc_request(self, stamp: float, queue_empty: bool) -> RtcRequest | None:
        """The prefix (the last chunk's actions from ``stamp`` on) and the delay estimate; None when RTC is off
        or there is nothing to continue (an empty queue: the robot holds, it executes nothing of it)."""
        if self.rtc is None:
            return None
        if queue_empty:
            self.rtc.reset()
        self.last_rtc = self.rtc.request(stamp, self.cfg.dt)
        return self.last_rtc

    def compute(self, obs: Observation, decision: RouteDecision | None, seq: int, remote=None,
                queue_empty: bool = False, active: Callable[[], bool] = lambda: True) -> Computed | None:
        """The chunk for ``obs`` where ``decision`` says (None: the edge). Raises Rejected when the edge model
        refuses the observation; None when ``active()`` is False before the edge would run."""
        rtc = self.rtc_request(obs.stamp, queue_empty)
        shadowed = self.shadow is not None and self.shadow.wants(decision)
        spec = self.engine.spec
        noise = self.shadow.noise((spec.chunk_size, spec.max_action_dim)) if shadowed else None
        chunk, source, served = None, "edge", None
        if decision is not None and decision.target == "cloud":
            t0 = time.perf_counter()
            try:
                chunk, served = self._call_cloud(remote, obs, decision.params, seq, noise, rtc)
                source = "cloud"
                self.lat["compute"].add(served.latency_s)
            except Exception as e:
                self.log("cloud_failed", f"cloud failed, running on the edge: {e}")
                source, served = "edge-fallback", PlacementRun("cloud", None, time.perf_counter() - t0)
        if chunk is None:
            if not active():
                return None  # stopping: no edge fallback for a cloud call cut short
            try:
                chunk, served = self._edge(obs, seq, source, noise, rtc)
            except ValueError as e:
                raise Rejected(str(e)) from e
        return Computed(chunk, source, served, obs, decision, seq, rtc, noise, remote)

    def _edge(self, obs: Observation, seq: int, source: str, noise, rtc: RtcRequest | None,
              served: bool = True) -> tuple[ActionChunk, PlacementRun]:
        """The engine's chunk (ValueError when the model rejects the observation) and its run record;
        the latency statistics count served chunks only."""
        t0 = time.perf_counter()
        chunk = self.engine.predict(obs, noise=noise, dt=self.cfg.dt, seq=seq, source=source, **rtc_kwargs(rtc))
        took = time.perf_counter() - t0
        if served:
            tm = self.engine.last_timings
            self.lat["prefill"].add(tm.prefill_s)
            self.lat["decode"].add(tm.decode_s)
            self.lat["compute"].add(tm.total_s)
        return chunk, PlacementRun("edge", chunk.actions, took)

    def _call_cloud(self, remote, obs: Observation, params: dict, seq: int, noise,
                    rtc: RtcRequest | None) -> tuple[ActionChunk, PlacementRun]:
        """The remote policy's chunk within cloud_deadline_s, or an exception saying why not. ``params``: the
        RouteDecision's encoding choice ({}: raw at the captured resolution)."""
        if remote is None:
            raise RuntimeError("no cloud client")
        deadline = self.cfg.cloud_deadline_s
        encoding = Encoding.from_params(params)
        t0 = time.perf_counter()
        chunk = remote.predict(obs, deadline, encoding=encoding, seq=seq, dt=self.cfg.dt, noise=noise,
                               **rtc_kwargs(rtc))
        took = time.perf_counter() - t0
        if took > deadline:
            raise TimeoutError(f"cloud answered after {took:.3f}s (deadline {deadline:g}s)")
        if chunk.action_dim != self.engine.spec.action_dim:
            raise ValueError(f"cloud chunk has action_dim {chunk.action_dim}, expected {self.engine.spec.action_dim}")
        self.lat["cloud_call"].add(took)
        last = getattr(remote, "last", None)
        upload = int(getattr(last, "upload_bytes", 0)) if last is not None else 0
        return chunk, PlacementRun("cloud", chunk.actions, took, upload)

    # after publishing ------------------------------------------------------------------------------------
    def published(self, out: Computed, sent: ActionChunk, latency_s: float) -> None:
        """``sent`` (out.chunk as published: stamp and dt set) went out ``latency_s`` after its observation:
        RTC continues it and learns the latency; then the shadow run, if the request was shadowed."""
        if self.rtc is not None:
            self.rtc.sent(sent.actions, sent.stamp, sent.dt)
            self.rtc.measured(latency_s)
            self.rtc_chunks += out.rtc is not None
            self.rtc_estimate = (self.rtc.delay.latency_s(), self.rtc.delay.ticks())
        if out.shadowed:
            self._shadow_other(out)

    def _shadow_other(self, out: Computed) -> None:
        """The placement that did not serve, same observation, noise and RTC request; both logged. A failed
        cloud run (served or shadow) leaves no reference: shadow.record counts it and logs nothing."""
        served, decision = out.served, out.decision
        if served.placement == "edge" and decision.target == "cloud":  # a fallback: the cloud run failed
            return self._record(out, PlacementRun("cloud", None, 0.0))
        other_placement = "cloud" if served.placement == "edge" else "edge"
        try:
            if other_placement == "cloud":
                other = self._call_cloud(out.remote, out.obs, {}, out.seq, out.noise, out.rtc)[1]  # raw images
            else:
                other = self._edge(out.obs, out.seq, "edge", out.noise, out.rtc, served=False)[1]
        except Exception as e:
            self.log("shadow_failed", f"shadow run on the {other_placement} failed: {e}")
            other = PlacementRun(other_placement, None, 0.0)
        self._record(out, other)

    def _record(self, out: Computed, other: PlacementRun) -> None:
        try:
            self.shadow.record(f"{self.cfg.run_id}-{out.seq}", out.decision, out.served, other)
        except (ValueError, OSError) as e:
            self.shadow.skipped["log_error"] += 1
            self.log("shadow_log", f"shadow log: {e}")

    # reporting and closing -------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        """Diagnostics values: shadow mode's (when on), then real-time chunking's (when on): chunks published
        with a prefix, the last request's delay and prefix rows, the estimate after the last published chunk."""
        v: dict[str, object] = dict(self.shadow.stats()) if self.shadow is not None else {}
        if self.rtc is not None:
            r = self.last_rtc
            v.update({"rtc_chunks": self.rtc_chunks, "rtc_delay_ticks": r.delay if r is not None else 0,
                      "rtc_prefix_rows": r.prefix.shape[0] if r is not None else 0,
                      "rtc_latency_estimate_ms": self.rtc_estimate[0] * 1e3,
                      "rtc_delay_estimate_ticks": self.rtc_estimate[1]})
        return v

    def close(self) -> None:
        """Shadow mode's log closed (no request is shadowed after this)."""
        if self.shadow is not None:
            self.shadow.close()
            self.shadow = None


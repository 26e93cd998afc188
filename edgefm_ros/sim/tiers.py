"""Where a chunk is computed in the simulated closed loop, and how long it takes on the simulator's clock.

    edge = EngineTier("edge", edge_engine, compute_s=0.03)
    cloud = EngineTier("cloud", cloud_engine, compute_s=0.06, link=Link(20.0, 40.0), jpeg_quality=90)
    served = cloud.serve(images, state, instruction, rng, now, rtc, dt)   # Served(actions, latency_s, ...)

A tier is one model at one placement. ``EngineTier`` runs our Engine in this process and charges its
``compute_s`` (measured on this machine by ``measure_compute_s``); a cloud tier also charges the link: the
images go JPEG-encoded at ``jpeg_quality`` (the model sees the decoded images, as the server would), and the
latency adds the round trip and the upload at the link's rate. Chooser tiers (``RouterTier``,
``RandomTier``) pick one of their tiers per request. Every tier keeps its own delay estimate, so real-time
chunking asks each placement for the delay it will take; the continuation (the last chunk's actions still
ahead) is cut to the serving model's chunk length, so a switch of placement continues the same motion.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import cv2
import numpy as np

from edgefm_ros.control.delay import DelayConfig, DelayEstimator
from edgefm_ros.control.rtc import continuation
from edgefm_ros.routing.link import LinkSnapshot
from edgefm_ros.routing.router import Router
from edgefm_ros.types import Observation


@dataclass(frozen=True)
class Link:
    """The robot's uplink: rate (Mbit/s) and round-trip time (ms)."""

    mbps: float = 20.0
    rtt_ms: float = 40.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mbps) and self.mbps > 0):
            raise ValueError(f"link rate must be a finite number of Mbit/s > 0, got {self.mbps!r}")
        if not (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0):
            raise ValueError(f"link round trip must be a finite number of ms >= 0, got {self.rtt_ms!r}")

    @classmethod
    def parse(cls, text: str) -> "Link":
        """``"MBPS,RTT_MS"`` (``--link``); ValueError naming the text."""
        parts = text.split(",")
        try:
            if len(parts) != 2:
                raise ValueError
            return cls(float(parts[0]), float(parts[1]))
        except ValueError as e:
            raise ValueError(f"--link {text!r}: expected MBPS,RTT_MS with MBPS > 0 and RTT_MS >= 0"
                             + (f" ({e})" if str(e) else "")) from None

    def transfer_s(self, nbytes: int) -> float:
        return self.rtt_ms / 1e3 + nbytes * 8.0 / (self.mbps * 1e6)

    def snapshot(self) -> LinkSnapshot:
        """What a converged link estimator reports about this link."""
        return LinkSnapshot(bandwidth_mbps=self.mbps, rtt_s=self.rtt_ms / 1e3, breaker_open=False, age_s=0.0)


@dataclass
class Served:
    actions: np.ndarray  # [C, action_dim] f64, raw units
    latency_s: float  # observation -> chunk at the robot, simulated
    placement: str  # "edge" | "cloud"
    upload_bytes: int = 0
    decision: object | None = None  # the RouteDecision of a routed request


@dataclass
class RtcState:
    """The last chunk the robot received (for real-time chunking): actions, stamp and row period."""

    last: tuple[np.ndarray, float, float] | None = None

    def prefix(self, now: float, dt: float, rows: int) -> np.ndarray | None:
        return None if self.last is None else continuation(*self.last, now, dt, rows)


def jpeg_roundtrip(images: Mapping[str, np.ndarray], quality: int) -> tuple[dict[str, np.ndarray], int]:
    """(images as decoded from JPEG at ``quality``, total encoded bytes); quality 0: raw RGB bytes."""
    if quality == 0:
        return dict(images), int(sum(img.nbytes for img in images.values()))
    out, total = {}, 0
    for k, img in images.items():
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise ValueError(f"camera {k!r}: JPEG encoding failed")
        total += int(buf.size)
        out[k] = cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return out, total


class EngineTier:
    """One model at one placement (``"edge"``, or ``"cloud"`` with a ``link``)."""

    def __init__(self, placement: str, engine, compute_s: float, *, link: Link | None = None,
                 jpeg_quality: int = 90, extra_delay_s: float = 0.0):
        if placement not in ("edge", "cloud"):
            raise ValueError(f"placement must be 'edge' or 'cloud', got {placement!r}")
        if placement == "cloud" and link is None:
            raise ValueError("a cloud tier needs a link")
        if not (math.isfinite(compute_s) and compute_s >= 0):
            raise ValueError(f"compute_s must be finite and >= 0, got {compute_s!r}")
        if not (isinstance(jpeg_quality, int) and 0 <= jpeg_quality <= 100):
            raise ValueError(f"jpeg_quality must be an integer in [0, 100], got {jpeg_quality!r}")
        self.placement, self.engine, self.compute_s = placement, engine, float(compute_s)
        self.link, self.jpeg_quality, self.extra_delay_s = link, jpeg_quality, float(extra_delay_s)
        spec = engine.spec
        self.chunk_size, self.noise_shape = spec.chunk_size, (spec.chunk_size, spec.max_action_dim)
        self.camera_keys = tuple(spec.camera_keys)
        self.delay: DelayEstimator | None = None

    @property
    def max_rows(self) -> int:
        return self.chunk_size

    def start(self, dt: float, seed: int = 0) -> None:
        """A new episode: a fresh delay estimate, holding the tier's nominal latency (compute, and for the cloud
        the round trip) until it measures its own, so that a first request here after the other placement
        served is continued with a delay too."""
        self.delay = DelayEstimator(DelayConfig(warmup=0, max_ticks=self.chunk_size), dt)
        self.delay.add(self.compute_s + self.extra_delay_s + (self.link.rtt_ms / 1e3 if self.link else 0.0))

    def predict(self, images, state, instruction, rng: np.random.Generator, now: float, rtc: RtcState | None,
                dt: float) -> np.ndarray:
        obs = Observation({k: v for k, v in images.items() if k in self.camera_keys}, state, instruction, stamp=now)
        prefix = None if rtc is None else rtc.prefix(now, dt, self.chunk_size)
        noise = rng.standard_normal(self.noise_shape).astype(np.float32)
        chunk = self.engine.predict(obs, noise=noise, dt=dt, rtc_prefix=prefix,
                                    rtc_delay=0 if prefix is None else self.delay.ticks())
        return np.asarray(chunk.actions, dtype=np.float64)

    def serve(self, images: Mapping[str, np.ndarray], state: np.ndarray, instruction: str,
              rng: np.random.Generator, now: float, rtc: RtcState | None, dt: float, extra_s: float = 0.0) -> Served:
        """``extra_s``: more time charged before the chunk arrives (a chooser's decision)."""
        nbytes = 0
        latency = self.compute_s + self.extra_delay_s + extra_s
        if self.placement == "cloud":
            images, nbytes = jpeg_roundtrip(images, self.jpeg_quality)
            latency += self.link.transfer_s(nbytes)
        actions = self.predict(images, state, instruction, rng, now, rtc, dt)
        self.delay.add(latency)
        return Served(actions, latency, self.placement, nbytes)


def chunk_spread(a: np.ndarray, b: np.ndarray, dims: int = 3) -> float:
    """How far two draws of a chunk disagree: RMS distance of their first ``dims`` action columns (m)."""
    d = np.asarray(a, dtype=np.float64)[:, :dims] - np.asarray(b, dtype=np.float64)[:, :dims]
    return float(np.sqrt(np.mean(np.sum(d * d, axis=1))))


class ChooserTier:
    """Chooses per request between an edge and a cloud tier; a new episode starts both, and a generator of the
    chooser's own seeded by the episode (``self.own``), apart from the one the served chunks' noise comes from."""

    salt = 0

    def __init__(self, edge: EngineTier, cloud: EngineTier, placement: str):
        self.edge, self.cloud, self.placement = edge, cloud, placement
        self.own = np.random.default_rng([0, self.salt])

    @property
    def max_rows(self) -> int:
        return max(self.edge.chunk_size, self.cloud.chunk_size)

    def start(self, dt: float, seed: int = 0) -> None:
        self.edge.start(dt)
        self.cloud.start(dt)
        self.own = np.random.default_rng([seed, self.salt])


class RouterTier(ChooserTier):
    """The router decides each request between an edge and a cloud tier, from the request's images and
    instruction and, when its configuration names ``edge_spread``, from two draws of the edge's chunk.

    ``decision_s``: the features' cost on the clock. The two draws are charged (2 x the edge's compute) before
    the decision; when the edge serves, its answer is charged nothing more, as a robot reusing the first draw
    would. The draws take their noise from a generator of their own, so the chunk that is served has the noise
    the same request would get under edge-only or cloud-only: the placements differ by their choices alone."""

    salt = 0x5EED

    def __init__(self, router: Router, edge: EngineTier, cloud: EngineTier, *, decision_s: float = 0.0):
        unknown = sorted(set(router.cfg.features.signals) - {"edge_spread"})
        if unknown:
            raise ValueError(f"router config names signal(s) {unknown} the simulator cannot measure "
                             "(it knows 'edge_spread')")
        super().__init__(edge, cloud, "router")
        self.router, self.decision_s = router, float(decision_s)

    def serve(self, images, state, instruction, rng, now, rtc, dt) -> Served:
        signals, extra = {}, 0.0
        if "edge_spread" in self.router.cfg.features.signals:
            a = self.edge.predict(images, state, instruction, self.own, now, rtc, dt)
            b = self.edge.predict(images, state, instruction, self.own, now, rtc, dt)
            signals["edge_spread"] = chunk_spread(a, b)
            extra = 2 * self.edge.compute_s  # the two draws run before the decision
        d = self.router.decide(images, instruction, now=now, signals=signals, link=self.cloud.link.snapshot())
        if d.target == "cloud":
            s = self.cloud.serve(images, state, instruction, rng, now, rtc, dt, extra + self.decision_s)
        else:  # with the draws, the first is the answer: its compute is already charged
            s = self.edge.serve(images, state, instruction, rng, now, rtc, dt,
                                extra - (self.edge.compute_s if extra else 0.0) + self.decision_s)
        s.decision = d
        return s


class RandomTier(ChooserTier):
    """Each request to the cloud with probability ``p`` (the coin: the chooser's own generator)."""

    salt = 0x0FF

    def __init__(self, p: float, edge: EngineTier, cloud: EngineTier):
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"offload probability must be in [0, 1], got {p!r}")
        super().__init__(edge, cloud, "random")
        self.p = float(p)

    def serve(self, images, state, instruction, rng, now, rtc, dt) -> Served:
        tier = self.cloud if self.own.random() < self.p else self.edge
        return tier.serve(images, state, instruction, rng, now, rtc, dt)


def measure_compute_s(engine, images: Mapping[str, np.ndarray], state: np.ndarray, instruction: str,
                      repeats: int = 5) -> float:
    """Median wall seconds of one chunk on this machine (after one warm-up call)."""
    spec = engine.spec
    obs = Observation({k: v for k, v in images.items() if k in spec.camera_keys}, state, instruction)
    rng = np.random.default_rng(0)
    times = []
    for i in range(repeats + 1):
        noise = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
        t0 = time.perf_counter()
        engine.predict(obs, noise=noise)
        if i:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


@dataclass
class EpisodeServing:
    """What one routed episode sent where: per request placement, latency and bytes."""

    placements: list[str] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    upload_bytes: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    features: list[tuple[float, ...]] = field(default_factory=list)

    def add(self, s: Served, features: Sequence[float] = ()) -> None:
        self.placements.append(s.placement)
        self.latency_s.append(s.latency_s)
        self.upload_bytes.append(s.upload_bytes)
        self.reasons.append(getattr(s.decision, "reason", ""))
        self.features.append(tuple(features))

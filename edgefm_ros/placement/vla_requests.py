"""vla_node's chunk requests without ROS, from the sensor snapshot to the chunk it publishes: the Observation
(or why it was refused), the route decision in force, the chunk stamped for the robot; and their outcomes
counted for the node's diagnostics (kept across configures, like the node). Placement (vla.py) runs them.

    obs = requests.observation(snap, cfg, spec, now)       # Observation | Refusal
    decision = requests.decision(route, cfg, now)          # None: the edge (no fresh decision, or use_route off)
    out = placement.compute(obs, decision, requests.seq + 1, remote, queue_empty)
    chunk = requests.stamped(out, obs, cfg, ready, held)   # publish it, then requests.sent(chunk)
"""
from __future__ import annotations

import dataclasses
from collections import Counter

from edgefm_ros.params.vla import VlaNodeConfig
from edgefm_ros.placement.vla import Computed
from edgefm_ros.sensors.observation import Refusal, RefusalCounter, Snapshot, assemble
from edgefm_ros.types import ActionChunk, Observation, RouteDecision

NO_DECISION = "edge (no decision)"


class ChunkRequests:
    def __init__(self) -> None:
        self.refusals: RefusalCounter = RefusalCounter()
        self.routes: Counter[str] = Counter()  # chunks published, by source (edge, cloud, edge-fallback)
        self.chunks = 0
        self.seq = 0  # of the last chunk published
        self.last_outcome = ""  # "chunk" or "refused"
        self.last_route = NO_DECISION

    def observation(self, snap: Snapshot, cfg: VlaNodeConfig, spec, now: float) -> Observation | Refusal:
        """The model's Observation from ``snap`` (sensors/observation.py's rules), or why not."""
        image_hw = {k: (s[1], s[2]) for k, s in spec.image_shapes.items()}
        return assemble(snap, required=cfg.required, model_keys=spec.camera_keys, image_hw=image_hw,
                        max_age_s=cfg.max_observation_age_s, now=now, resize=cfg.resize_images)

    def decision(self, route: tuple[RouteDecision, float] | None, cfg: VlaNodeConfig,
                 now: float) -> RouteDecision | None:
        """The router's decision (received at route[1]) when ``use_route`` and not older than route_max_age_s,
        else None (the edge); remembered as ``last_route``."""
        fresh = cfg.use_route and route is not None and now - route[1] <= cfg.route_max_age_s
        decision = route[0] if fresh else None
        self.last_route = NO_DECISION if decision is None else \
            f"{decision.target} ({decision.candidate}: {decision.reason})"
        return decision

    def refused(self, r: Refusal) -> None:
        self.refusals.add(r)
        self.last_outcome = "refused"

    def stamped(self, out: Computed, obs: Observation, cfg: VlaNodeConfig, ready: float,
                held: bool = False) -> ActionChunk:
        """``out``'s chunk as the robot gets it: the action joint names, the observation's stamp (``held``, the
        robot's queue empty when it was asked for, with ``cfg.restamp_held``: the time it is ready, the arm not
        having moved since the observation), the next sequence number, where it ran, the control period and the
        observation -> ready latency."""
        stamp = ready if held and cfg.restamp_held else obs.stamp
        return dataclasses.replace(out.chunk, joint_names=cfg.action_names, stamp=stamp, seq=self.seq + 1,
                                   source=out.source, dt=1.0 / cfg.action_rate_hz, inference_s=ready - obs.stamp)

    def sent(self, chunk: ActionChunk) -> None:
        self.seq = chunk.seq
        self.chunks += 1
        self.routes[chunk.source] += 1
        self.last_outcome = "chunk"

    def values(self) -> dict[str, object]:
        """Diagnostics values: chunks, refusals (by reason), the route in force, chunks by source."""
        v: dict[str, object] = {"chunks": self.chunks, "refused": self.refusals.total, "route": self.last_route}
        v.update({f"refused_{k}": n for k, n in sorted(self.refusals.counts.items())})
        v.update({f"route_{k}": n for k, n in sorted(self.routes.items())})
        return v

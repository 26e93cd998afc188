"""vla_node: cameras + joint states + instruction in, ActionChunk out, one chunk whenever action_node asks.

Lifecycle (ros/lifecycle.py holds what every node shares): configure loads the model (Engine.from_checkpoint)
on the model thread, makes the publishers, the cloud client and the subscriptions; release undoes all of it,
so a configure that failed can simply be tried again; activate warms the engine up and starts the worker
thread; deactivate stops taking new work.
Callbacks only validate and cache sensor data; a QueueStatus asking for a chunk puts a request in a
one-slot buffer that the worker turns into an Observation (or refuses: stale, missing camera, ...). Camera
frames are not taken by the executor: their subscriptions keep the newest frame of each camera, which the
worker takes when it serves a request (ros/on_demand.py), so the frames a chunk does not use are never
deserialised or converted.
The router's latest decision picks edge or cloud; placement/vla.py runs the request there (the cloud falls
back to the edge on any error or a missed deadline: "edge-fallback"), with real-time chunking's prefix and delay
on every placement, and in shadow mode (``shadow_fraction`` > 0, placement/shadow.py) a share of routed requests
on the other placement too, after publishing, logging both results for calibration. This node gathers the
observation, the route decision and the queue state, publishes the chunk and reports diagnostics.
"""
from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter

from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

from edgefm_ros.cloud.client.policy import RemotePolicy
from edgefm_ros.control.request import ChunkRequester
from edgefm_ros.control.rtc import ChunkContinuation
from edgefm_ros.control.slot import LatestSlot
from edgefm_ros.control.stats import RollingStats
from edgefm_ros.msg import ActionChunk as ActionChunkMsg
from edgefm_ros.msg import QueueStatus
from edgefm_ros.msg import RouteDecision as RouteDecisionMsg
from edgefm_ros.params.vla import VlaNodeConfig
from edgefm_ros.placement.engine_thread import EngineThread
from edgefm_ros.placement.vla import Computed, Placement, Rejected
from edgefm_ros.placement.vla_build import load_engine, make_cloud_policy, make_placement
from edgefm_ros.placement.vla_requests import ChunkRequests
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.convert import chunk_to_msg, msg_to_frame, msg_to_route, to_sec
from edgefm_ros.sensors.joints import JointOrder
from edgefm_ros.ros.lifecycle import ManagedNode
from edgefm_ros.ros.link_samples import LinkSamples
from edgefm_ros.sensors.observation import Refusal, SensorCache, Snapshot
from edgefm_ros.ros.on_demand import OnDemandSubscriptions
from edgefm_ros.ros.spin import run_node
from edgefm_ros.threads.worker import Worker
from edgefm_ros.types import RouteDecision


class VlaNode(ManagedNode):
    CONFIG = VlaNodeConfig
    STATUS = "inference"

    def __init__(self, remote=None, **kwargs):
        super().__init__(**kwargs)
        self.engine = None
        self.remote: RemotePolicy | None = remote  # optional (tests inject one)
        self._own_remote = False  # made from cloud_url at configure (closed at cleanup)
        self._placement: Placement | None = None  # edge/cloud/fallback/shadow and RTC, made at configure
        self._run_id = uuid.uuid4().hex[:8]  # request ids in the shadow log: <run>-<seq>
        self._active = False
        self._worker: Worker | None = None
        self._model: EngineThread | None = None  # builds, warms up and runs the engine (made at configure)
        self._slot: LatestSlot = LatestSlot()
        self._req_lock = threading.Lock()
        self._requester = ChunkRequester()
        self._route: tuple[RouteDecision, float] | None = None  # (decision, received at)
        self._cameras: OnDemandSubscriptions | None = None  # made at configure
        self.requests = ChunkRequests()  # observation, route in force, stamping; chunks and refusals counted
        self.bad_messages: Counter[str] = Counter()
        self.last_bad_message, self._bad_recent = "", 0  # malformed messages since the last diagnostics
        self.errors = 0
        self.lat = {k: RollingStats() for k in ("prefill", "decode", "compute", "frame_to_chunk", "cloud_call")}

    # lifecycle -------------------------------------------------------------------------------------------
    def configure(self, c: VlaNodeConfig) -> None:
        log = self.get_logger()
        t0 = time.perf_counter()
        self._model = EngineThread("vla-model")
        self.engine = self._model.run(load_engine, c)
        spec = self.engine.spec
        self.cfg = c = c.for_model(spec.camera_keys, spec.state_dim, spec.action_dim)
        log.info(f"model {spec.name} loaded in {time.perf_counter() - t0:.2f}s: cameras {list(spec.camera_keys)}, "
                 f"state {spec.state_dim}, actions {spec.chunk_size}x{spec.action_dim}, vision position ids "
                 f"{self.engine.vision_position_ids}; camera topics {dict(zip(c.camera_keys, c.camera_topics))}")
        self.order = JointOrder(c.state_joint_names)
        self.cache = SensorCache(c.camera_keys)
        self.cache.put_task(c.default_task, 0.0)
        if self.remote is None and c.cloud_url:
            self.remote = make_cloud_policy(c, LinkSamples.on(self, c.link_sample_topic))
            self._own_remote = True
        self._chunk_pub = self.create_lifecycle_publisher(ActionChunkMsg, c.chunk_topic, qos.RELIABLE)
        self._cameras = OnDemandSubscriptions(self, "cameras")
        for topic, key, transport in zip(c.camera_topics, c.camera_keys, c.transports):
            mtype = CompressedImage if transport == "compressed" else Image
            self._cameras.subscribe(mtype, topic, lambda m, k=key: self._on_image(k, m), qos.SENSOR_NEWEST)
        qos.instruction_subscriptions(self, String, c.instruction_topic, self._on_instruction)
        self.create_subscription(JointState, c.joint_states_topic, self._on_joint_state, qos.SENSOR)
        self.create_subscription(QueueStatus, c.queue_status_topic, self._on_queue_status, qos.LATEST)
        self.create_subscription(RouteDecisionMsg, c.route_topic, self._on_route, qos.LATEST)
        self._requester = ChunkRequester(c.merge_timeout_s)
        # edge/cloud/fallback/shadow, and real-time chunking's state (the last chunk sent, the delay estimate)
        self._placement = self._model.run(make_placement, self.engine, c, self._run_id, self.lat, self._placement_log)
        if self._placement.shadow is not None:
            log.info(f"shadow mode: {c.shadow_fraction:g} of routed requests also run on the other placement; "
                     f"log {self._placement.shadow.cfg.log}")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        t0 = time.perf_counter()
        try:
            self._model.run(self.engine.warmup)
        except Exception as e:
            self.get_logger().error(f"warm-up failed: {e}")
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info(f"warm-up done in {time.perf_counter() - t0:.2f}s; waiting for chunk requests")
        ret = super().on_activate(state)
        self._slot = LatestSlot()
        self._requester = ChunkRequester(self.cfg.merge_timeout_s)
        self._worker = Worker("inference", self._slot, lambda item: self._model.run(self._serve, item),
                              poll_s=0.2).start()
        self._active = True
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop()
        return super().on_deactivate(state)

    def stop(self) -> bool:
        """The worker stopped (the request in hand ends first, publishing nothing); one that does not end in
        10 s is reported and left (it holds no transition's resources: the model thread is shut down after)."""
        self._active = False
        if self._worker is not None:
            self._worker.stop(join_timeout_s=10.0)
            if self._worker.is_alive():
                self.get_logger().error("the inference worker did not stop within 10 s")
            self._worker = None
        return True

    def release(self) -> None:
        """The camera subscriptions' node, the cloud client this node made (before its link publisher goes), the
        shadow log and the model thread closed, the model dropped. An injected ``remote`` is the caller's: kept."""
        if self._cameras is not None:
            self._cameras.close()
            self._cameras = None
        self._close_remote()
        self._close_placement()
        if self._model is not None:
            self._model.close()  # the worker (joined) sent it the last call
            self._model = None
        self.engine = self._route = None

    def stop_for_exit(self) -> None:
        """Before the process exits: the cloud client's connections and threads closed (a call in flight fails
        at once), the worker stopped (the request in hand publishes nothing), the shadow log closed."""
        self._active = False  # the request in hand publishes nothing and gets no edge fallback
        self._close_remote()  # a cloud call in flight fails now, not at its deadline
        super().stop_for_exit()
        if self._placement is not None:
            self._placement.close()

    def _close_remote(self) -> None:
        if self._own_remote and self.remote is not None:
            self.remote.close()
            self.remote, self._own_remote = None, False

    def _close_placement(self) -> None:
        if self._placement is not None:
            self._placement.close()  # shadow mode's log
            self._placement = None

    @property
    def _rtc(self) -> ChunkContinuation | None:
        """Real-time chunking's state (the last chunk sent, the delay estimate); None when off."""
        return self._placement.rtc if self._placement is not None else None

    # callbacks: validate and cache -----------------------------------------------------------------------
    def _stamp(self, header) -> float:
        t = to_sec(header.stamp)
        return t if t > 0 else self._now()  # unstamped: time of arrival

    def _bad(self, kind: str, detail: str) -> None:
        self.bad_messages[kind] += 1
        self._bad_recent += 1
        self.last_bad_message = f"bad {kind}: {detail}"
        self.get_logger().warning(f"bad {kind} message ignored: {detail}", throttle_duration_sec=2.0)

    def _on_image(self, key: str, msg) -> None:
        try:
            frame = msg_to_frame(msg, self._stamp(msg.header))
        except ValueError as e:
            return self._bad("image", f"camera {key!r}: {e}")
        self.cache.put_frame(key, frame)

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            state = self.order.reorder(list(msg.name), msg.position)
        except ValueError as e:
            return self._bad("joint_state", str(e))
        self.cache.put_state(state, self._stamp(msg.header))

    def _on_instruction(self, msg: String) -> None:
        task = msg.data.strip()
        if not task:
            return self._bad("instruction", "empty instruction ignored")
        if task != self.cache.task:
            self.get_logger().info(f"instruction: {task!r}")
        self.cache.put_task(task, self._now())

    def _on_route(self, msg: RouteDecisionMsg) -> None:
        try:
            self._route = (msg_to_route(msg), self._now())
        except ValueError as e:
            self._bad("route", str(e))

    def _on_queue_status(self, msg: QueueStatus) -> None:
        if not self._active:
            return
        now = self._now()
        with self._req_lock:
            if not self._requester.should_start(msg.request_chunk, msg.must_go, msg.last_chunk_sequence, now):
                return
            self._requester.started()
        # an empty queue: the robot holds, it executes nothing of the last chunk (nothing to continue)
        self._slot.put(msg.queue_size == 0)

    # worker ----------------------------------------------------------------------------------------------
    def _serve(self, queue_empty: bool) -> None:
        seq = 0
        try:
            self._cameras.take()  # each camera's newest frame, converted here, on the worker
            # the router's newest decision, read after the frames: the one made on frames closest to these
            seq = self._compute(self.cache.snapshot(self._now()), self._route, queue_empty)
        except Exception as e:  # never let one bad chunk kill the worker
            self.errors += 1
            self.get_logger().error(f"inference failed: {e!r}", throttle_duration_sec=2.0)
        finally:
            with self._req_lock:
                self._requester.finished(seq, self._now())

    def _compute(self, snap: Snapshot, route, queue_empty: bool = False) -> int:
        c, req, now = self.cfg, self.requests, self._now()
        obs = req.observation(snap, c, self.engine.spec, now)
        if isinstance(obs, Refusal):
            return self._refuse(obs)
        try:
            out: Computed | None = self._placement.compute(obs, req.decision(route, c, now), req.seq + 1, self.remote,
                                                            queue_empty, active=lambda: self._active)
        except Rejected as e:
            return self._refuse(Refusal("model_rejected", str(e)))
        if out is None:
            return 0  # stopping
        if c.inference_delay_ms > 0:  # a slower model, simulated: the chunk is published this much later
            time.sleep(c.inference_delay_ms * 1e-3)
        ready = self._now()
        chunk = req.stamped(out, obs, c, ready, held=queue_empty)
        if not self._active or not self.context.ok():
            return 0
        self._chunk_pub.publish(chunk_to_msg(chunk))
        req.sent(chunk)
        self.lat["frame_to_chunk"].add(ready - obs.stamp)
        self._placement.published(out, chunk, ready - obs.stamp)  # RTC bookkeeping, then any shadow run
        return chunk.seq

    def _placement_log(self, kind: str, message: str) -> None:
        """placement/vla.py's messages; rclpy throttles per call site, so each kind has its own line."""
        log = self.get_logger()
        if kind == "shadow_log":
            log.error(message, throttle_duration_sec=5.0)
        elif kind == "shadow_failed":
            log.warning(message, throttle_duration_sec=2.0)
        else:  # cloud_failed
            log.warning(message, throttle_duration_sec=2.0)

    def _refuse(self, r: Refusal) -> int:
        self.requests.refused(r)
        self.get_logger().warning(f"observation refused: {r.reason}: {r.detail}", throttle_duration_sec=2.0)
        return 0

    # diagnostics -----------------------------------------------------------------------------------------
    def diagnostics(self) -> tuple[bytes, str, dict]:
        if self.engine is None:  # configured, then released by a failed transition's clean-up
            return diag.WARN, "no model loaded", {}
        values, req = self._diag_values(self._now()), self.requests
        if req.last_outcome == "refused":
            level, message = diag.WARN, f"observation refused: {req.refusals.last}"
        elif self._bad_recent:
            level, message = diag.WARN, f"{self._bad_recent} malformed messages ignored; last: {self.last_bad_message}"
        else:
            level, message = diag.OK, f"{req.chunks} chunks" if self._active else "inactive"
        self._bad_recent = 0
        return level, message, values

    def _diag_values(self, now: float) -> dict[str, object]:
        v: dict[str, object] = {"model": self.engine.spec.name, "errors": self.errors,
                                "dropped_observations": self._slot.overwritten, **self.requests.values()}
        v.update({f"bad_{k}": n for k, n in sorted(self.bad_messages.items())})
        for k, s in self.lat.items():
            v.update(s.summary(f"{k}_ms", 1e3))
        if self.remote is not None:
            v.update({f"cloud_{k}": x for k, x in self.remote.stats().items()})
        if self._placement is not None:
            v.update(self._placement.stats())  # shadow mode's and real-time chunking's
        if self._cameras is not None:
            self._cameras.take()  # live camera ages while no chunk is asked for
            v["frames_taken"] = self._cameras.taken
            v["frames_take_failed"] = self._cameras.failed
        snap = self.cache.snapshot(now)
        for key in self.cfg.camera_keys:
            f = snap.frames.get(key)
            v[f"age_{key}_s"] = now - f.stamp if f is not None else float("nan")
        v["age_joint_states_s"] = now - snap.state_stamp
        v["task"] = snap.task
        if self.requests.refusals.last:
            v["last_refusal"] = self.requests.refusals.last
        if self.last_bad_message:
            v["last_bad_message"] = self.last_bad_message
        return v


def main(args=None) -> int:
    return run_node(VlaNode, VlaNodeConfig.NODE, args, stop=VlaNode.stop_for_exit)


if __name__ == "__main__":
    sys.exit(main())

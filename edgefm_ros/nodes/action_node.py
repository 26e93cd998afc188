"""action_node: the control loop. Keeps the action queue, publishes one command per tick, holds when empty.

Lifecycle (ros/lifecycle.py holds what every node shares): configure creates the publishers and the chunk
subscription; activate starts the control thread (absolute deadlines on the monotonic clock, not an rclpy
timer: a timer shares the executor with the subscriptions), on SCHED_FIFO with realtime_priority (the
executor thread just below it); deactivate stops the thread and publishes the last commanded position once
more (safe stop). A control thread that does not end within ``stop_timeout_s`` is kept, not forgotten: the
transition errs and the node ends finalized (error processing), since nothing the thread uses may be released.
"""
from __future__ import annotations

import gc
import math
import sys
import threading
import time

from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from std_msgs.msg import Header

from edgefm_ros.control.commander import Command
from edgefm_ros.control.core import ControlCore
from edgefm_ros.control.stats import TickStats
from edgefm_ros.control.ticker import Ticker
from edgefm_ros.msg import ActionChunk as ActionChunkMsg
from edgefm_ros.msg import QueueStatus
from edgefm_ros.params.action import ActionNodeConfig
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.commands import COMMAND_MSG, command_msg
from edgefm_ros.ros.convert import msg_to_chunk, to_sec, to_stamp
from edgefm_ros.ros.lifecycle import ManagedNode
from edgefm_ros.threads.realtime import FifoScope, join_or_report
from edgefm_ros.ros.spin import run_node


class ActionNode(ManagedNode):
    CONFIG = ActionNodeConfig
    STATUS = "control"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.core: ControlCore | None = None
        self.ticks: TickStats | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active = False
        self._realtime = False  # the control thread runs SCHED_FIFO (realtime_priority applied)
        self._holding_reason = "not active"
        self._bad_chunks: list[str] = []

    # lifecycle -------------------------------------------------------------------------------------------
    def configure(self, c: ActionNodeConfig) -> None:
        self.core = ControlCore(c.period, c.aggregate, c.chunk_size_threshold, c.joint_names)
        self.ticks = TickStats(c.period)
        self._cmd_pub = self.create_lifecycle_publisher(COMMAND_MSG[c.command_type], c.command_topic, qos.RELIABLE)
        self._status_pub = self.create_lifecycle_publisher(QueueStatus, c.queue_status_topic, qos.RELIABLE)
        self.create_subscription(ActionChunkMsg, c.chunk_topic, self._on_chunk, qos.RELIABLE)
        if c.episode_start_topic:
            self.create_subscription(Header, c.episode_start_topic, self._on_episode_start, qos.RELIABLE)
        self.get_logger().info(f"configured: {c.control_rate_hz:g} Hz, {c.command_type} on {c.command_topic}, "
                               f"aggregate {c.aggregate}, threshold {c.chunk_size_threshold:g}")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        ret = super().on_activate(state)  # publishers on; the executor thread on SCHED_FIFO below the loop's
        gc.freeze()  # objects made so far are never scanned again: short collections while running
        self._stop.clear()
        self.ticks = TickStats(self.cfg.period)
        self._active = True
        self._thread = threading.Thread(target=self._control_loop, name="control", daemon=True)
        self._thread.start()
        self.get_logger().info("active: control loop running")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if not self.stop():  # publishers off (a thread that wakes up publishes nothing), then error processing
            super().on_deactivate(state)
            return TransitionCallbackReturn.ERROR
        cmd = self.core.hold()
        if cmd.positions is not None and self.context.ok():
            self._cmd_pub.publish(self._command(cmd))
        self._holding_reason = "inactive"
        self.get_logger().info("deactivated: holding the last commanded position")
        return super().on_deactivate(state)

    def release(self) -> None:
        self.core = None

    @property
    def control_thread_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> bool:
        """Tell the control thread to stop and join it for up to ``stop_timeout_s``, logging an error each
        second it still runs. True once no control thread runs; one that did not end is kept (not dropped)."""
        self._active = False
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        if not join_or_report(thread, self.stop_timeout_s, self.get_logger(), "control thread"):
            return False
        self._thread = None
        self._realtime = False
        return True

    # data path -------------------------------------------------------------------------------------------
    def _on_chunk(self, msg: ActionChunkMsg) -> None:
        if not self._active or self.core is None:
            return
        try:
            r = self.core.merge(msg_to_chunk(msg), self._now())
        except ValueError as e:
            self._bad_chunks = (self._bad_chunks + [str(e)])[-3:]
            self.get_logger().warning(f"chunk {msg.sequence} refused: {e}", throttle_duration_sec=1.0)
            return
        if r.stale:
            self.get_logger().info(f"chunk {msg.sequence} was observed before the episode started: dropped")
        elif r.scheduled == 0:
            self.get_logger().warning(f"chunk {msg.sequence} arrived {r.latency_s:.3f}s after its observation: "
                                      "entirely in the past, dropped", throttle_duration_sec=1.0)

    def _on_episode_start(self, msg: Header) -> None:
        if self.core is None:
            return
        t = to_sec(msg.stamp)
        self.core.reset(t if t > 0 else self._now())
        self.get_logger().info(f"episode start {msg.frame_id!r}: queue and held position dropped")

    def _command(self, cmd: Command):
        return command_msg(self.cfg.command_type, self.core.joint_names, cmd.positions,
                           to_stamp(self._now()), self.cfg.period)

    def _control_loop(self) -> None:
        c = self.cfg
        rt = FifoScope()  # this thread's SCHED_FIFO, put back when it ends
        self._realtime = c.realtime_priority > 0 and rt.apply_or_warn(c.realtime_priority, self.get_logger(),
                                                                       "control thread")
        ticker = Ticker(c.period, c.spin_s)
        self.core.start(self._now())  # tick k is due at ticker.start + k * period = grid.origin + k * period (ROS)
        try:
            while not self._stop.is_set():
                tick = ticker.wait(self._stop)
                if tick is None or not self.context.ok():
                    break
                cmd = self.core.tick(tick.index)
                state = self.core.state()
                now_mono = time.monotonic()
                try:
                    if cmd.positions is not None:
                        self._cmd_pub.publish(self._command(cmd))
                    self._status_pub.publish(self._status(state, cmd))
                except Exception as e:  # context invalidated during shutdown
                    if self.context.ok():
                        self.get_logger().error(f"publish failed: {e}")
                    break
                self.ticks.record(now_mono, tick.deadline, tick.missed)
                self._holding_reason = "queue empty" if cmd.holding else ""
        finally:
            rt.restore()

    def _status(self, s, cmd: Command) -> QueueStatus:
        cnt = self.core.counters()
        m = QueueStatus(queue_size=s.queue_size, chunk_size=s.chunk_size, fill_ratio=float(s.fill_ratio),
                        request_chunk=s.request_chunk, must_go=s.must_go, holding=cmd.holding,
                        underruns=cnt.underruns, last_chunk_sequence=cnt.last_seq)
        m.header.stamp = to_stamp(self._now())
        return m

    # diagnostics -----------------------------------------------------------------------------------------
    def diagnostics(self) -> tuple[bytes, str, dict]:
        values: dict[str, object] = {}
        level, message = diag.OK, "running"
        if self.core is None or self.ticks is None:
            return level, message, values
        cnt, st, t = self.core.counters(), self.core.state(), self.ticks.summary()
        values.update({"control_rate_hz": t["rate_hz"], "target_rate_hz": self.cfg.control_rate_hz,
                       "tick_jitter_p50_ms": t["period_error_ms_p50"], "tick_jitter_p99_ms": t["period_error_ms_p99"],
                       "tick_jitter_max_ms": t["period_error_ms_max"], "missed_ticks": int(t["missed_ticks"]),
                       "realtime": self._realtime, "executor_realtime": self.executor_rt.previous is not None,
                       "queue_depth": st.queue_size, "chunk_ticks": st.chunk_size, "chunks": cnt.chunks,
                       "rejected_chunks": cnt.rejected_chunks, "late_chunks": cnt.late_chunks,
                       "stale_chunks": cnt.stale_chunks, "underruns": cnt.underruns,
                       "waiting_ticks": cnt.waiting_ticks, "last_chunk_sequence": cnt.last_seq,
                       "holding": bool(self._holding_reason)})
        values.update(self.core.arrival_latency.summary("chunk_latency_ms", 1e3))
        values.update(self.core.frame_to_action.summary("frame_to_action_ms", 1e3))
        values.update(self.core.skipped_rows.summary("skipped_rows"))
        since = self._now() - cnt.last_chunk_time
        values["since_last_chunk_s"] = since if math.isfinite(since) else float("nan")
        if self._holding_reason:
            level = diag.WARN
            message = f"holding last commanded position: {self._holding_reason}"
            if self._active and not (since <= self.cfg.producer_timeout_s):
                message += f"; no chunk for {since:.1f}s (producer lost?)" if math.isfinite(since) else \
                    "; no chunk received yet"
        if self._bad_chunks:
            values["last_rejection"] = self._bad_chunks[-1]
        return level, message, values


def main(args=None) -> int:
    sys.setswitchinterval(0.0001)  # the control thread must not wait long for the GIL
    return run_node(ActionNode, ActionNodeConfig.NODE, args, stop=ActionNode.stop_for_exit)


if __name__ == "__main__":
    sys.exit(main())

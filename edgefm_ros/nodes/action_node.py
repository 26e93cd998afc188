"""action_node: the control loop. Keeps the action queue, publishes one command per tick, holds when empty.

Lifecycle: configure creates the publishers and the chunk subscription (and ``_release`` undoes all of it: a
failed configure, cleanup, an error, shutdown); activate starts the control thread (absolute deadlines on the
monotonic clock, not an rclpy timer: a timer shares the executor with the subscriptions) and, with
realtime_priority, puts the executor thread on SCHED_FIFO; deactivate stops the thread, puts the executor
thread's scheduling back and publishes the last commanded position once more (safe stop). A control thread
that does not end within ``stop_timeout_s`` is kept, not forgotten: the transition errs and the node ends
finalized (error processing), since nothing the thread uses may be released.
"""
from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time

from builtin_interfaces.msg import Duration

from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, Header
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from edgefm_ros.control.commander import Command
from edgefm_ros.control.core import ControlCore
from edgefm_ros.control.stats import TickStats
from edgefm_ros.control.ticker import Ticker
from edgefm_ros.msg import ActionChunk as ActionChunkMsg
from edgefm_ros.msg import QueueStatus
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.action_params import NODE_NAME, PARAMS, ActionNodeConfig, make_config
from edgefm_ros.ros.convert import msg_to_chunk, to_sec, to_stamp
from edgefm_ros.ros.params import declare
from edgefm_ros.ros.realtime import FifoScope, join_or_report
from edgefm_ros.ros.spin import run_node

COMMAND_MSG = {"joint_trajectory": JointTrajectory, "float64_multi_array": Float64MultiArray,
               "joint_state": JointState}
STOP_TIMEOUT_S = 5.0  # a transition waits this long for the control thread to end (it ends within a tick)


def command_msg(kind: str, names: tuple[str, ...], positions, stamp, period: float):
    """The command message of ``kind`` for one action (positions in ``names`` order)."""
    pos = [float(x) for x in positions]
    if kind == "float64_multi_array":
        return Float64MultiArray(data=pos)
    if kind == "joint_state":
        m = JointState(name=list(names), position=pos)
        m.header.stamp = stamp
        return m
    ns = int(period * 1e9)
    m = JointTrajectory(joint_names=list(names), points=[JointTrajectoryPoint(
        positions=pos, time_from_start=Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000))])
    m.header.stamp = stamp
    return m


class ActionNode(LifecycleNode):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self.values = declare(self, PARAMS)
        self.cfg: ActionNodeConfig | None = None
        self.core: ControlCore | None = None
        self.ticks: TickStats | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active = False
        self._realtime = False  # the control thread runs SCHED_FIFO (realtime_priority applied)
        self.executor_rt = FifoScope()  # the executor thread's SCHED_FIFO while active, and what it had before
        self.stop_timeout_s = STOP_TIMEOUT_S
        self._cmd_pub = self._status_pub = self._chunk_sub = self._episode_sub = None  # made at configure
        self._holding_reason = "not active"
        self._bad_chunks: list[str] = []
        self._diag_pub = self.create_publisher(diag.DiagnosticArray, "/diagnostics", qos.DIAGNOSTICS)
        period = self.values["diagnostics_period_s"]
        self._diag_timer = self.create_timer(period, self._publish_diagnostics)
        if self.values["autostart"]:
            if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                self.trigger_activate()

    # lifecycle -------------------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:  # everything the node holds while configured is acquired here and released by _release
            self.cfg = c = make_config(self.values)
            self.core = ControlCore(c.period, c.aggregate, c.chunk_size_threshold, c.joint_names)
            self.ticks = TickStats(c.period)
            self._cmd_pub = self.create_lifecycle_publisher(COMMAND_MSG[c.command_type], c.command_topic,
                                                            qos.RELIABLE)
            self._status_pub = self.create_lifecycle_publisher(QueueStatus, c.queue_status_topic, qos.RELIABLE)
            self._chunk_sub = self.create_subscription(ActionChunkMsg, c.chunk_topic, self._on_chunk, qos.RELIABLE)
            if c.episode_start_topic:
                self._episode_sub = self.create_subscription(Header, c.episode_start_topic, self._on_episode_start,
                                                             qos.RELIABLE)
        except Exception as e:  # bad parameters or topic names: stay unconfigured, holding nothing
            self.get_logger().error(f"configure failed: {e}")
            self._release()
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info(f"configured: {c.control_rate_hz:g} Hz, {c.command_type} on {c.command_topic}, "
                               f"aggregate {c.aggregate}, threshold {c.chunk_size_threshold:g}")
        return super().on_configure(state)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self._thread is not None:  # a control thread that never ended (see _stop_loop): not a second one
            self.get_logger().error("activate refused: the previous control thread is still running")
            return TransitionCallbackReturn.FAILURE
        ret = super().on_activate(state)
        if self.cfg.realtime_priority > 0:
            # the executor thread (this one) holds the GIL while merging chunks: give it real-time priority
            # just below the control thread's, so it is never preempted by other processes while the control
            # thread waits for the GIL (priority inversion); deactivate puts its scheduling back
            p = max(1, self.cfg.realtime_priority - 1)
            try:
                self.executor_rt.apply(p)
            except OSError as e:
                self.get_logger().warning(f"realtime priority {p} not applied to the executor thread: {e}")
        gc.freeze()  # objects made so far are never scanned again: short collections while running
        self._stop.clear()
        self.ticks = TickStats(self.cfg.period)
        self._active = True
        self._thread = threading.Thread(target=self._control_loop, name="control", daemon=True)
        self._thread.start()
        self.get_logger().info("active: control loop running")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        stopped = self._stop_loop()
        self._restore_executor_scheduling()
        if not stopped:  # publishers off (a thread that wakes up publishes nothing), then error processing
            super().on_deactivate(state)
            return TransitionCallbackReturn.ERROR
        cmd = self.core.hold()
        if cmd.positions is not None and self.context.ok():
            self._cmd_pub.publish(self._command(cmd))
        self._holding_reason = "inactive"
        self.get_logger().info("deactivated: holding the last commanded position")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        if not self._release():
            return TransitionCallbackReturn.FAILURE
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """After a transition erred: unconfigured with everything released once no control thread runs;
        finalized (FAILURE) while one still does, holding what it uses."""
        if not self._release():
            self.get_logger().error("the control thread is still running: the node is finalized")
            return TransitionCallbackReturn.FAILURE
        return super().on_error(state)

    def stop_for_exit(self) -> None:
        """Before the process exits (run_node): the control thread stopped and joined (within stop_timeout_s;
        one that does not end is left to the process exit) and the executor thread's scheduling put back."""
        self._stop_loop()
        self._restore_executor_scheduling()

    @property
    def control_thread_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _release(self) -> bool:
        """Undo configure (and activate): the control thread stopped, the executor thread's scheduling put
        back, subscriptions and publishers destroyed. False, releasing nothing, while the control thread
        still runs after ``stop_timeout_s``."""
        if not self._stop_loop():
            return False
        self._restore_executor_scheduling()
        for sub in (self._chunk_sub, self._episode_sub):
            if sub is not None:
                self.destroy_subscription(sub)
        for pub in (self._cmd_pub, self._status_pub):
            if pub is not None:
                self.destroy_lifecycle_publisher(pub)
        self._cmd_pub = self._status_pub = self._chunk_sub = self._episode_sub = None
        self.core = None
        return True

    def _stop_loop(self) -> bool:
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

    def _restore_executor_scheduling(self) -> None:
        try:
            prev = self.executor_rt.restore()
        except OSError as e:
            self.get_logger().error(f"the executor thread's scheduling could not be put back: {e}")
            return
        if prev is not None:
            self.get_logger().info(f"executor thread back to scheduling policy {prev.policy}, priority "
                                   f"{prev.priority}")

    # data path -------------------------------------------------------------------------------------------
    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

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
        self._realtime = c.realtime_priority > 0 and self._set_realtime(c.realtime_priority, "control thread")
        ticker = Ticker(c.period, c.spin_s)
        self.core.start(self._now())  # tick k is due at ticker.start + k * period = grid.origin + k * period (ROS)
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

    def _set_realtime(self, priority: int, what: str) -> bool:
        """SCHED_FIFO for the calling thread; a warning (and normal scheduling, False) when not permitted."""
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            return True
        except (PermissionError, OSError) as e:
            self.get_logger().warning(f"realtime priority {priority} not applied to the {what}: {e}")
            return False

    def _status(self, s, cmd: Command) -> QueueStatus:
        cnt = self.core.counters()
        m = QueueStatus(queue_size=s.queue_size, chunk_size=s.chunk_size, fill_ratio=float(s.fill_ratio),
                        request_chunk=s.request_chunk, must_go=s.must_go, holding=cmd.holding,
                        underruns=cnt.underruns, last_chunk_sequence=cnt.last_seq)
        m.header.stamp = to_stamp(self._now())
        return m

    # diagnostics -----------------------------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        if not self.context.ok():
            return
        values: dict[str, object] = {"state": "active" if self._active else "inactive"}
        level, message = diag.OK, "running"
        if self.core is not None and self.ticks is not None:
            cnt = self.core.counters()
            st = self.core.state()
            t = self.ticks.summary()
            values.update({"control_rate_hz": t["rate_hz"], "target_rate_hz": self.cfg.control_rate_hz,
                           "tick_jitter_p50_ms": t["period_error_ms_p50"],
                           "tick_jitter_p99_ms": t["period_error_ms_p99"],
                           "tick_jitter_max_ms": t["period_error_ms_max"], "missed_ticks": int(t["missed_ticks"]),
                           "realtime": self._realtime, "executor_realtime": self.executor_rt.previous is not None,
                           "queue_depth": st.queue_size, "chunk_ticks": st.chunk_size, "chunks": cnt.chunks,
                           "rejected_chunks": cnt.rejected_chunks, "late_chunks": cnt.late_chunks,
                           "stale_chunks": cnt.stale_chunks,
                           "underruns": cnt.underruns, "waiting_ticks": cnt.waiting_ticks,
                           "last_chunk_sequence": cnt.last_seq, "holding": bool(self._holding_reason)})
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
        else:
            level, message = diag.WARN, "unconfigured"
        diag.publish_status(self, self._diag_pub, "control", level, message, values)


def main(args=None) -> int:
    sys.setswitchinterval(0.0001)  # the control thread must not wait long for the GIL
    return run_node(ActionNode, NODE_NAME, args, stop=ActionNode.stop_for_exit)

if __name__ == "__main__":
    sys.exit(main())

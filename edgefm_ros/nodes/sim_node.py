"""sim_node: the simulated arm (edgefm_ros.sim) as a robot on the ROS graph, in real (wall-clock) time.

Publishes the cameras (Image rgb8, optionally JPEG CompressedImage), the arm's JointState (ee_x, ee_y, ee_z,
gripper), the episode's instruction (latched), episode events (std_msgs/String JSON: start, success,
timeout, reset, done) and, at each episode start, a std_msgs/Header that tells action_node to drop its
queue. Applies the newest command from action_node (JointTrajectory, Float64MultiArray or JointState);
a malformed one (NaN, wrong length, unknown joints) never reaches the arm: it is counted and reported in
/diagnostics. Without commands the arm holds its last target.

Lifecycle (ros/lifecycle.py holds what every node shares): configure builds the simulator on its own thread
and the publishers; activate starts physics on that thread (steps physics up to the wall clock every
1/state_rate_hz, renders the cameras every 1/camera_rate_hz), on SCHED_FIFO with realtime_priority (the
executor thread just below it); deactivate pauses physics; release ends the thread, which closes the
simulator (one that does not end within ``stop_timeout_s`` is kept, and cleanup fails, rather than being
forgotten). Without ROS: the episode logic (edgefm_ros.sim.live), the physics loop's wall-clock schedule
(sim.pacing) and what is reported of the episodes (sim.live_report).
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time

from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Header, String

from edgefm_ros.control.stats import RollingStats
from edgefm_ros.params import topics
from edgefm_ros.params.sim import SimNodeConfig
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.commands import COMMAND_MSG, command_fields
from edgefm_ros.ros.convert import rgb_to_image_msg, to_stamp
from edgefm_ros.sensors.camera import encode_jpeg
from edgefm_ros.ros.lifecycle import ManagedNode
from edgefm_ros.threads.realtime import FifoScope, join_or_report
from edgefm_ros.ros.spin import run_node
from edgefm_ros.sim.env import SimConfig, SimEnv
from edgefm_ros.sim.live import LiveConfig, LiveSim, parse_episode
from edgefm_ros.sim.live_report import append_result, live_message, live_values
from edgefm_ros.sim.pacing import Pacer
from edgefm_ros.sim.tasks import EVAL_SEEDS, TASKS
from edgefm_ros.sim.teleop import GROUND_TRUTH_NAMES

REJECT_WARN_S = 5.0  # /diagnostics warns this long after a refused command


class SimNode(ManagedNode):
    CONFIG = SimNodeConfig
    STATUS = "simulation"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.env = None
        self.live = None
        self._stop = threading.Event()  # the simulator thread ends (cleanup, shutdown)
        self._running = threading.Event()  # physics runs (active)
        self._thread: threading.Thread | None = None
        self._active = False
        self._realtime = False  # the physics thread runs SCHED_FIFO
        self._truth_pub = None  # ground_truth_topic's publisher (configured with one), and its names
        self._truth_names: list[str] = []
        self._last_reject_at = -math.inf  # monotonic time of the last refused command
        self.render_ms = RollingStats()
        self.step_ms = RollingStats()
        self.loop_gap_ms = RollingStats()

    # lifecycle -------------------------------------------------------------------------------------------
    def configure(self, c: SimNodeConfig) -> None:
        episodes = [parse_episode(e, TASKS) for e in c.episodes] or \
            [parse_episode(f"{t}:{EVAL_SEEDS[0]}", TASKS) for t in TASKS]
        kw = {"image_hw": (c.image_height, c.image_width)} if c.image_height else {}
        config = SimConfig(**kw)
        unknown = [n for n in c.camera_names if n not in config.cameras]
        if unknown:
            raise ValueError(f"camera_names {unknown} are not cameras of the simulator {list(config.cameras)}")
        t0 = time.perf_counter()
        # the simulator and its GL contexts belong to one thread for the node's life: it builds every
        # task's world now (not mid-run) and runs physics while the node is active
        self._start_thread(lambda: SimEnv(config), [(e.task, episodes[0].seed) for e in
                                                     {e.task: e for e in episodes}.values()])
        self.live = LiveSim(self.env, TASKS, episodes, LiveConfig(
            timeout_s=c.timeout_s, settle_s=c.settle_s, start_delay_s=c.start_delay_s, repeat=c.repeat,
            wait_for_start=c.wait_for_start, command_guard_s=c.command_guard_s, joint_names=c.joint_names,
            conditions=c.conditions, phrasings=c.phrasings),
            clock=self._now)
        pub = self.create_lifecycle_publisher
        self._image_pubs = [pub(Image, t, qos.SENSOR) for t in c.camera_topics]
        self._jpeg_pubs = [pub(CompressedImage, topics.compressed(t), qos.SENSOR)
                           for t in c.camera_topics] if c.publish_compressed else []
        self._state_pub = pub(JointState, c.joint_states_topic, qos.SENSOR)
        if c.ground_truth_topic:  # privileged: for a scripted operator (tools/teleop_node.py), never a policy
            self._truth_names = list(GROUND_TRUTH_NAMES)
            self._truth_pub = pub(JointState, c.ground_truth_topic, qos.SENSOR)
        self._task_pub = pub(String, c.instruction_topic, qos.LATCHED)
        self._event_pub = pub(String, c.events_topic, qos.RELIABLE)
        self._start_pub = pub(Header, c.episode_start_topic, qos.RELIABLE)
        self.create_subscription(COMMAND_MSG[c.command_type], c.command_topic, self._on_command, qos.RELIABLE)
        self.create_subscription(String, c.reset_topic, self._on_reset, qos.RELIABLE)
        self.get_logger().info(
            f"configured in {time.perf_counter() - t0:.1f}s: {len(self.live.episodes)} episodes, cameras "
            f"{list(c.camera_names)} {self.env.config.image_hw} at {c.camera_rate_hz:g} Hz, state at "
            f"{c.state_rate_hz:g} Hz, {c.command_type} commands on {c.command_topic}")

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        ret = super().on_activate(state)  # publishers on; the executor thread on SCHED_FIFO below physics'
        self._active = True
        self._running.set()
        self.get_logger().info("active: physics running on the wall clock")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._active = False
        self._running.clear()
        return super().on_deactivate(state)

    def release(self) -> None:
        self._truth_pub = None
        self.live = self.env = None

    def _start_thread(self, make_env, warm: list[tuple[str, int]]) -> None:
        """The simulator thread: builds the env and each task's world, then runs physics while active.
        Raises what building raised."""
        ready = threading.Event()
        error: list[BaseException] = []

        def body():
            try:
                self.env = make_env()
                for task, seed in warm:
                    self.env.reset(task, seed)
            except BaseException as e:  # reported by configure
                error.append(e)
                if self.env is not None:  # built, then a world failed: closed on its own thread
                    with contextlib.suppress(Exception):
                        self.env.close()
                ready.set()
                return
            ready.set()
            rt = FifoScope()  # this thread's SCHED_FIFO, put back when it ends
            p = self.cfg.realtime_priority
            self._realtime = p > 0 and rt.apply_or_warn(p, self.get_logger(), "physics thread")
            try:
                self._physics_loop()
            finally:
                self.env.close()
                rt.restore()

        self._stop.clear()
        self._thread = threading.Thread(target=body, name="physics", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            self._thread.join(timeout=5.0)
            self._thread = None
            raise error[0]

    def stop(self) -> bool:
        """Tell the physics thread to end and join it for up to ``stop_timeout_s``, logging an error each
        second it still runs. True once no physics thread runs; one that did not end is kept (not dropped)."""
        self._active = False
        self._running.clear()
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        if not join_or_report(thread, self.stop_timeout_s, self.get_logger(), "physics thread"):
            return False
        self._thread = None
        self._realtime = False
        return True

    # inputs ----------------------------------------------------------------------------------------------
    def _on_command(self, msg) -> None:
        if self.live is None:
            return
        before = self.live.rejected_total
        try:
            names, positions, stamp = command_fields(msg)
            self.live.command(names, positions, stamp, self._now())
        except (ValueError, TypeError) as e:
            self.live.refuse(str(e))
        if self.live.rejected_total != before:
            self._last_reject_at = time.monotonic()
            self.get_logger().warning(f"command refused, the arm holds: {self.live.last_rejection}",
                                      throttle_duration_sec=2.0)

    def _on_reset(self, msg: String) -> None:
        if self.live is None:
            return
        text = msg.data.strip()
        try:
            self.live.request(parse_episode(text, self.live.tasks) if text else None)
        except ValueError as e:
            self.get_logger().warning(f"reset request {text!r} refused: {e}")
            return
        self.get_logger().info(f"reset requested: {text or 'end the current episode'}")

    # physics thread --------------------------------------------------------------------------------------
    def _physics_loop(self) -> None:
        pacer = Pacer(1.0 / self.cfg.state_rate_hz, 1.0 / self.cfg.camera_rate_hz, gaps_ms=self.loop_gap_ms)
        while not self._stop.is_set() and self.context.ok():
            if not self._running.is_set():  # inactive: nothing moves, nothing is published
                self._stop.wait(0.05)
                pacer.restart()
                continue
            t_loop = pacer.begin()
            try:
                now = self._now()
                events = self.live.update(now)
                self.step_ms.add((time.monotonic() - t_loop) * 1e3)
                for ev in events:
                    self._on_event(ev)
                if self.live.current is not None:
                    self._publish_state(now)
                    if pacer.camera_due(t_loop):
                        t0 = time.monotonic()
                        self._publish_cameras(now)
                        self.render_ms.add((time.monotonic() - t0) * 1e3)
                        pacer.camera_sent(t_loop)  # fell behind: no burst of frames, just the next one on time
            except Exception as e:  # context gone at shutdown, or a simulator error
                if not self.context.ok() or self._stop.is_set():
                    break
                self.get_logger().error(f"physics loop: {e!r}", throttle_duration_sec=2.0)
            pacer.wait(self._stop)  # more than a tick behind: skips to the grid (the next update catches up)

    def _publish_state(self, now: float) -> None:
        s = self.env.state()  # float32 (4,): ee xyz, gripper opening
        m = JointState(name=list(self.cfg.joint_names), position=[float(x) for x in s])
        m.header.stamp = to_stamp(now)
        self._state_pub.publish(m)
        if self._truth_pub is not None:
            g = JointState(name=self._truth_names, position=[float(x) for x in self.env.observation()])
            g.header.stamp = m.header.stamp
            self._truth_pub.publish(g)

    def _publish_cameras(self, now: float) -> None:
        frames = self.live.camera(self.env.render())  # name -> uint8 (H, W, 3), the episode's camera condition
        for i, name in enumerate(self.cfg.camera_names):
            rgb = frames[name]
            self._image_pubs[i].publish(rgb_to_image_msg(rgb, now, frame_id=name))
            if self._jpeg_pubs:
                m = CompressedImage(format="jpeg", data=encode_jpeg(rgb, 90))
                m.header.stamp, m.header.frame_id = to_stamp(now), name
                self._jpeg_pubs[i].publish(m)

    def _on_event(self, ev: dict) -> None:
        log = self.get_logger()
        kind = ev["event"]
        if kind == "start":
            h = Header(frame_id=f"{ev['task']}:{ev['seed']}")
            h.stamp = to_stamp(ev["t"])
            self._start_pub.publish(h)
            self._task_pub.publish(String(data=ev["instruction"]))
            log.info(f"episode {ev['episode']} start: {ev['task']} seed {ev['seed']}: {ev['instruction']!r}")
        elif kind == "done":
            log.info(f"all {ev['episodes']} episodes done; holding")
        else:
            rec = self.live.finished[-1]
            log.info(f"episode {ev['episode']} {kind} after {ev['elapsed_s']:.2f}s "
                     f"({rec.commands} commands, {rec.rejected} refused, real-time factor "
                     f"{rec.result()['real_time_factor']:.3f})")
            if self.cfg.results_path:
                try:
                    append_result(self.cfg.results_path, rec.result())
                except OSError as e:
                    self.get_logger().error(f"results_path: {e}")
        self._event_pub.publish(String(data=json.dumps(ev)))

    # diagnostics -----------------------------------------------------------------------------------------
    def diagnostics(self) -> tuple[bytes, str, dict]:
        values: dict[str, object] = {"realtime": self._realtime}
        level, message = diag.OK, "running"
        live = self.live
        if live is not None:
            values.update(live_values(live, self.cfg.joint_names))
            for name, st in (("render_ms", self.render_ms), ("physics_update_ms", self.step_ms),
                             ("loop_period_ms", self.loop_gap_ms)):
                values.update(st.summary(name, 1.0))
            if live.last_rejection:
                values["last_rejection"] = live.last_rejection
            since = time.monotonic() - self._last_reject_at
            if since < REJECT_WARN_S:
                level = diag.WARN
                message = (f"commands refused, the arm held ({live.rejected_total} so far, the last {since:.1f}s ago): "
                           f"{live.last_rejection}")
            else:
                message = live_message(live)
        return level, message, values


def main(args=None) -> int:
    sys.setswitchinterval(0.001)  # the physics thread gets the GIL back soon after a callback takes it
    return run_node(SimNode, SimNodeConfig.NODE, args, stop=SimNode.stop_for_exit)


if __name__ == "__main__":
    sys.exit(main())

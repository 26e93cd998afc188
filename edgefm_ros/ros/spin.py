"""Running one node as a process (init, build, spin, stop cleanly, exit status), and the spin loop of an
executor that serves a process's other work from a thread."""
from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import time
from typing import Callable

import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from edgefm_ros.housekeeping import shm

try:  # rclpy's executor written in C++ (Jazzy: rclpy.experimental)
    from rclpy.experimental import EventsExecutor
except ImportError:  # an older rclpy: the Python one
    EventsExecutor = None

# Launch files set this for the nodes they start: a node whose launcher died (SIGKILL, or `ros2 launch`'s
# own SIGTERM handling, which leaves its processes running) shuts down as if it had been sent SIGTERM.
EXIT_WITH_PARENT_ENV = "EDGEFM_EXIT_WITH_PARENT"
# A shutdown request repeated this long after the first ends the process at once (a model still loading in
# a lifecycle transition cannot be interrupted; `ros2 launch` sends SIGTERM 5 s after SIGINT, then SIGKILL).
# Requests closer together are one: a terminal's Ctrl-C reaches every process of the group and `ros2 launch`
# forwards it as well.
FORCE_AFTER_S = 2.0
# Once the node's own threads are stopped, the rest of a shutdown (executor, node, context, DDS participant) takes
# well under a second. Stuck longer than this in native code, where no Python signal handler can run, it dumps
# every thread's Python stack to stderr (the launch log) and exits with status 1, instead of waiting for `ros2
# launch` to escalate to SIGKILL with nothing said.
SHUTDOWN_WATCHDOG_S = 4.0
# Leaving after the launcher, how long a node waits for a sibling with a lower pid to unmap the ports both wrote
# to while leaving (clean_after_launcher): siblings stopped together end within a few hundred ms of each other.
SIBLING_WAIT_S = 1.0


class ShutdownRequest:
    """SIGINT and SIGTERM as a flag the spin loop polls, instead of rclpy's handlers: those shut the
    context down from a signal thread while the node's own threads still publish, and raise
    KeyboardInterrupt at whatever line the main thread is on, cleanup included."""

    def __init__(self, logger) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self._first = 0.0
        self._logger = logger
        self._parent = os.getppid() if os.environ.get(EXIT_WITH_PARENT_ENV) == "1" else None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        now = time.monotonic()
        if not self.event.is_set():
            self.signal, self._first = signum, now
            self.event.set()
        elif now - self._first >= FORCE_AFTER_S:
            # still not down (a blocking transition, a long join): the launcher's next step is SIGKILL;
            # _exit runs no finalizer while other threads may still be inside rcl
            os._exit(0)

    def parent_gone(self) -> bool:
        return self._parent is not None and os.getppid() != self._parent

    def ignore_further(self) -> None:
        """Once cleaned up: further SIGINT/SIGTERM are ignored. Python's finalization restores the default
        action of a signal that has a Python handler, and a second Ctrl-C (the terminal's and the launcher's
        arrive apart) would then kill the exiting process (status -2 instead of 0)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)

    def requested(self) -> bool:
        if not self.event.is_set() and self.parent_gone():
            self._logger.warning("launcher process exited: shutting down")
            self.signal = signal.SIGTERM
            self.event.set()
        return self.event.is_set()


def run_node(make: Callable[[], object], name: str, args=None, stop: Callable[[object], None] | None = None,
             exit_process: bool = True) -> int:
    """Build the node with ``make()`` and spin it until SIGINT or SIGTERM (or, started by a launch file, its
    launcher's death); exit status 0.

    The order at shutdown: the spin loop ends (no callback runs after it), ``stop(node)`` stops and joins
    the node's own threads (control loop, inference worker: nothing publishes after it), the node is
    destroyed, rclpy shut down and its context finalized (the DDS participant deleted: the other nodes see
    it leave). Then, with ``exit_process``, the process ends at once (``exit_now``) instead of returning:
    the interpreter's finalization would run the DDS library's static destructors while its own threads
    (shared-memory watchdog, receivers) still run, and that sometimes corrupted the heap or exited with 255
    (3 of 40 Ctrl-Cs of the full graph with data flowing: malloc_consolidate aborts, exits with 255; 0
    of 20 without it: tools/launch_cycles.py). Invalid parameters
    (ValueError / ParameterException raised while building) are logged as fatal with the reason and give
    exit status 2.
    """
    request = ShutdownRequest(rclpy.logging.get_logger(name))
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    context = rclpy.get_default_context()
    node, invalid = None, None
    try:
        node = make()
    except (ValueError, ParameterException) as e:
        invalid = str(e)
    if invalid is not None:
        rclpy.logging.get_logger(name).fatal(f"invalid parameters: {invalid}")
        # the exception's traceback held the half-built node; collected now (outside the except block), with
        # the rcl node its lifecycle state machine holds, or the context cannot finalize and the participant's
        # shared-memory segments outlive the process
        gc.collect()
        rclpy.try_shutdown()
        context.destroy()
        request.ignore_further()
        return exit_now(2) if exit_process else 2
    executor = process_executor()
    executor.add_node(node)
    try:
        while not request.requested() and context.ok():
            try:
                executor.spin_once(timeout_sec=0.1)
            except ExternalShutdownException:
                break
    finally:
        if request.signal is not None:
            node.get_logger().info(f"{signal.Signals(request.signal).name}: shutting down")
        if stop is not None:
            stop(node)  # its joins have their own time limits, and report
        if exit_process:  # the rest runs in native code, where the main thread cannot run a signal handler
            faulthandler.dump_traceback_later(SHUTDOWN_WATCHDOG_S, exit=True)
        executor.remove_node(node)
        executor.shutdown(timeout_sec=1.0)
        destroy_node(node)
        finish(request, node.get_logger())
    return exit_now(0) if exit_process else 0


def finish(request: ShutdownRequest, logger) -> None:
    """The end of a ROS process, once its nodes are destroyed: rclpy shut down and its context finalized (the
    DDS participant deleted now, not by the interpreter's finalization), further signals ignored, and, when the
    launcher died first, the shared-memory files nobody uses removed (``clean_after_launcher``), outside the
    shutdown watchdog."""
    context = rclpy.get_default_context()
    rclpy.try_shutdown()
    context.destroy()
    # the native teardown is over: the shutdown watchdog (run_node) covered it, and stops here. The clean-up
    # below is Python with its own bound (SIBLING_WAIT_S); under the watchdog, its wait for siblings on a
    # loaded 2-core machine ran past SHUTDOWN_WATCHDOG_S and ended the process with status 1 half-way
    # through, leaving the launcher's files behind
    faulthandler.cancel_dump_traceback_later()
    request.ignore_further()
    if request.parent_gone():
        clean_after_launcher(logger)


def clean_after_launcher(logger, shm_dir=shm.SHM_DIR, wait_s: float | None = None) -> None:
    """The launcher died first (``ros2 launch`` ends at once on SIGTERM, by design, and SIGKILL ends anything):
    its own DDS participant's shared-memory files, which its exit left, are removed by the nodes it started,
    as they go; a file some live process uses is never touched (edgefm_ros.housekeeping.shm). This process's
    own mappings do not count: its participant is gone, and a port it wrote to while leaving (a peer's, whose
    owner had already removed it, re-created by the write) stays mapped by it until it exits.

    Nodes stopped together write to the same departed peers' ports as they leave, and each such port is then
    mapped by the others: each would leave it to the others, and the last to go would leave it behind. So a
    sibling (same parent, once orphaned: the subreaper or init) with a lower pid that still maps such a port
    is waited for, up to ``SIBLING_WAIT_S``, and the clean-up runs again: the highest pid is the last to clean."""
    me = os.getpid()
    try:
        r = shm.clean(shm_dir, exclude_pids=(me,))
        held = shm.mappers(shm.unlocked_ports(shm_dir), shm_dir, exclude_pids=(me,))
        lower = sorted(p for p in held if p < me and _parent_of(p) == os.getppid())
        if lower:
            deadline = time.monotonic() + (SIBLING_WAIT_S if wait_s is None else wait_s)
            ports = set().union(*(held[p] for p in lower))
            while time.monotonic() < deadline and shm.mapped_by(lower, shm_dir) & ports:
                time.sleep(0.02)
            again = shm.clean(shm_dir, exclude_pids=(me,))
            r.removed = sorted(set(r.removed) | set(again.removed))
            r.removed_bytes += again.removed_bytes
    except OSError as e:
        logger.warning(f"shared-memory clean-up after the launcher's exit failed: {e}")
        return
    if r.removed:
        logger.info(f"launcher gone: {r.summary()}")


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def destroy_node(node) -> None:
    """``node.destroy_node()``, and for a lifecycle node its state machine as well.

    rclpy's LifecycleNode keeps its state machine (a native object holding the node's handle) until the
    Python object is collected; ``destroy_node`` alone leaves the rcl node alive, so the context cannot
    finalize and the DDS participant is never deleted. Its shared-memory segments (Fast DDS removes them
    when the participant goes) then outlive the process that exits without finalizers (``exit_now``):
    about 70 MB in /dev/shm per lifecycle node and stop."""
    node.destroy_node()
    machine = getattr(node, "_state_machine", None)
    if machine is not None:
        machine.destroy_when_not_in_use()


def process_executor():
    """The executor that serves a node process: rclpy's C++ EventsExecutor where rclpy has it. The Python
    SingleThreadedExecutor rebuilds its wait set in Python for every callback: in vla_node, taking 90 raw
    camera frames a second, its thread used 13.7% of a core, which the model's two threads had to give up
    on a 2-core robot; the C++ one used 6.7%, and a FULL fast chunk in the 50 Hz graph took 730 ms instead
    of 820-860 (benchmarks/bench_control_rate.py --preset realtime)."""
    return EventsExecutor() if EventsExecutor is not None else SingleThreadedExecutor()


def exit_now(code: int) -> int:
    """End the process with ``code`` once everything is cleaned up: stdio flushed, no finalizers run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader went away (a launcher killed): nothing left to say
            pass
    os._exit(code)


def spin_until_shutdown(executor, context, stop: threading.Event | None = None, period_s: float = 0.05) -> None:
    """``executor.spin_once`` until ``context`` shuts down (or ``stop`` is set); an error raised because the
    context went down mid-spin ends the loop, any other is raised."""
    while context.ok() and not (stop is not None and stop.is_set()):
        try:
            executor.spin_once(timeout_sec=period_s)
        except ExternalShutdownException:
            break
        except Exception:
            if not context.ok():
                break
            raise

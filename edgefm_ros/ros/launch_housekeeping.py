"""What every launch file of this package does so that a launch leaves the machine as it found it.

- At start: Fast DDS shared-memory files that no live process uses are removed (edgefm_ros.housekeeping.shm):
  what earlier runs killed by SIGKILL, the OOM killer or a crash left behind.
- When a process of the launch dies abnormally (a supervisor's SIGKILL, a crash): the same clean-up, so a node
  that launch respawns does not add another dead participant's segments on every restart.
- At exit of ``ros2 launch`` itself: launch_ros's own ROS context (its node subscribes to the lifecycle nodes'
  transition events) is finalized, and the clean-up runs once more. launch_ros shuts that context down but never destroys it, and
  the DDS participant it holds, with its two shared-memory segments, outlived every launch.

    LaunchDescription([*housekeeping_actions(), ...])
"""
from __future__ import annotations

import atexit
import os
import signal

from launch.actions import OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit, OnProcessStart
from launch.logging import get_logger

from edgefm_ros.housekeeping import shm

_LOG = "edgefm.housekeeping"
# a launch file that includes another (replay.launch.py includes edgefm.launch.py) runs these actions twice
_done: set = set()
_own_files: list[str] = []  # this process's Fast DDS files (launch_ros's participant), once it has them


def housekeeping_actions() -> list:
    """The launch actions above, first in a launch description."""
    return [OpaqueFunction(function=_at_start),
            RegisterEventHandler(OnProcessStart(on_start=_remember_own_files)),
            RegisterEventHandler(OnProcessExit(on_exit=_after_exit))]


def _clean(when: str) -> None:
    try:
        r = shm.clean()
    except OSError as e:  # never let the clean-up stop a launch
        get_logger(_LOG).warning(f"{when}: shared-memory clean-up failed: {e}")
        return
    if r.removed:
        get_logger(_LOG).info(f"{when}: {r.summary()}")


def _at_start(context):
    if "start" in _done:
        return []
    _done.add("start")
    _clean("start")
    atexit.register(_at_exit, context)
    _remove_own_files_on_sigterm()
    return []


def _remove_own_files_on_sigterm() -> None:
    """Upstream ``ros2 launch`` has no SIGTERM handler: it dies of the signal on the spot (by design: its
    processes are left to end on their own, ours follow their launcher), and its participant's files stayed.
    This handler unlinks the files the process owns, then lets SIGTERM end it exactly as before."""
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _die_of_sigterm)
    except ValueError:  # not the main thread (a launch service run inside another program): leave it
        pass


def _remember_own_files(event, context):
    """launch_ros's participant exists once a process has started: its files are looked up now, so that the
    SIGTERM handler only unlinks them (a slow handler would let the launcher reap a child it then never
    reports). Looked up again at every start: the first start may come while the participant is still
    opening its ports, and a file missed then would outlive the launcher."""
    _own_files.extend(n for n in shm.owned_by(os.getpid()) if n not in _own_files)
    return []


def _die_of_sigterm(signum, frame) -> None:
    try:
        shm.remove_owned(os.getpid(), names=_own_files or None)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)



def _after_exit(event, context):
    if event.returncode not in (0, None) and event.pid not in _done:
        _done.add(event.pid)
        _clean(f"{event.action.process_details['name']} exited with {event.returncode}")
    return []


def _at_exit(context) -> None:
    """After every process of the launch has ended: launch_ros's context finalized, then one more clean-up
    (a killed node's listening ports stay mapped by its peers until they go; only now nobody uses them)."""
    _finalize_launch_ros(context)
    _clean("exit")


def _finalize_launch_ros(context) -> None:
    try:
        adapter = context.locals.ros_adapter
    except AttributeError:  # no launch_ros action ran: no ROS context was made
        return
    ctx = getattr(adapter, "ros_context", None)
    if ctx is None:
        return
    try:
        from rclpy.utilities import try_shutdown  # rclpy is loaded already by launch_ros: no new import cost
        try_shutdown(context=ctx)
        ctx.destroy()
    except Exception as e:  # noqa: BLE001 - exiting anyway; say why the participant may stay
        get_logger(_LOG).warning(f"could not finalize launch_ros's ROS context: {e}")

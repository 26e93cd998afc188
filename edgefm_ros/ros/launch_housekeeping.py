"""What every launch file of this package does so that a launch leaves the machine as it found it.

- At start: Fast DDS shared-memory files that no live process uses are removed (edgefm_ros.housekeeping.shm):
  what earlier runs killed by SIGKILL, the OOM killer or a crash left behind.
- When a process of the launch dies abnormally (a supervisor's SIGKILL, a crash): the same clean-up, so a node
  that launch respawns does not add another dead participant's segments on every restart.
- At exit of ``ros2 launch`` itself: launch_ros's own ROS context (its node subscribes to the lifecycle nodes'
  transition events) is finalized. launch_ros shuts that context down but never destroys it, and
  the DDS participant it holds, with its two shared-memory segments, outlived every launch.

    LaunchDescription([*housekeeping_actions(), ...])
"""
from __future__ import annotations

import atexit

from launch.actions import OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.logging import get_logger

from edgefm_ros.housekeeping import shm

_LOG = "edgefm.housekeeping"
# a launch file that includes another (replay.launch.py includes edgefm.launch.py) runs these actions twice
_done: set = set()


def housekeeping_actions() -> list:
    """The launch actions above, first in a launch description."""
    return [OpaqueFunction(function=_at_start),
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
    atexit.register(_finalize_launch_ros, context)
    return []


def _after_exit(event, context):
    if event.returncode not in (0, None) and event.pid not in _done:
        _done.add(event.pid)
        _clean(f"{event.action.process_details['name']} exited with {event.returncode}")
    return []


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

"""ManagedNode: the lifecycle shell every edgefm node shares, so that a node holds only its callbacks, its own
threads and what it reports.

The base owns:
- parameters: the node's declaration (``CONFIG``, an edgefm_ros.params ``NodeConfig``) declared at
  construction (``self.values``) and read into the typed ``self.cfg`` at configure (ValueError naming a bad
  value: configure fails). A parameter declared changeable at runtime is checked against its spec when set,
  then handed to ``apply_parameters`` (which may refuse it with a ValueError); the reason reaches the caller.
- diagnostics: a /diagnostics publisher and timer from construction; the node's ``diagnostics()`` gives its
  level, message and values, the base adds the lifecycle state (an unconfigured node reports only that).
- autostart: with the ``autostart`` parameter, configure then activate once the node is constructed (its own
  __init__ has returned).
- what configure makes: every publisher, subscription and timer the node creates in ``configure`` is
  destroyed when it releases (cleanup, shutdown, error processing, a failed configure), after its
  ``release()`` has closed everything else it holds. No hand-written list.
- the node's own threads: ``stop()`` ends them (at deactivate as the node decides, at release, before the
  process exits: ``stop_for_exit``). While one still runs after its bound, release gives nothing up, since
  the thread may use it: cleanup fails and error processing ends finalized.
- SCHED_FIFO: with a ``realtime_priority`` parameter above 0, the executor thread runs SCHED_FIFO one below it
  while active (it holds the GIL in callbacks; below the node's real-time thread, above everything else, so it
  is never preempted while that thread waits for the GIL); ``executor_rt`` puts back what it had.

A node::

    class ActionNode(ManagedNode):
        CONFIG = ActionNodeConfig            # its declaration (edgefm_ros/params/action.py)
        STATUS = "control"                   # its /diagnostics status: "action_node: control"

        def configure(self, cfg): ...        # acquire everything; raise to fail
        def on_activate(self, state): ...    # calls super().on_activate(state): publishers on, SCHED_FIFO
        def stop(self) -> bool: ...          # end its threads; False while one still runs
        def release(self): ...               # close what configure made that is not a publisher, ...
        def diagnostics(self): return level, message, values
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

from rcl_interfaces.msg import SetParametersResult
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from edgefm_ros.params.spec import NodeConfig
from edgefm_ros.ros import diagnostics as diag
from edgefm_ros.ros import qos
from edgefm_ros.ros.params import check_set, declare
from edgefm_ros.threads.realtime import FifoScope

STOP_TIMEOUT_S = 5.0  # a transition waits this long for the node's own threads to end
SUCCESS, FAILURE, ERROR = (TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE,
                           TransitionCallbackReturn.ERROR)


class _StartsOnceBuilt(type):
    """Autostart runs after the most derived __init__ has returned: configure needs the node's own state."""

    def __call__(cls, *args, **kwargs):
        node = super().__call__(*args, **kwargs)
        node._autostart()
        return node


class ManagedNode(LifecycleNode, metaclass=_StartsOnceBuilt):
    CONFIG: ClassVar[type[NodeConfig]]
    STATUS: ClassVar[str]

    def __init__(self, **kwargs):
        super().__init__(self.CONFIG.NODE, **kwargs)
        self.values = declare(self, self.CONFIG.PARAMS)
        self.cfg = None  # the typed config while configured
        self.executor_rt = FifoScope()  # the executor thread's SCHED_FIFO while active, and what it had before
        self.stop_timeout_s = STOP_TIMEOUT_S
        self._made: list[tuple[object, Callable]] = []  # what configure created, with its destroy call
        self._making = False
        if any(not s.read_only for s in self.CONFIG.PARAMS):
            self.add_on_set_parameters_callback(self._on_set_parameters)
        self._diag_pub = self.create_publisher(diag.DiagnosticArray, "/diagnostics", qos.DIAGNOSTICS)
        self._diag_timer = self.create_timer(self.values["diagnostics_period_s"], self._publish_diagnostics)

    def _autostart(self) -> None:
        if self.values["autostart"] and self.trigger_configure() == SUCCESS:
            self.trigger_activate()

    # what a node implements ------------------------------------------------------------------------------
    def configure(self, cfg) -> None:
        """Acquire everything the node holds while configured; raise to fail (ValueError naming the value)."""

    def stop(self) -> bool:
        """End the node's own threads; False while one still runs after ``stop_timeout_s``."""
        return True

    def release(self) -> None:
        """Close and drop what configure made, other than publishers, subscriptions and timers (those go
        after it), whatever part of configure was done."""

    def apply_parameters(self, changed: dict) -> None:
        """Runtime-changeable parameters being set (already checked against their specs); ValueError
        refuses them, with its text as the reason."""

    def diagnostics(self) -> tuple[bytes, str, dict]:
        """(level, message, values) of the node's status while configured."""
        return diag.OK, "running", {}

    # entities made while configuring -----------------------------------------------------------------------
    def _track(self, entity, destroy: Callable):
        if getattr(self, "_making", False):  # rclpy's own, made while Node.__init__ runs, are not ours
            self._made.append((entity, destroy))
        return entity

    def create_publisher(self, *args, **kwargs):
        return self._track(super().create_publisher(*args, **kwargs), self.destroy_publisher)

    def create_lifecycle_publisher(self, *args, **kwargs):
        return self._track(super().create_lifecycle_publisher(*args, **kwargs), self.destroy_lifecycle_publisher)

    def create_subscription(self, *args, **kwargs):
        return self._track(super().create_subscription(*args, **kwargs), self.destroy_subscription)

    def create_timer(self, *args, **kwargs):
        return self._track(super().create_timer(*args, **kwargs), self.destroy_timer)

    # transitions ---------------------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._making = True
        try:
            self.cfg = self.CONFIG.from_values(self.values)
            self.configure(self.cfg)
        except Exception as e:  # bad parameters, model, topic names ...: unconfigured, holding nothing
            self._making = False
            self.get_logger().error(f"configure failed: {e}")
            self._release()
            return FAILURE
        self._making = False
        return super().on_configure(state)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        ret = super().on_activate(state)  # lifecycle publishers on
        priority = getattr(self.cfg, "realtime_priority", 0)
        if priority > 0:  # put back at deactivate
            self.executor_rt.apply_or_warn(max(1, priority - 1), self.get_logger(), "executor thread")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._restore_executor_scheduling()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        return super().on_cleanup(state) if self._release() else FAILURE

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """After a transition erred: unconfigured with everything released once the node's threads have
        ended; finalized (FAILURE) while one still runs, holding what it uses."""
        if not self._release():
            self.get_logger().error("a thread of the node is still running: the node is finalized")
            return FAILURE
        return super().on_error(state)

    def stop_for_exit(self) -> None:
        """Before the process exits (ros/spin.run_node): the node's threads stopped and the executor thread's
        scheduling put back."""
        self.stop()
        self._restore_executor_scheduling()

    def _release(self) -> bool:
        """Undo configure (and activate), whatever part of it was done. False, releasing nothing, while a
        thread of the node still runs."""
        if not self.stop():
            return False
        self._restore_executor_scheduling()
        self.release()
        while self._made:
            entity, destroy = self._made.pop()
            destroy(entity)
        self.cfg = None
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

    # runtime parameters, diagnostics -----------------------------------------------------------------------
    def _on_set_parameters(self, params) -> SetParametersResult:
        try:
            changed = check_set(self.CONFIG.PARAMS, params)
            if not changed:
                return SetParametersResult(successful=True)
            cfg = dataclasses.replace(self.cfg, **changed) if self.cfg is not None else None
            self.apply_parameters(changed)
        except ValueError as e:
            return SetParametersResult(successful=False, reason=str(e))
        self.values.update(changed)
        if self.cfg is not None:
            self.cfg = cfg
        return SetParametersResult(successful=True)

    def _now(self) -> float:
        """The node clock's time, seconds (header stamps are on it)."""
        return self.get_clock().now().nanoseconds * 1e-9

    @property
    def lifecycle_state(self) -> str:
        """unconfigured, inactive, active, finalized (or a transition's label while one runs)."""
        return self._state_machine.current_state[1]

    def _publish_diagnostics(self) -> None:
        if not self.context.ok():
            return
        if self.cfg is None:
            level, message, values = diag.WARN, "unconfigured", {}
        else:
            level, message, values = self.diagnostics()
        diag.publish_status(self, self._diag_pub, self.STATUS, level, message,
                            {"state": self.lifecycle_state, **values})

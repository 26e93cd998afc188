"""Subscriptions whose newest message is taken only when asked, outside the node's executor.

A camera at 30 Hz sends frames the model never sees: vla_node uses one per camera per chunk. Taking each
480x640 frame from DDS, deserialising it into Python and converting it cost vla_node's executor thread
70-100% of a core with three cameras on a 2-core Intel host (6% on a Zen 4 one), a core the model needed.
Here the subscriptions belong to a helper node that no executor spins. Each keeps only its newest message
(depth 1: DDS overwrites the older one, which is never taken or converted), and ``take()``, called where the
data is needed (the worker, when a chunk is requested), takes the message waiting on each subscription, if
any, and runs its callback on the calling thread.

Why not a private executor spun by ``take()``: rclpy's executor keeps the generator of its last wait between
``spin_once`` calls, and with a zero timeout that generator's next step raises a timeout whatever is waiting.
So a spin after one that emptied the wait set did nothing: with three topics and three spins per take, each
take left one of the last two topics (in turn) holding the message of the take before. The subscription's
own take (what the executor calls) has no such state.

The helper node is ``<owner>_<suffix>`` in the owner's namespace; the process's remappings apply to it as to
the owner (its own name excepted).
"""
from __future__ import annotations

import threading
from typing import Callable

import rclpy
from rclpy.qos import QoSProfile


class OnDemandSubscriptions:
    """Subscriptions of ``owner``'s process whose callbacks run only in ``take()``, newest message each."""

    def __init__(self, owner, suffix: str = "on_demand") -> None:
        name = f"{owner.get_name()}_{suffix}"
        # the process's own `-r __node:=` would rename this node to the owner's name: its own name wins
        self.node = rclpy.create_node(name, namespace=owner.get_namespace(), context=owner.context,
                                      cli_args=["--ros-args", "-r", f"__node:={name}"],
                                      start_parameter_services=False)
        self._log = owner.get_logger()
        self._subs: list = []  # (subscription, topic)
        self._lock = threading.Lock()  # take() from the worker and from diagnostics
        self.taken = 0  # messages delivered by take()
        self.failed = 0  # takes that raised (logged; the other subscriptions are still taken)
        # a process that exits while the owner is active (never cleaned up) shuts its context down: this node
        # must be gone by then, or the context cannot finalize and the DDS participant, with its shared-memory
        # segments, outlives the process (edgefm_ros/ros/spin.py)
        owner.context.on_shutdown(self.close)

    def subscribe(self, msg_type, topic: str, callback: Callable, qos: QoSProfile) -> None:
        """``callback(msg)`` for the newest message on ``topic`` at each ``take()``; ``qos`` must keep one
        message (KEEP_LAST, depth 1), or take() would deliver the oldest waiting ones first."""
        if qos.depth != 1:
            raise ValueError(f"an on-demand subscription keeps the newest message only: qos depth must be 1, "
                             f"got {qos.depth}")
        self._subs.append((self.node.create_subscription(msg_type, topic, callback, qos), topic))

    def take(self) -> None:
        """Run each subscription's callback on the message waiting there now, if any, on this thread."""
        with self._lock:
            for sub, topic in self._subs:
                try:
                    with sub.handle:  # rclpy's executor takes a message the same way
                        got = sub.handle.take_message(sub.msg_type, sub.raw)  # (message, info) or None
                except Exception as e:  # a message the middleware cannot deserialise: logged, never raised
                    self.failed += 1
                    self._log.warning(f"cannot take a message on {topic}: {e}", throttle_duration_sec=2.0)
                    continue
                if got is not None:
                    self.taken += 1
                    sub.callback(got[0])

    def close(self) -> None:
        with self._lock:
            self._subs = []
            if self.node is not None:
                self.node.destroy_node()
                self.node = None


__all__ = ["OnDemandSubscriptions"]

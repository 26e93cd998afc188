"""Subscriptions whose newest message is taken only when asked, outside the node's executor.

A camera at 30 Hz sends frames the model never sees: vla_node uses one per camera per chunk. Taking each
480x640 frame from DDS, deserialising it into Python and converting it cost vla_node's executor thread
70-100% of a core with three cameras on a 2-core host, a core the model needed. Here the subscriptions
belong to a helper node in a private executor that no thread spins. Each keeps only its newest message
(depth 1: DDS overwrites the older one, which is never taken or converted), and ``take()``, called where the
data is needed (the worker, when a chunk is requested), runs the callbacks of the messages waiting then.

The helper node is ``<owner>_<suffix>`` in the owner's namespace; the process's remappings apply to it as to
the owner (its own name excepted).
"""
from __future__ import annotations

import threading
from typing import Callable

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile


class OnDemandSubscriptions:
    """Subscriptions of ``owner``'s process whose callbacks run only in ``take()``, newest message each."""

    def __init__(self, owner, suffix: str = "on_demand") -> None:
        name = f"{owner.get_name()}_{suffix}"
        # the process's own `-r __node:=` would rename this node to the owner's name: its own name wins
        self.node = rclpy.create_node(name, namespace=owner.get_namespace(), context=owner.context,
                                      cli_args=["--ros-args", "-r", f"__node:={name}"],
                                      start_parameter_services=False)
        self._executor = SingleThreadedExecutor(context=owner.context)
        self._executor.add_node(self.node)
        self._lock = threading.Lock()  # take() from the worker and from diagnostics
        self.taken = 0  # messages delivered by take()

    def subscribe(self, msg_type, topic: str, callback: Callable, qos: QoSProfile) -> None:
        """``callback(msg)`` for the newest message on ``topic`` at each ``take()``; ``qos`` must keep one
        message (KEEP_LAST, depth 1), or take() would deliver the oldest waiting ones first."""
        if qos.depth != 1:
            raise ValueError(f"an on-demand subscription keeps the newest message only: qos depth must be 1, "
                             f"got {qos.depth}")

        def counted(msg) -> None:
            self.taken += 1
            callback(msg)

        self.node.create_subscription(msg_type, topic, counted, qos)

    def take(self) -> None:
        """Run the callbacks of the messages waiting now (at most one per subscription), on this thread."""
        with self._lock:
            # each spin runs one ready callback or returns at once; the node's own subscriptions (/clock
            # under use_sim_time) count too
            for _ in range(sum(1 for _ in self.node.subscriptions)):
                self._executor.spin_once(timeout_sec=0.0)

    def close(self) -> None:
        with self._lock:
            self._executor.remove_node(self.node)
            self._executor.shutdown(timeout_sec=0.0)
            self.node.destroy_node()


__all__ = ["OnDemandSubscriptions"]

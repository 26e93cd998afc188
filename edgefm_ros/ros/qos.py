"""Named QoS profiles used by the nodes and tools."""
from __future__ import annotations

import time

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

# Cameras and joint states: the newest sample matters, a lost one does not (REP 2003 sensor data).
SENSOR = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=5, reliability=ReliabilityPolicy.BEST_EFFORT,
                    durability=DurabilityPolicy.VOLATILE)
# Cameras read on demand (ros/on_demand.py): the newest frame only, older ones overwritten unread.
SENSOR_NEWEST = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                           durability=DurabilityPolicy.VOLATILE)
# The instruction's publishers (bag replay, sim_node, a task planner): a late subscriber still gets the
# current task.
LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
# The instruction's subscriptions (instruction_subscriptions): a live one that any reliable publisher
# matches, a volatile one too (`ros2 topic pub --once /instruction std_msgs/msg/String ...`), and a latched
# one, so that a node started late still gets the task a latched publisher holds. One profile cannot do
# both: a transient-local reader refuses volatile writers, and Jazzy's BEST_AVAILABLE durability is
# resolved when the subscription is made, to transient local when no publisher is known yet.
INSTRUCTION_LIVE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                              durability=DurabilityPolicy.VOLATILE)
# Action chunks and robot commands: every message counts.
RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)
# Queue status (every control tick) and route decisions: only the latest is used. Best effort subscribes
# to any publisher whatever its reliability.
LATEST = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                    durability=DurabilityPolicy.VOLATILE)
# /diagnostics, as diagnostic_updater publishes it.
DIAGNOSTICS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)


def instruction_subscriptions(node, msg_type, topic: str, callback, same_within_s: float = 1.0) -> list:
    """Both instruction subscriptions (INSTRUCTION_LIVE and LATCHED) with one callback. A latched
    publisher's message reaches both: the copy that arrives on the other subscription within
    ``same_within_s`` is dropped (a message re-sent on purpose comes through). The latched subscription stays
    quiet about volatile publishers (the live one receives them)."""
    last: list = [None, -1, 0.0]  # message, subscription index, monotonic time

    def deliver(index: int):
        def on_message(msg) -> None:
            now = time.monotonic()
            if last[1] not in (-1, index) and now - last[2] < same_within_s and msg == last[0]:
                return
            last[:] = [msg, index, now]
            callback(msg)
        return on_message

    quiet = SubscriptionEventCallbacks(incompatible_qos=lambda event: None)
    return [node.create_subscription(msg_type, topic, deliver(0), INSTRUCTION_LIVE),
            node.create_subscription(msg_type, topic, deliver(1), LATCHED, event_callbacks=quiet)]

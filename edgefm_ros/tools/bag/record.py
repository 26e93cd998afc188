"""``edgefm-bag record``: subscribe to topics as serialized bytes and write them to a rosbag2 bag.

Topics are subscribed as soon as they appear in the graph, with a QoS compatible with their publishers
(best effort if any publisher is, transient-local if all are). edgefm_ros/msg types are registered with
rosbags from the .msg files, so the bag carries their definitions and type hashes.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosbags.rosbag2 import Writer

from edgefm_ros.tools.bag.make import STORAGES
from edgefm_ros.tools.bag.play import message_class
from edgefm_ros.tools.bag.typestore import make_typestore

HIDDEN = ("/rosout", "/parameter_events")


@dataclass(frozen=True)
class RecordConfig:
    out: str
    topics: tuple[str, ...] = ()  # empty: every topic that appears (except /rosout, /parameter_events)
    storage: str = "sqlite3"

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(t if t.startswith("/") else "/" + t for t in self.topics))
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {self.storage!r}")


def _compatible_qos(infos) -> QoSProfile:
    best_effort = any(i.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT for i in infos)
    latched = bool(infos) and all(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for i in infos)
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                      reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)


class Recorder:
    """Subscribes as topics appear (a timer polls the graph); one writer thread owns the bag (sqlite objects
    must stay on the thread that made them), fed through a queue by the subscription callbacks."""

    def __init__(self, node, cfg: RecordConfig, poll_s: float = 0.2):
        self.node, self.cfg = node, cfg
        self.typestore = make_typestore()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._subs: dict = {}
        self.counts: dict[str, int] = {}
        self.error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._writer_loop, name="bag-writer", daemon=True)
        self._thread.start()
        self._timer = node.create_timer(poll_s, self.discover)

    def discover(self) -> None:
        if self._closed:
            return
        for topic, types in self.node.get_topic_names_and_types():
            if topic in self._subs:
                self._downgrade_if_needed(topic)
                continue
            if self.cfg.topics and topic not in self.cfg.topics:
                continue
            if not self.cfg.topics and topic in HIDDEN:
                continue
            infos = self.node.get_publishers_info_by_topic(topic)
            if not infos:
                continue
            msgtype = types[0]
            try:
                cls = message_class(msgtype)
                self.typestore.fielddefs[msgtype]
            except (ValueError, KeyError) as e:
                self.node.get_logger().warning(f"not recording {topic} [{msgtype}]: {e!r}")
                self._subs[topic] = None
                continue
            self.counts[topic] = 0
            self._queue.put(("connect", topic, msgtype))
            self._subs[topic] = self.node.create_subscription(
                cls, topic, lambda data, t=topic: self._on_message(t, data), _compatible_qos(infos), raw=True)

    def _downgrade_if_needed(self, topic: str) -> None:
        """A best-effort publisher that appeared after a reliable one (a node started later, or restarted)
        would never reach a reliable subscription: subscribe again best-effort (it matches both kinds)."""
        sub = self._subs.get(topic)
        if sub is None or sub.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT:
            return
        infos = self.node.get_publishers_info_by_topic(topic)
        if not any(i.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT for i in infos):
            return
        self.node.destroy_subscription(sub)
        self._subs[topic] = self.node.create_subscription(
            sub.msg_type, topic, lambda data, t=topic: self._on_message(t, data),
            _compatible_qos(infos), raw=True)

    def _on_message(self, topic: str, data: bytes) -> None:
        if not self._closed:
            self._queue.put(("write", topic, (self.node.get_clock().now().nanoseconds, data)))
            self.counts[topic] += 1

    def _writer_loop(self) -> None:
        writer = Writer(self.cfg.out, version=9, storage_plugin=STORAGES[self.cfg.storage])
        conns = {}
        try:
            writer.open()
            while True:
                kind, topic, arg = self._queue.get()
                if kind == "close":
                    break
                if kind == "connect":
                    conns[topic] = writer.add_connection(topic, arg, typestore=self.typestore)
                else:
                    writer.write(conns[topic], arg[0], arg[1])
        except BaseException as e:  # reported by close()
            self.error = e
        finally:
            try:
                writer.close()
            except Exception as e:
                self.error = self.error or e

    def close(self) -> None:
        """Stop recording and finish the bag (metadata written); raises what the writer thread hit."""
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        self._queue.put(("close", "", None))
        self._thread.join(timeout=30.0)
        if self.error is not None:
            raise RuntimeError(f"recording {self.cfg.out} failed: {self.error!r}") from self.error

"""The cloud client's link observer on the graph: each cloud call's measurements published for router_node's
link estimate as a std_msgs/Float64MultiArray [upload_bytes, upload_s, rtt_s] ([] for a failed call)."""
from __future__ import annotations

from std_msgs.msg import Float64MultiArray

from edgefm_ros.ros import qos


class LinkSamples:
    """Publishes the link samples of the cloud calls a node makes (cloud/client/base.py's link observer)."""

    def __init__(self, publisher):
        self.publisher = publisher

    @classmethod
    def on(cls, node, topic: str) -> "LinkSamples":
        """A reliable publisher on ``topic`` made on ``node``."""
        return cls(node.create_publisher(Float64MultiArray, topic, qos.RELIABLE))

    def observe(self, upload_bytes: int, upload_s: float, rtt_s: float, now: float) -> None:
        self.publisher.publish(Float64MultiArray(data=[float(upload_bytes), float(upload_s), float(rtt_s)]))

    def observe_failure(self, now: float) -> None:
        self.publisher.publish(Float64MultiArray(data=[]))

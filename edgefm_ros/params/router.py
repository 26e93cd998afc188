"""router_node's parameters (the edge/cloud router)."""
from __future__ import annotations

from edgefm_ros.params import topics
from edgefm_ros.params.spec import NodeConfig, param
from edgefm_ros.routing.config import THRESHOLDS


class RouterNodeConfig(NodeConfig, node="router_node"):
    config_path: str = param("", "Router YAML (candidates, coefficients, thresholds); empty: the package's "
                             "config/router.yaml.")
    camera_topics: tuple[str, ...] = param((topics.CAMERA,), "Camera topics (sensor_msgs/Image, or CompressedImage "
                                           "when the transport says so).")
    camera_keys: tuple[str, ...] = param((), "Camera key for each topic (e.g. observation.images.camera1); empty: "
                                         "observation.images.camera<i>.")
    camera_transports: tuple[str, ...] = param((), "raw or compressed per camera topic; empty: compressed when the "
                                               "topic ends in /compressed.", choices=topics.TRANSPORTS)
    instruction_topic: str = param(topics.INSTRUCTION, "std_msgs/String task from any reliable publisher; a "
                                   "latched (transient local) one also reaches a node started after it.")
    default_instruction: str = param("", "Instruction used until one arrives; empty: wait for one.")
    route_topic: str = param(topics.ROUTE, "Output: edgefm_ros/RouteDecision.")
    rate_hz: float = param(2.0, "Decisions per second (0: only on new instructions).", range=(0.0, 100.0))
    deadline_s: float = param(0.0, "Request deadline the decision must meet; 0: the router config's "
                              "default_deadline_s.", range=(0.0, 60.0))
    max_image_age_s: float = param(1.0, "Camera frames received longer ago than this are not used.",
                                   range=(0.001, 3600.0))
    link_sample_topic: str = param(topics.LINK_SAMPLE, "Input: Float64MultiArray [upload_bytes, upload_s, rtt_s] "
                                   "per cloud call; [] for a failed call.")
    static_bandwidth_mbps: float = param(0.0, "When > 0: a known fixed link the router decides with (demos, "
                                         "benches); the measured samples' rates and round trips are not mixed in, while "
                                         "their failures open the breaker and their successes close it; 0: measured "
                                         "samples only.",
                                         range=(0.0, 100000.0))
    static_rtt_s: float = param(0.02, "RTT of the static link.", range=(0.0, 10.0))
    cloud_url: str = param("", "Cloud endpoint (edgefm-cloud serve) whose link is probed, e.g. "
                           "https://10.0.0.5:8443; empty: no probes (samples from link_sample_topic only).")
    cloud_token_file: str = param("", "File holding the endpoint's bearer token; empty: $EDGEFM_CLOUD_TOKEN.")
    cloud_ca_file: str = param("", "CA certificate (PEM) of an https cloud_url signed by a private CA.")
    probe_period_s: float = param(5.0, "Link probe when the estimate is unknown or about to go stale, at most this "
                                  "often (background thread); 0: off.", range=(0.0, 3600.0))
    probe_bytes: int = param(131072, "Upload size of a link probe.", range=(16384, 262144))
    # Changeable at runtime (`ros2 param set`); unset: the router YAML's value, set at configure.
    delta_min: float | None = param(None, "Quality gain the cloud must exceed over the best edge candidate. "
                                    "Default: the router YAML's.", range=(-1.0, 1.0), read_only=False)
    guard_mbps: float | None = param(None, "Below this bandwidth estimate the router serves edge-only. Default: "
                                     "the router YAML's.", range=(0.0, 10000.0), read_only=False)
    guard_hysteresis_mbps: float | None = param(None, "The guard releases above guard_mbps + this. Default: the "
                                                "router YAML's.", range=(0.0, 10000.0), read_only=False)
    cloud_hysteresis: float | None = param(None, "From the edge, the cloud must win by delta_min + this; once in "
                                           "the cloud it stays while it wins by delta_min. Default: the router "
                                           "YAML's.", range=(0.0, 1.0), read_only=False)
    autostart: bool = param(True, "Configure and activate on start (false: wait for a lifecycle manager).")

    def __post_init__(self) -> None:
        if not self.camera_topics:
            raise ValueError("camera_topics must name at least one camera topic")
        if self.cloud_url and not self.cloud_url.startswith(("http://", "https://")):
            raise ValueError(f"cloud_url must be http(s)://host[:port], got {self.cloud_url!r}")
        if self.camera_keys and len(self.camera_keys) != len(self.camera_topics):
            raise ValueError(f"camera_keys has {len(self.camera_keys)} entries for {len(self.camera_topics)} "
                             "camera_topics")
        topics.transports(self.camera_topics, self.camera_transports)  # one per topic, or none
        if len(set(self.camera_keys)) != len(self.camera_keys):
            raise ValueError(f"camera_keys {list(self.camera_keys)} holds duplicates")

    @property
    def keys(self) -> tuple[str, ...]:
        """Each camera topic's key: camera_keys, else observation.images.camera<i>."""
        return self.camera_keys or tuple(f"observation.images.camera{i + 1}" for i in range(len(self.camera_topics)))

    @property
    def transports(self) -> tuple[str, ...]:
        return topics.transports(self.camera_topics, self.camera_transports)

    @property
    def thresholds(self) -> dict[str, float | None]:
        """The runtime thresholds as set (None: the router YAML's)."""
        return {n: getattr(self, n) for n in THRESHOLDS}

"""vla_node parameters: declared once here (specs), read once into ``VlaNodeConfig``."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.runtime.modes import MODES
from edgefm_ros.control.delay import DelayConfig
from edgefm_ros.runtime.rtc import GUIDANCE_FORMS, SCHEDULES, RtcConfig
from edgefm_ros.ros.params import ParamSpec, validate

NODE_NAME = "vla_node"

PARAMS = (
    ParamSpec("checkpoint", "str", "", "LeRobot SmolVLA checkpoint directory (config.json, model.safetensors, "
              "pre/post-processor files)."),
    ParamSpec("vlm_dir", "str", "", "Directory with the VLM config and tokenizer; empty: resolved from the "
              "checkpoint."),
    ParamSpec("mode", "str", "exact", "Engine mode: exact (LeRobot parity), fast (tuned kernels) or reference.",
              choices=MODES),
    ParamSpec("vision_position_ids", "str", "auto", "SmolVLM vision position ids the checkpoint was trained with: "
              "legacy (LeRobot 0.4.x / transformers 4.55.1-4.57), fixed (LeRobot 0.3.x and >= 0.5, SmolVLA "
              "pretraining), auto (the checkpoint's edgefm_numerics.json or LeRobot record, else fixed with a "
              "warning).", choices=VISION_POSITION_ID_CHOICES),
    ParamSpec("threads", "int", 0, "Torch threads for inference; 0: the engine's default.", range=(0, 256)),
    ParamSpec("tables", "str[]", (), "Operator implementation table files loaded after the built-in table."),
    ParamSpec("camera_topics", "str[]", (), "Camera topics (sensor_msgs/Image or CompressedImage)."),
    ParamSpec("camera_keys", "str[]", (), "Model camera key for each camera topic, same order "
              "(e.g. observation.images.camera1)."),
    ParamSpec("camera_transports", "str[]", (), "raw or compressed for each camera topic; empty: compressed "
              "when the topic ends in /compressed.", choices=("raw", "compressed")),
    ParamSpec("required_cameras", "str[]", (), "Camera keys that must be present and fresh; empty: all "
              "camera_keys."),
    ParamSpec("resize_images", "bool", True, "Resize frames to the model's raw image shape when they differ."),
    ParamSpec("joint_states_topic", "str", "joint_states", "sensor_msgs/JointState topic of the robot."),
    ParamSpec("state_joint_names", "str[]", (), "Joint names in the model's state order (len = state_dim)."),
    ParamSpec("action_joint_names", "str[]", (), "Joint name of each action column (len = action_dim); empty: "
              "state_joint_names."),
    ParamSpec("instruction_topic", "str", "instruction", "std_msgs/String task from any reliable publisher; "
              "a latched (transient local) one also reaches a node started after it."),
    ParamSpec("default_task", "str", "", "Task used until an instruction arrives; empty: wait for one."),
    ParamSpec("action_rate_hz", "float", 30.0, "Rate the policy's actions are meant for (chunk row spacing).",
              range=(1.0, 1000.0)),
    ParamSpec("max_observation_age_s", "float", 0.5, "Observations older than this (camera or joint state) "
              "are refused.", range=(0.001, 3600.0)),
    ParamSpec("chunk_topic", "str", "edgefm/action_chunk", "Output: edgefm_ros/ActionChunk."),
    ParamSpec("queue_status_topic", "str", "edgefm/queue_status", "Input: edgefm_ros/QueueStatus from "
              "action_node (triggers chunks)."),
    ParamSpec("route_topic", "str", "edgefm/route", "Input: edgefm_ros/RouteDecision from router_node."),
    ParamSpec("use_route", "bool", True, "Follow the router's decision (cloud when it says so and a cloud "
              "client is configured); false: edge only."),
    ParamSpec("route_max_age_s", "float", 5.0, "A route decision older than this is ignored (edge).",
              range=(0.0, 3600.0)),
    ParamSpec("cloud_url", "str", "", "Cloud inference server URL; empty: no cloud client (edge only)."),
    ParamSpec("cloud_deadline_s", "float", 0.5, "Deadline of a cloud request; past it the edge runs "
              "(edge-fallback).", range=(0.001, 60.0)),
    ParamSpec("link_sample_topic", "str", "edgefm/link_sample", "Output: std_msgs/Float64MultiArray [upload_bytes, "
              "upload_s, rtt_s] per cloud call ([] when it failed), for router_node's link estimate."),
    # Shadow mode (off by default; node half: ros/shadow.py, definition: routing/shadow.py). Quality of the
    # edge's chunk a (chunk, action_dim) against the cloud's chunk r for the SAME observation and noise:
    #   e = sqrt(mean_{t,j} ((a[t,j] - r[t,j]) / std[j])^2),  quality = exp(-(e / shadow_tolerance)^2),
    # std = the checkpoint's action std (unnormaliser stats); the cloud (the reference) scores 1.
    ParamSpec("shadow_fraction", "float", 0.0, "Shadow mode: this share of routed requests also runs on the "
              "other placement (edge vs cloud) after the served chunk is published, with the same observation "
              "and noise; both results and the router's features are logged to shadow_log for `edgefm-router "
              "calibrate --log`. Quality: the cloud's chunk is the reference (1); the edge's chunk scores "
              "exp(-(e / shadow_tolerance)^2), e = RMS of (edge - cloud) / action std over the chunk "
              "(edgefm_ros/routing/shadow.py). 0: off. Needs cloud_url.", range=(0.0, 1.0)),
    ParamSpec("shadow_log", "str", "", "Shadow mode's JSONL log (appended; ~ and $VARS expanded); required when "
              "shadow_fraction > 0."),
    ParamSpec("shadow_tolerance", "float", 0.5, "Shadow quality: the RMS error, in action standard deviations, "
              "that scores exp(-1) = 0.37.", range=(0.001, 100.0)),
    ParamSpec("shadow_edge_candidate", "str", "edge-bf16-512", "Router candidate the edge's result is logged "
              "as when the edge is the shadow (a served result is logged as the routed candidate)."),
    ParamSpec("shadow_cloud_candidate", "str", "cloud-fp32-512", "Router candidate the cloud's result is logged "
              "as when the cloud is the shadow (its images then go raw, at the captured resolution)."),
    ParamSpec("inference_delay_ms", "float", 0.0, "Added to every chunk's inference before it is published "
              "(a fixed extra latency, to measure task success against latency); 0: none.", range=(0.0, 10000.0)),
    # Real-time chunking (runtime/rtc.py, control/rtc.py): each chunk's denoising is guided toward the last
    # chunk's actions from the observation's time on; pair with action_node's `aggregate: rtc`.
    ParamSpec("rtc_enabled", "bool", False, "Real-time chunking: guide each new chunk toward the previous chunk's "
              "actions that run while it is computed (edge and cloud). Use with action_node aggregate: rtc."),
    ParamSpec("rtc_schedule", "str", "LINEAR", "RTC prefix weights over the chunk (LeRobot's "
              "prefix_attention_schedule).", choices=SCHEDULES),
    ParamSpec("rtc_execution_horizon", "int", 10, "RTC: chunk positions at and after this get no guidance.",
              range=(1, 1000)),
    ParamSpec("rtc_max_guidance_weight", "float", 10.0, "RTC: cap of the per-step guidance weight (beta).",
              range=(0.001, 1000.0)),
    ParamSpec("rtc_guidance", "str", "constant", "RTC guidance form: constant (LeRobot: no backward pass) or vjp "
              "(the RTC paper's: a backward pass through the expert; needs mode reference).", choices=GUIDANCE_FORMS),
    ParamSpec("rtc_delay_percentile", "float", 90.0, "RTC delay estimate: this percentile of the recent "
              "observation-to-chunk latencies, in control ticks.", range=(1.0, 100.0)),
    ParamSpec("rtc_delay_window", "int", 20, "RTC delay estimate: latencies of the last this many chunks.",
              range=(1, 10000)),
    ParamSpec("rtc_delay_warmup", "int", 1, "RTC delay estimate: the first this many latencies (cold start) are "
              "left out once later ones exist.", range=(0, 1000)),
    ParamSpec("merge_timeout_s", "float", 1.0, "A published chunk not reported merged by action_node within "
              "this is considered lost.", range=(0.01, 60.0)),
    ParamSpec("diagnostics_period_s", "float", 1.0, "Period of /diagnostics.", range=(0.05, 60.0)),
    ParamSpec("autostart", "bool", False, "Configure and activate on start (no lifecycle manager needed)."),
)


@dataclass(frozen=True)
class VlaNodeConfig:
    checkpoint: str
    vlm_dir: str
    mode: str
    vision_position_ids: str
    threads: int
    tables: tuple[str, ...]
    camera_topics: tuple[str, ...]
    camera_keys: tuple[str, ...]
    camera_transports: tuple[str, ...]
    required_cameras: tuple[str, ...]
    resize_images: bool
    joint_states_topic: str
    state_joint_names: tuple[str, ...]
    action_joint_names: tuple[str, ...]
    instruction_topic: str
    default_task: str
    action_rate_hz: float
    max_observation_age_s: float
    chunk_topic: str
    queue_status_topic: str
    route_topic: str
    use_route: bool
    route_max_age_s: float
    cloud_url: str
    cloud_deadline_s: float
    link_sample_topic: str
    shadow_fraction: float
    shadow_log: str
    shadow_tolerance: float
    shadow_edge_candidate: str
    shadow_cloud_candidate: str
    inference_delay_ms: float
    rtc_enabled: bool
    rtc_schedule: str
    rtc_execution_horizon: int
    rtc_max_guidance_weight: float
    rtc_guidance: str
    rtc_delay_percentile: float
    rtc_delay_window: int
    rtc_delay_warmup: int
    merge_timeout_s: float
    diagnostics_period_s: float
    autostart: bool

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("parameter 'checkpoint' is empty: set the SmolVLA checkpoint directory")
        if not self.camera_topics:
            raise ValueError("parameter 'camera_topics' is empty: at least one camera is needed")
        if len(self.camera_keys) != len(self.camera_topics):
            raise ValueError(f"camera_keys {list(self.camera_keys)} must name one key per camera topic "
                             f"{list(self.camera_topics)}")
        if self.camera_transports and len(self.camera_transports) != len(self.camera_topics):
            raise ValueError(f"camera_transports {list(self.camera_transports)} must have one entry per "
                             f"camera topic {list(self.camera_topics)}")
        if len(set(self.camera_keys)) != len(self.camera_keys):
            raise ValueError(f"camera_keys {list(self.camera_keys)} holds duplicates")
        unknown = [k for k in self.required_cameras if k not in self.camera_keys]
        if unknown:
            raise ValueError(f"required_cameras {unknown} are not in camera_keys {list(self.camera_keys)}")
        if not self.state_joint_names:
            raise ValueError("parameter 'state_joint_names' is empty: name the joints in the model's state order")
        if self.shadow_fraction > 0 and not self.cloud_url:
            raise ValueError(f"shadow_fraction {self.shadow_fraction:g} > 0 needs cloud_url (shadow mode runs "
                             "both the edge and the cloud)")
        if self.shadow_fraction > 0 and not self.shadow_log:
            raise ValueError(f"shadow_fraction {self.shadow_fraction:g} > 0 needs shadow_log (the JSONL path)")
        for name in ("action_rate_hz", "max_observation_age_s", "cloud_deadline_s", "merge_timeout_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"parameter {name!r} must be a positive number, got {v!r}")

    @property
    def transports(self) -> tuple[str, ...]:
        if self.camera_transports:
            return self.camera_transports
        return tuple("compressed" if t.rstrip("/").endswith("/compressed") else "raw" for t in self.camera_topics)

    @property
    def required(self) -> tuple[str, ...]:
        return self.required_cameras or self.camera_keys

    @property
    def action_names(self) -> tuple[str, ...]:
        return self.action_joint_names or self.state_joint_names

    def rtc(self) -> RtcConfig:
        return RtcConfig(self.rtc_schedule, self.rtc_max_guidance_weight, self.rtc_execution_horizon,
                         self.rtc_guidance)

    def delay(self, chunk_size: int) -> DelayConfig:
        return DelayConfig(self.rtc_delay_percentile, self.rtc_delay_window, self.rtc_delay_warmup, chunk_size)


def make_config(values: Mapping[str, Any]) -> VlaNodeConfig:
    """Validated config from parameter values (missing names take their defaults)."""
    v = validate(PARAMS, values)
    return VlaNodeConfig(**{f.name: v[f.name] for f in fields(VlaNodeConfig)})

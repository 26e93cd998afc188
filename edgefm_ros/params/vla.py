"""vla_node's parameters (the policy: observation in, action chunk out)."""
from __future__ import annotations

import dataclasses
import math

from edgefm_ros.control.delay import DelayConfig
from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.params import topics
from edgefm_ros.params.spec import NodeConfig, param
from edgefm_ros.dispatch.modes import MODES
from edgefm_ros.runtime.rtc_guidance import GUIDANCE_FORMS, SCHEDULES, RtcConfig


class VlaNodeConfig(NodeConfig, node="vla_node"):
    # --- model ---
    checkpoint: str = param("", "LeRobot SmolVLA checkpoint directory (config.json, model.safetensors, "
                            "pre/post-processor files).")
    vlm_dir: str = param("", "Directory with the VLM config and tokenizer; empty: resolved from the checkpoint.")
    mode: str = param("exact", "Engine mode: exact (LeRobot parity), fast (tuned kernels) or reference.",
                      choices=MODES)
    vision_position_ids: str = param("auto", "SmolVLM vision position ids the checkpoint was trained with: legacy "
                                     "(LeRobot 0.4.x / transformers 4.55.1-4.57), fixed (LeRobot 0.3.x and >= 0.5, "
                                     "SmolVLA pretraining), auto (the checkpoint's edgefm_numerics.json or LeRobot "
                                     "record, else fixed with a warning).", choices=VISION_POSITION_ID_CHOICES)
    threads: int = param(0, "Torch threads for inference; 0: the engine's default.", range=(0, 256))
    tables: tuple[str, ...] = param((), "Operator implementation table files loaded after the built-in table.")
    # --- inputs ---
    camera_topics: tuple[str, ...] = param((), "Camera topics (sensor_msgs/Image or CompressedImage).")
    camera_keys: tuple[str, ...] = param((), "Model camera key for each camera topic, same order (e.g. "
                                         "observation.images.camera1); empty: the checkpoint's cameras in its "
                                         "order (config.json input_features).")
    camera_transports: tuple[str, ...] = param((), "raw or compressed for each camera topic; empty: compressed when "
                                               "the topic ends in /compressed.", choices=topics.TRANSPORTS)
    required_cameras: tuple[str, ...] = param((), "Camera keys that must be present and fresh; empty: all "
                                              "camera_keys.")
    resize_images: bool = param(True, "Resize frames to the model's raw image shape when they differ.")
    joint_states_topic: str = param(topics.JOINT_STATES, "sensor_msgs/JointState topic of the robot.")
    state_joint_names: tuple[str, ...] = param((), "Joint names in the model's state order (len = state_dim).")
    action_joint_names: tuple[str, ...] = param((), "Joint name of each action column (len = action_dim); empty: "
                                                "state_joint_names.")
    instruction_topic: str = param(topics.INSTRUCTION, "std_msgs/String task from any reliable publisher; a "
                                   "latched (transient local) one also reaches a node started after it.")
    default_task: str = param("", "Task used until an instruction arrives; empty: wait for one.")
    action_rate_hz: float = param(30.0, "Rate the policy's actions are meant for (chunk row spacing).",
                                  range=(1.0, 1000.0))
    max_observation_age_s: float = param(0.5, "Observations older than this (camera or joint state) are refused.",
                                         range=(0.001, 3600.0))
    # --- the graph ---
    chunk_topic: str = param(topics.ACTION_CHUNK, "Output: edgefm_ros/ActionChunk.")
    queue_status_topic: str = param(topics.QUEUE_STATUS, "Input: edgefm_ros/QueueStatus from action_node "
                                    "(triggers chunks).")
    route_topic: str = param(topics.ROUTE, "Input: edgefm_ros/RouteDecision from router_node.")
    use_route: bool = param(True, "Follow the router's decision (cloud when it says so and a cloud client is "
                            "configured); false: edge only.")
    route_max_age_s: float = param(5.0, "A route decision older than this is ignored (edge).", range=(0.0, 3600.0))
    cloud_url: str = param("", "Cloud inference server URL; empty: no cloud client (edge only).")
    cloud_deadline_s: float = param(0.5, "Deadline of a cloud request; past it the edge runs (edge-fallback).",
                                    range=(0.001, 60.0))
    link_sample_topic: str = param(topics.LINK_SAMPLE, "Output: std_msgs/Float64MultiArray [upload_bytes, "
                                   "upload_s, rtt_s] per cloud call ([] when it failed), for router_node's link "
                                   "estimate.")
    # Shadow mode (off by default; placement/shadow.py, quality: routing/chunk_quality.py). Quality of the
    # edge's chunk a (chunk, action_dim) against the cloud's chunk r for the SAME observation and noise:
    #   e = sqrt(mean_{t,j} ((a[t,j] - r[t,j]) / std[j])^2),  quality = exp(-(e / shadow_tolerance)^2),
    # std = the checkpoint's action std (unnormaliser stats); the cloud (the reference) scores 1.
    shadow_fraction: float = param(0.0, "Shadow mode: this share of routed requests also runs on the other "
                                   "placement (edge vs cloud) after the served chunk is published, with the same "
                                   "observation and noise; both results and the router's features are logged to "
                                   "shadow_log for `edgefm-router calibrate --log`. Quality: the cloud's chunk is "
                                   "the reference (1); the edge's chunk scores exp(-(e / shadow_tolerance)^2), e = "
                                   "RMS of (edge - cloud) / action std over the chunk (edgefm_ros/routing/"
                                   "chunk_quality.py). 0: off. Needs cloud_url.", range=(0.0, 1.0))
    shadow_log: str = param("", "Shadow mode's JSONL log (appended; ~ and $VARS expanded); required when "
                            "shadow_fraction > 0.")
    shadow_tolerance: float = param(0.5, "Shadow quality: the RMS error, in action standard deviations, that "
                                    "scores exp(-1) = 0.37.", range=(0.001, 100.0))
    shadow_edge_candidate: str = param("edge-bf16-512", "Router candidate the edge's result is logged as when the "
                                       "edge is the shadow (a served result is logged as the routed candidate).")
    shadow_cloud_candidate: str = param("cloud-fp32-512", "Router candidate the cloud's result is logged as when "
                                        "the cloud is the shadow (its images then go raw, at the captured "
                                        "resolution).")
    restamp_held: bool = param(True, "A chunk computed while the robot's queue was empty (the arm holding) is "
                               "stamped with its publish time: the arm stands where the observation saw it until "
                               "the chunk arrives, so the robot runs it from its first row instead of skipping "
                               "the rows of the wait (false: the observation's time, as any other chunk).")
    inference_delay_ms: float = param(0.0, "Added to every chunk's inference before it is published (a fixed extra "
                                      "latency, to measure task success against latency); 0: none.",
                                      range=(0.0, 10000.0))
    # Real-time chunking (runtime/rtc_guidance.py, control/rtc.py): each chunk's denoising is guided toward the last
    # chunk's actions from the observation's time on; pair with action_node's `aggregate: rtc`.
    rtc_enabled: bool = param(False, "Real-time chunking: guide each new chunk toward the previous chunk's actions "
                              "that run while it is computed (edge and cloud). Use with action_node aggregate: rtc.")
    rtc_schedule: str = param("LINEAR", "RTC prefix weights over the chunk (LeRobot's prefix_attention_schedule).",
                              choices=SCHEDULES)
    rtc_execution_horizon: int = param(10, "RTC: chunk positions at and after this get no guidance.",
                                       range=(1, 1000))
    rtc_max_guidance_weight: float = param(10.0, "RTC: cap of the per-step guidance weight (beta).",
                                           range=(0.001, 1000.0))
    rtc_guidance: str = param("auto", "RTC guidance form: auto (prefix for a checkpoint trained with "
                              "--rtc-prefix-max, else constant), constant (LeRobot: no backward pass), vjp (the RTC "
                              "paper's: a backward pass through the expert; needs mode reference) or prefix (the "
                              "delay's actions given, clean: training-time RTC).",
                              choices=GUIDANCE_FORMS)
    rtc_delay_percentile: float = param(90.0, "RTC delay estimate: this percentile of the recent observation-to-"
                                        "chunk latencies, in control ticks.", range=(1.0, 100.0))
    rtc_delay_window: int = param(20, "RTC delay estimate: latencies of the last this many chunks.",
                                  range=(1, 10000))
    rtc_delay_warmup: int = param(1, "RTC delay estimate: the first this many latencies (cold start) are left out "
                                  "once later ones exist.", range=(0, 1000))
    merge_timeout_s: float = param(1.0, "A published chunk not reported merged by action_node within this is "
                                   "considered lost.", range=(0.01, 60.0))

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("parameter 'checkpoint' is empty: set the SmolVLA checkpoint directory")
        if not self.camera_topics:
            raise ValueError("parameter 'camera_topics' is empty: at least one camera is needed")
        if self.camera_keys and len(self.camera_keys) != len(self.camera_topics):
            raise ValueError(f"camera_keys {list(self.camera_keys)} must name one key per camera topic "
                             f"{list(self.camera_topics)}")
        topics.transports(self.camera_topics, self.camera_transports)  # one per topic, or none
        if len(set(self.camera_keys)) != len(self.camera_keys):
            raise ValueError(f"camera_keys {list(self.camera_keys)} holds duplicates")
        unknown = [k for k in self.required_cameras if k not in self.camera_keys] if self.camera_keys else []
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

    def for_model(self, camera_keys: tuple[str, ...], state_dim: int, action_dim: int) -> "VlaNodeConfig":
        """This config checked against the model's cameras and dimensions, empty camera_keys set to the
        model's cameras (in its order); ValueError naming what does not fit."""
        cfg = self
        if not self.camera_keys:
            if len(camera_keys) != len(self.camera_topics):
                raise ValueError(f"camera_keys is empty, so the checkpoint's {len(camera_keys)} cameras "
                                 f"{list(camera_keys)} are used, but camera_topics names {len(self.camera_topics)}: "
                                 f"{list(self.camera_topics)}")
            cfg = dataclasses.replace(self, camera_keys=tuple(camera_keys))
        unknown = [k for k in cfg.camera_keys if k not in camera_keys]
        if unknown:
            raise ValueError(f"camera_keys {unknown} are not cameras of the model {list(camera_keys)}")
        if len(cfg.state_joint_names) != state_dim:
            raise ValueError(f"state_joint_names has {len(cfg.state_joint_names)} names, the model's state_dim is "
                             f"{state_dim}")
        if len(cfg.action_names) != action_dim:
            raise ValueError(f"action_joint_names has {len(cfg.action_names)} names, the model's action_dim is "
                             f"{action_dim}")
        return cfg

    @property
    def transports(self) -> tuple[str, ...]:
        return topics.transports(self.camera_topics, self.camera_transports)

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

"""Task "vla": observation -> action chunk (runtime.engine.Engine), model "smolvla" by default.

Request (REST JSON; the same tensors over gRPC, with bytes instead of base64 text):
  id: request id (echoed in the response)
  parameters: {"stamp", "dt", "seq" (an integer >= 0), "missing": [camera keys], "deadline_s" (budget
               left when sent, optional), image_encoding/image_dtype/image_shape (core/protocol.py)}
  inputs:
    "state"       FP32  [state_dim]
    "task"        BYTES [1]   utf-8 instruction
    <camera key>  BYTES [1]   one per camera sent (core/protocol.py: the image convention)
    "noise"       FP32  [chunk_size, max_action_dim]  (optional: exact-mode comparisons)
    "rtc_prefix"  FP32  [n, action_dim], 1 <= n <= chunk_size (optional: real-time chunking; raw units,
                  the previous chunk's actions from the observation's time on), with the parameter
                  "rtc_delay" (integer in [0, chunk_size], default 0: control ticks executed meanwhile)
Response:
  outputs: "actions" FP32 [chunk_size, action_dim] (unnormalised)
  parameters: {"model", "seq", "runs" (chunks computed by this server so far), and seconds: "queue_s"
               (wait for the engine), "decode_input_s" (payload decoding), "engine_s" (Engine.predict:
               preprocessing + "prefill_s" + "decode_s" + postprocessing), "server_s" (request
               received -> response ready, inside the runtime)}
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edgefm_ros.cloud.core import protocol as p
from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor, tensor_spec
from edgefm_ros.cloud.core.task import Task, check_at_least, config_from_extra
from edgefm_ros.cloud.core.timing import RequestClock
from edgefm_ros.cloud.images import Encoding
from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.dispatch.modes import Mode, check_mode
from edgefm_ros.types import Observation

STATE, TASK_TEXT, NOISE, ACTIONS, RTC_PREFIX = "state", "task", "noise", "actions", "rtc_prefix"
RTC_DELAY = "rtc_delay"
NON_CAMERA = (STATE, TASK_TEXT, NOISE, RTC_PREFIX)
DEVICES = ("auto", "cpu", "cuda")  # auto: cuda when torch sees a GPU


@dataclass(frozen=True)
class VlaLimits:
    """What the server accepts; everything else is refused with a 4xx."""

    camera_keys: tuple[str, ...]  # the model's cameras; more or other keys are refused
    state_dim: int
    noise_shape: tuple[int, int]  # (chunk_size, max_action_dim)
    action_dim: int = -1  # of the response (-1: not known here)
    max_side: int = 2048  # pixels per image side
    max_image_bytes: int = 16 << 20  # one decoded payload
    max_task_chars: int = 1024

    def __post_init__(self) -> None:
        if not self.camera_keys:
            raise ValueError("VlaLimits.camera_keys is empty")
        check_at_least(self, ("state_dim", "max_side", "max_image_bytes", "max_task_chars"), 1)


@dataclass(frozen=True)
class VlaRequest:
    request_id: str
    obs: Observation
    noise: np.ndarray | None  # float32 (chunk_size, max_action_dim)
    dt: float
    seq: int
    deadline_s: float | None  # budget the client had left when it sent the request
    rtc_prefix: np.ndarray | None = None  # float32 (n, action_dim) raw units: real-time chunking's A_prev
    rtc_delay: int = 0  # control ticks (real-time chunking)


def check_engine_choices(owner: str, mode: str, vision_position_ids: str, device: str) -> None:
    """ValueError naming a mode, vision-position-id convention or device the Engine does not have."""
    check_mode(mode, what=f"{owner}mode")
    if vision_position_ids not in VISION_POSITION_ID_CHOICES:
        raise ValueError(f"{owner}vision_position_ids must be one of {VISION_POSITION_ID_CHOICES}, "
                         f"got {vision_position_ids!r}")
    if device not in DEVICES:
        raise ValueError(f"{owner}device must be one of {DEVICES}, got {device!r}")


@dataclass(frozen=True)
class VlaRuntimeConfig:
    """``parameters.extra`` of the vla model-settings.json (config/cloud/model-settings.json)."""

    checkpoint: str
    vlm: str | None = None
    mode: Mode = "exact"
    vision_position_ids: str = "auto"  # legacy | fixed | auto (runtime/checkpoint.resolve_vision_position_ids)
    device: str = "auto"  # "cpu" | "cuda" | "auto" (cuda when available)
    threads: int | None = None  # torch threads of the engine (None: the engine's default)
    decode_threads: int = 2  # threads decoding request payloads (base64, JPEG)
    max_side: int = 2048  # largest image side accepted, pixels
    max_image_bytes: int = 16 << 20  # largest single image payload accepted
    fault_injection: bool = False  # honour the request parameter fault_delay_s (tests only)

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("VlaRuntimeConfig.checkpoint is empty")
        check_engine_choices("VlaRuntimeConfig.", self.mode, self.vision_position_ids, self.device)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"VlaRuntimeConfig.threads must be >= 1, got {self.threads!r}")
        check_at_least(self, ("decode_threads", "max_side", "max_image_bytes"), 1)

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "VlaRuntimeConfig":
        return config_from_extra(cls, extra)


# ---------------------------------------------------------------- client side

def encode_request(obs: Observation, enc: Encoding, *, request_id: str, dt: float, seq: int = 0,
                   noise: np.ndarray | None = None, deadline_s: float | None = None,
                   extra: Mapping[str, Any] | None = None, rtc_prefix: np.ndarray | None = None,
                   rtc_delay: int = 0) -> dict:
    """Observation -> v2 REST request dict (images as base64 text)."""
    inputs = [p.float_input(STATE, obs.state), p.text_input(TASK_TEXT, obs.task)]
    inputs += [p.image_input(key, img, enc) for key, img in obs.images.items()]
    if noise is not None:
        inputs.append(p.float_input(NOISE, noise))
    params: dict[str, Any] = {"stamp": float(obs.stamp), "dt": float(dt), "seq": int(seq), "missing": list(obs.missing)}
    if rtc_prefix is not None:
        inputs.append(p.float_input(RTC_PREFIX, np.asarray(rtc_prefix, dtype=np.float32)))
        params[RTC_DELAY] = int(rtc_delay)
    return p.request_dict(request_id, inputs, params, deadline_s, extra)


def decode_response(body: Mapping[str, Any]) -> tuple[np.ndarray, dict]:
    """v2 response dict -> (float32 (chunk, action_dim) actions, parameters); ValueError if malformed."""
    o = p.response_outputs(body, (ACTIONS,))[ACTIONS]
    shape = o.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(type(s) is int and s >= 0 for s in shape)):
        raise ValueError(f"response actions shape must be [chunk, action_dim], got {shape!r:.80}")
    try:
        actions = np.asarray(o.get("data"), dtype=np.float32).reshape(shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"response actions data is not {shape[0]} x {shape[1]} numbers ({e})") from None
    return actions, p.response_parameters(body)


# ---------------------------------------------------------------- server side

def decode_request(request_id: str, params: Mapping[str, Any], inputs: Sequence[Tensor],
                   limits: VlaLimits) -> VlaRequest:
    """Validate and decode a v2 request; raises ProtocolError naming the first problem found."""
    by_name = p.index_inputs(inputs, NON_CAMERA, lambda n: True)
    cameras = [n for n in by_name if n not in NON_CAMERA]
    if len(cameras) > len(limits.camera_keys):
        raise ProtocolError(f"too many cameras: {len(cameras)} sent, the model takes {len(limits.camera_keys)} "
                            f"({', '.join(limits.camera_keys)})")
    unknown = [n for n in cameras if n not in limits.camera_keys]
    if unknown:
        raise ProtocolError(f"unknown input(s) {unknown}; cameras are {list(limits.camera_keys)}")
    if not cameras:
        raise ProtocolError(f"no camera image sent; cameras are {list(limits.camera_keys)}")
    p.require(by_name, (STATE, TASK_TEXT))
    params = params or {}
    stamp = p.number(params, "stamp", 0.0, float, -np.inf, np.inf)
    dt = p.number(params, "dt", 1 / 30, float, 1e-6, 3600.0)  # > 0
    seq = p.number(params, "seq", 0, int, 0, (1 << 63) - 1)
    deadline_s = p.deadline(params)
    missing = params.get("missing", [])
    if not (isinstance(missing, list) and all(m in limits.camera_keys for m in missing)):
        raise ProtocolError(f"parameter 'missing' must list camera keys of {limits.camera_keys}, got {missing!r}")
    state = p.float_tensor(by_name[STATE], (limits.state_dim,))
    task = p.text(by_name[TASK_TEXT], limits.max_task_chars)
    noise = p.float_tensor(by_name[NOISE], limits.noise_shape) if NOISE in by_name else None
    rtc_prefix, rtc_delay = rtc_inputs(by_name, params, limits)
    images = {k: p.image(by_name[k], limits.max_side, limits.max_image_bytes, params) for k in cameras}
    obs = Observation(images=images, state=state, task=task, stamp=stamp, missing=tuple(missing))
    return VlaRequest(str(request_id or ""), obs, noise, dt, seq, deadline_s, rtc_prefix, rtc_delay)


def rtc_inputs(by_name: Mapping[str, Tensor], params: Mapping[str, Any],
               limits: VlaLimits) -> tuple[np.ndarray | None, int]:
    """(rtc_prefix (n, action_dim) or None, rtc_delay); ProtocolError naming the bad field."""
    chunk = limits.noise_shape[0]
    if RTC_PREFIX not in by_name:
        if RTC_DELAY in params:
            raise ProtocolError(f"parameter {RTC_DELAY!r} needs the input {RTC_PREFIX!r}")
        return None, 0
    t = by_name[RTC_PREFIX]
    shape = list(t.shape)
    width = limits.action_dim if limits.action_dim > 0 else limits.noise_shape[1]
    if not (len(shape) == 2 and isinstance(shape[0], int) and 1 <= shape[0] <= chunk and shape[1] == width):
        raise ProtocolError(f"input {RTC_PREFIX!r} must have shape [n, {width}] with 1 <= n <= {chunk}, "
                            f"got {shape}")
    prefix = p.float_tensor(t, (shape[0], width))
    delay = p.number(params, RTC_DELAY, 0, int, 0, chunk)
    return prefix, delay


def encode_response(actions: np.ndarray, model: str, seq: int, timings: Mapping[str, float], runs: int = 0) -> dict:
    """-> the ``outputs`` and ``parameters`` of a v2 response (the server library adds id and model name)."""
    params: dict[str, Any] = {"model": model, "seq": int(seq), "runs": int(runs)}
    params.update({k: float(timings.get(k, 0.0)) for k in p.TIMING_KEYS})
    return {"outputs": [p.float_input(ACTIONS, actions)], "parameters": params}


def metadata(limits: VlaLimits, rtc: Mapping[str, Any] | None = None) -> dict:
    """The model's inputs, outputs and request parameters, for GET /v2/models/<name>; ``rtc``: the server's
    real-time-chunking settings (schedule, execution_horizon, max_guidance_weight, guidance), as text."""
    rtc_parameters = {f"rtc_{k}": str(v) for k, v in (rtc or {}).items()}
    inputs = [tensor_spec(STATE, "FP32", [limits.state_dim]),
              tensor_spec(TASK_TEXT, "BYTES", [1], {"data": f"the instruction, 1..{limits.max_task_chars} "
                                                             "characters of utf-8 text"})]
    sides = {"max_side": f"each image side 1..{limits.max_side} pixels",
             "max_bytes": f"at most {limits.max_image_bytes} bytes of decoded payload"}
    inputs += [tensor_spec(k, "BYTES", [1], {**p.IMAGE_INPUT_PARAMETERS, **sides}) for k in limits.camera_keys]
    inputs.append(tensor_spec(NOISE, "FP32", list(limits.noise_shape),
                              {"optional": "the flow-matching start noise (exact-mode comparisons)"}))
    width = limits.action_dim if limits.action_dim > 0 else limits.noise_shape[1]
    inputs.append(tensor_spec(RTC_PREFIX, "FP32", [-1, width],
                              {"optional": "real-time chunking: the previous chunk's actions (raw units) from the "
                                           f"observation's time on, 1..{limits.noise_shape[0]} rows; with the "
                                           f"parameter {RTC_DELAY}", **rtc_parameters}))
    outputs = [tensor_spec(ACTIONS, "FP32", [limits.noise_shape[0], limits.action_dim],
                           {"data": "the action chunk, unnormalised, row-major"})]
    params = {"stamp": "finite number: the observation's time (s)",
              "dt": "number > 0: the control period (s)", "seq": "integer >= 0: echoed in the response",
              "missing": f"list of camera keys not sent (of {list(limits.camera_keys)})",
              "deadline_s": "number >= 0 (optional): the client's budget (s) from receipt; 504 when it ran out "
                            "before the model ran",
              RTC_DELAY: f"integer in [0, {limits.noise_shape[0]}] (only with the input {RTC_PREFIX}; default 0): "
                         "control ticks the robot executes the previous chunk while this one is computed",
              **p.IMAGE_REQUEST_PARAMETERS,
              "response": "parameters model, seq, runs and the seconds " + ", ".join(p.TIMING_KEYS)}
    return {"inputs": inputs, "outputs": outputs, "parameters": params}


class VlaServed:
    """The warmed-up Engine on the server, and what it accepts."""

    def __init__(self, cfg: VlaRuntimeConfig):
        import torch

        from edgefm_ros.runtime.engine import Engine

        device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.cfg = cfg
        self.engine = Engine.from_checkpoint(cfg.checkpoint, vlm_dir=cfg.vlm, mode=cfg.mode, threads=cfg.threads,
                                             device=device, vision_position_ids=cfg.vision_position_ids)
        self.engine.warmup()
        spec = self.engine.spec
        self.label = spec.name
        self.limits = VlaLimits(camera_keys=tuple(spec.camera_keys), state_dim=int(spec.state_dim),
                                noise_shape=(int(spec.chunk_size), int(spec.max_action_dim)),
                                action_dim=int(spec.action_dim), max_side=cfg.max_side,
                                max_image_bytes=cfg.max_image_bytes)
        self.runs = 0  # chunks computed (only the engine thread writes it)

    def describe(self) -> str:
        return f"{self.cfg.mode}, vision position ids {self.engine.vision_position_ids}"

    def decode(self, request_id: str, params: Mapping[str, Any], inputs: Sequence[Tensor]) -> VlaRequest:
        return decode_request(request_id, params, inputs, self.limits)

    def run(self, req: VlaRequest, clock: RequestClock, faults: Mapping[str, float], on_delta=None,
            cancel=None) -> dict:
        clock.start(req.request_id, req.deadline_s)
        if faults.get("fault_delay_s", 0.0) > 0:
            time.sleep(faults["fault_delay_s"])
        t0 = time.perf_counter()
        chunk = self.engine.predict(req.obs, noise=req.noise, dt=req.dt, seq=req.seq, source="cloud",
                                    rtc_prefix=req.rtc_prefix, rtc_delay=req.rtc_delay)
        t = self.engine.last_timings
        self.runs += 1
        timings = clock.timings({"engine_s": time.perf_counter() - t0, "prefill_s": t.prefill_s,
                                 "decode_s": t.decode_s})
        return encode_response(chunk.actions, self.label, req.seq, timings, self.runs)

    def metadata(self) -> dict:
        return metadata(self.limits, dataclasses.asdict(self.engine.rtc))


def model_extra(cfg, base: Mapping[str, Any]) -> dict:
    """parameters.extra of the vla model-settings.json for a ServeConfig (over the template's)."""
    extra = dict(base)
    extra.update(checkpoint=str(Path(cfg.checkpoint).resolve()), vlm=str(Path(cfg.vlm).resolve()) if cfg.vlm else None,
                 mode=cfg.mode, vision_position_ids=cfg.vision_position_ids, device=cfg.device, threads=cfg.threads,
                 fault_injection=cfg.fault_injection)
    return extra


TASK = Task(name="vla", model_name="smolvla", implementation="edgefm_ros.cloud.server.runtime.VlaRuntime",
            config_type=VlaRuntimeConfig, load=VlaServed, model_extra=model_extra,
            client_defaults=(("model_name", "smolvla"), ("retry_margin_s", 0.005), ("threads", 4)))

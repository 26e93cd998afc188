"""The Engine: builds SmolVLA from a checkpoint through the dispatch table, runs prefill and decode.

    engine = Engine.from_checkpoint("ckpt/", mode="exact")
    chunk = engine.predict(observation)            # raw observation -> ActionChunk (raw units)
    actions = engine.sample(model_inputs, noise)   # model-level, as LeRobot's sample_actions

prefill: vision tower + connector for every camera (one batch), language/state embeddings, the VLM
  layers' keys/values over the prefix, and everything decode needs from the prefix (the expert's
  cross-attention K/V, masks, rotary tables of the action positions).
decode: ``num_steps`` Euler steps of the action expert; the time embeddings and their share of
  ``action_time_mlp_in`` are computed once at load.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from edgefm_kernels.pages import MMAP_THRESHOLD, keep_freed_heap, trim_heap
from edgefm_ros.dispatch.hardware import Hardware, detect
from edgefm_ros.dispatch.modes import Mode, check_mode
from edgefm_ros.dispatch.resolver import build_resolver, tuned_elsewhere
from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.models.smolvla import SmolVLA
from edgefm_ros.types import ActionChunk, Observation

from .checkpoint import Checkpoint, load_checkpoint, resolve_vision_position_ids, rtc_prefix_max
from .cpu_graph import CaptureError, CpuGraph, GuardFailed
from .graphs import CapturedPhase
from .preprocess import InputError, ModelInputs, Preprocessor, Tokenizer, image_to_chw01
from .rtc_guidance import RtcConfig, RtcInputs, guidance_weight, guided_velocity, rtc_inputs

log = logging.getLogger(__name__)
PREFILL_ROLES = ("vision", "connector", "vlm", "state_proj", "expert_cross_kv")


def stage_of(layer_role: str) -> str:
    return "prefill" if layer_role.startswith(PREFILL_ROLES) else "decode"


@dataclass(frozen=True)
class EngineConfig:
    mode: Mode = "exact"
    tables: tuple[str, ...] = ()  # user dispatch tables, loaded after the built-in ones
    threads: int | None = None
    device: str = "cpu"
    seed: int = 0
    use_tuned: bool = True  # load config/dispatch/<hw_profile>.yaml in fast mode when present
    vision_position_ids: str = "auto"  # legacy | fixed | auto (the checkpoint's record, else the default)
    rtc: RtcConfig = RtcConfig()  # real-time chunking, used by calls that pass a previous-chunk prefix
    cpu_graphs: bool = True  # on CPU, each Euler step replays its captured kernel calls (runtime/cpu_graph.py)

    def __post_init__(self) -> None:
        check_mode(self.mode, what="EngineConfig.mode")
        if not isinstance(self.rtc, RtcConfig):
            raise ValueError(f"EngineConfig.rtc must be an RtcConfig, got {type(self.rtc).__name__}")
        if self.vision_position_ids not in VISION_POSITION_ID_CHOICES:
            raise ValueError(f"vision_position_ids must be one of {VISION_POSITION_ID_CHOICES}, "
                             f"got {self.vision_position_ids!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        for t in self.tables:
            if not Path(t).is_file():
                raise ValueError(f"dispatch table {t} does not exist")


@dataclass(frozen=True)
class PolicySpec:
    camera_keys: tuple[str, ...]
    image_shapes: dict
    state_dim: int
    action_dim: int
    chunk_size: int
    num_steps: int
    max_action_dim: int
    name: str


@dataclass(frozen=True)
class Timings:
    prefill_s: float
    decode_s: float
    total_s: float


@dataclass
class Prefix:
    """What decode reads, computed once per chunk."""

    contexts: list  # per expert layer (k, v) [B, Hkv, P, D]: VLM cache (self layers) or its projection (cross)
    rope_self: object
    rope_cross: object
    mask_self: torch.Tensor  # bool [B, C, P + C]
    mask_cross: torch.Tensor  # bool [B, C, P]
    vlm_kv: list  # per VLM layer (k, v) [B, Hkv, P, D], for inspection
    pad_mask: torch.Tensor  # bool [B, P]


def resolved_rtc(rtc: RtcConfig, ckpt_dir) -> RtcConfig:
    """``rtc`` with guidance "auto" made concrete for this checkpoint: "prefix" where it was trained to be given
    its first actions (edgefm_numerics.json's rtc_prefix_max), else "constant" (LeRobot's)."""
    if rtc.guidance != "auto":
        return rtc
    return replace(rtc, guidance="prefix" if rtc_prefix_max(ckpt_dir) else "constant")


class Engine:
    def __init__(self, ckpt: Checkpoint, config: EngineConfig, hardware: Hardware, probe=None):
        """``probe``: a profile.OpProbe that times every resolved op (``edgefm-vla profile``), or None."""
        self.ckpt, self.config, self.hardware = ckpt, config, hardware
        cfg = ckpt.config
        self.model_config = cfg  # SmolVLAConfig of the checkpoint; self.config is the EngineConfig
        self.resolver = build_resolver(config.mode, hardware.profile, "smolvla", stage_of, config.tables,
                                       config.use_tuned)
        if probe is not None:
            self.resolver.wrap = probe.wrap
        self.table_files = list(self.resolver.files)
        self.device = torch.device(config.device)
        # chosen once: the vision tower gathers its position table with it at build time
        self.vision_position_ids, source = resolve_vision_position_ids(ckpt.path, config.vision_position_ids)
        log.info("vision position ids: %s (%s)", self.vision_position_ids, source)
        self.weights = ckpt.weights(self.device)  # on CPU: the file mapping the fp32 weights are views of
        with torch.no_grad():
            self.model = SmolVLA(cfg, ckpt.vlm, self.resolver, self.weights, self.vision_position_ids).eval()
        self.weights.check_all_used()
        if self.resolver.overruled:
            log.warning("tuned table %s: %d record(s) cannot serve on this machine, built without them; first: %s",
                        self.resolver.tuned, len(self.resolver.overruled), self.resolver.overruled[0])
        self.tuned_elsewhere = tuned_elsewhere(self.resolver.tuned, hardware) if self.resolver.tuned else None
        if self.tuned_elsewhere:
            log.warning("tuned table %s: %s", self.resolver.tuned, self.tuned_elsewhere)
        # activation dtype of each part (cast records: fp32 in exact mode, bf16 in fast mode where it pays)
        self.act = {part: self.resolver.build("cast", f"{part}.activations", f"{part}_act", "")
                    for part in ("vision", "vlm", "expert")}
        self.decode_graph = None  # graphs.CapturedPhase of decode, made by capture_graphs() on CUDA
        self.decode_graph_rtc = None  # the same with RTC guidance (RtcInputs of fixed shapes)
        self.velocity_graphs: list[CpuGraph] = []  # CPU: captured Euler steps, the latest shapes first
        # (a profile times each op on its own: its Euler steps run eagerly)
        self.cpu_graphs = config.cpu_graphs and self.device.type == "cpu" and probe is None
        self.weights.file.release()  # resident again only what inference actually reads
        trim_heap()  # the build's freed weight copies back to the kernel
        keep_freed_heap()  # then each chunk's activations reuse the heap instead of fresh pages
        self.preprocess = Preprocessor(cfg, ckpt.stats, Tokenizer(ckpt.tokenizer_path, cfg.tokenizer_max_length))
        # decode constants: timesteps t_k = 1 + k * euler_dt, their embeddings' share of action_time_mlp_in
        self.euler_dt = -1.0 / cfg.num_steps  # the flow-matching Euler step (not predict's control period)
        t = torch.tensor([1.0 + k * self.euler_dt for k in range(cfg.num_steps)], dtype=torch.float32, device=self.device)
        with torch.no_grad():
            self.time_terms = self.act["expert"](self.model.time_terms(t))  # [S, He]
        self.rtc = resolved_rtc(config.rtc, ckpt.path)
        if config.rtc.guidance == "auto":
            log.info("RTC guidance: %s (%s)", self.rtc.guidance, "the checkpoint was trained to be given its first "
                     "actions" if self.rtc.guidance == "prefix" else "no rtc_prefix_max recorded")
        with torch.no_grad():  # the prefix form's given actions are clean: flow time 0
            self.time_term_given = self.act["expert"](self.model.time_terms(torch.zeros(1, device=self.device)))
        self.euler_t = [1.0 + k * self.euler_dt for k in range(cfg.num_steps)]  # python floats, as LeRobot's loop
        self.rtc_step_weights = [guidance_weight(tk, self.rtc.max_guidance_weight) for tk in self.euler_t]  # [S]
        if self.rtc.guidance == "vjp":
            self._check_differentiable()
        self.generator = torch.Generator().manual_seed(config.seed)
        self.last_timings = Timings(0.0, 0.0, 0.0)
        self.spec = PolicySpec(cfg.camera_keys, dict(zip(cfg.camera_keys, cfg.image_shapes)), cfg.state_dim,
                               cfg.action_dim, cfg.chunk_size, cfg.num_steps, cfg.max_action_dim, ckpt.path.name)

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, vlm_dir: str | Path | None = None, mode: str = "exact",
                        tables: Sequence[str | Path] = (), threads: int | None = None, device: str = "cpu",
                        seed: int = 0, use_tuned: bool = True, vision_position_ids: str = "auto",
                        rtc: RtcConfig | None = None, probe=None) -> "Engine":
        config = EngineConfig(mode, tuple(str(t) for t in tables), threads, device, seed, use_tuned,
                              vision_position_ids, rtc if rtc is not None else RtcConfig())
        if threads is not None:
            torch.set_num_threads(threads)
        return cls(load_checkpoint(checkpoint, vlm_dir), config, detect(device), probe)

    def vision_group(self, batch: int, cameras: int) -> int:
        """Cameras per vision-tower batch: the most that divide ``cameras`` into equal batches whose MLP
        activations [n*B, T, inner] fit in MMAP_THRESHOLD. Larger buffers are faulted in afresh every chunk
        (~127k faults for 3 fp32 cameras at once); single cameras run the vision GEMMs at half the rate of
        three (M = 1024 rows against N = 768 columns); unequal batches pack every vision weight once per row
        count (+1.3 GB RSS in exact mode for batches of 2 and 1, no faster)."""
        v = self.ckpt.vlm.vision
        one = batch * v.grid ** 2 * v.inner * torch.empty((), dtype=self.act["vision"].dtype).element_size()
        fits = max(1, MMAP_THRESHOLD // one)
        return max(n for n in range(1, cameras + 1) if cameras % n == 0 and n <= fits)

    # ---- phases ---------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, inp: ModelInputs) -> Prefix:
        m, cfg, dev = self.model, self.model_config, self.device
        inp = inp.to(dev)
        b, ncam = inp.batch, len(inp.images)
        # cameras per vision batch: see vision_group
        group = self.vision_group(b, ncam)
        vis = [self.act["vision"](x) for x in inp.images]
        img = torch.cat([m.embed_images(torch.cat(vis[i:i + group])) for i in range(0, ncam, group)]).float()
        t = img.shape[1]
        img = img.view(ncam, b, t, -1).transpose(0, 1).reshape(b, ncam * t, -1)
        embs = self.act["vlm"](torch.cat([img, m.embed_language(inp.lang_tokens), m.embed_state(inp.state)], dim=1))
        pad = torch.cat([torch.stack(inp.img_masks, 1).repeat_interleave(t, dim=1), inp.lang_masks.bool(),
                         torch.ones(b, 1, dtype=torch.bool, device=dev)], dim=1)  # [B, P]
        p = pad.shape[1]
        # images + language form one bidirectional block; the state token is its own (causal) block
        block = torch.zeros(p, dtype=torch.long, device=dev)
        block[-1] = 1
        mask = (block[None, :] <= block[:, None])[None] & pad[:, None, :] & pad[:, :, None]  # [B, P, P]
        pos = torch.cumsum(pad, dim=1) - 1
        layer0 = m.text.layers[0]
        kv = m.text.prefix_kv(embs, layer0.rope.tables(pos, layer0.head_dim), mask)
        ex = self.act["expert"]
        contexts = [tuple(ex(t) for t in (layer.context(*kv[i]) if layer.cross else kv[i]))
                    for i, layer in enumerate(m.expert)]
        c = cfg.chunk_size
        n_valid = pad.sum(dim=1, keepdim=True)
        steps = torch.arange(c, device=dev)[None, :]
        e0 = m.expert[0]
        causal = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
        mask_cross = pad[:, None, :].expand(b, c, p)
        return Prefix(contexts, e0.rope.tables(n_valid + steps, e0.head_dim),
                      e0.rope.tables(steps.expand(b, c), e0.head_dim),
                      torch.cat([mask_cross, causal[None].expand(b, c, c)], dim=2), mask_cross, kv, pad)

    @torch.no_grad()
    def decode(self, prefix: Prefix, noise: torch.Tensor, trace: list | None = None,
               rtc: RtcInputs | None = None) -> torch.Tensor:
        """noise [B, C, A] (x at t = 1) -> normalised actions [B, C, A]; ``rtc``: guide toward a previous
        chunk (runtime/rtc_guidance.py) with the form chosen at build (self.rtc.guidance)."""
        x = noise.to(self.device)

        def velocity(xk, k):
            return self._velocity(xk, self.time_terms[k], prefix.contexts, prefix.rope_self, prefix.rope_cross,
                                  prefix.mask_self, prefix.mask_cross)

        replayed = self._velocity_replay(prefix, x) if rtc is None or self.rtc.guidance == "constant" else None
        if rtc is not None and self.rtc.guidance == "prefix":
            given = rtc.weights  # [B, C, 1]: 1 on the rows that execute while this chunk is computed
            x = given * rtc.prev + (1 - given) * x  # clean from the start, and kept (their velocity is zeroed)
        for k in range(self.model_config.num_steps):
            v = None
            if replayed is not None:
                try:  # the graph's output is overwritten by the next step: a trace keeps a copy
                    v = replayed(x, k) if trace is None else replayed(x, k).clone()
                except GuardFailed as e:  # a host value the capture read differs: this decode runs eagerly
                    log.info("decode runs eagerly: %s", e)
                    replayed = None
            if rtc is None:
                v = velocity(x, k) if v is None else v
            elif self.rtc.guidance == "constant":
                v = guided_velocity(x, (velocity(x, k) if v is None else v).float(), self.euler_t[k],
                                    self.rtc_step_weights[k], rtc)
            elif self.rtc.guidance == "prefix":  # per action: time 0 on the given rows, t_k on the others
                tt = (given * self.time_term_given + (1 - given) * self.time_terms[k]).to(self.time_terms.dtype)
                v = self._velocity(x, tt, prefix.contexts, prefix.rope_self, prefix.rope_cross, prefix.mask_self,
                                   prefix.mask_cross).float() * (1 - given)
            else:
                v = self._vjp_guided(x, k, velocity, rtc)
            x = x + self.euler_dt * v.float()
            if trace is not None:
                trace.append((v, x))
        return x

    def _velocity(self, x, time_term, contexts, rope_self, rope_cross, mask_self, mask_cross):
        """One Euler step's velocity [B, C, A] at x [B, C, A] (fp32), time_term [He] (or [B, C, He]: per action)."""
        return self.model.velocity(self.act["expert"](x), time_term, contexts, rope_self, rope_cross, mask_self,
                                   mask_cross)

    def _velocity_replay(self, prefix: Prefix, x: torch.Tensor):
        """CPU: ``(x, k) -> v`` replaying the captured step (captured on first use for these shapes; the two
        latest kept), with this prefix loaded once; None where steps run eagerly."""
        if not self.cpu_graphs:
            return None
        args = (x, self.time_terms[0], prefix.contexts, prefix.rope_self, prefix.rope_cross, prefix.mask_self,
                prefix.mask_cross)
        graph = next((g for g in self.velocity_graphs if g.fits(*args)), None)
        if graph is None:
            try:
                graph = CpuGraph(self._velocity, args)
            except CaptureError as e:
                log.warning("Euler steps run eagerly from now on: %s", e)
                self.cpu_graphs = False
                return None
            log.info("captured an Euler step (%d ops replayed) in %.0f ms", len(graph.entries), 1e3 * graph.capture_s)
            self.velocity_graphs = [graph] + self.velocity_graphs[:1]
        graph.load(None, None, *args[2:])

        def replayed(xk, k):
            graph.load(xk, self.time_terms[k], None, None, None, None, None)
            return graph.replay()

        return replayed

    def decode_rtc(self, prefix: Prefix, noise: torch.Tensor, rtc: RtcInputs) -> torch.Tensor:
        return self.decode(prefix, noise, rtc=rtc)

    def _check_differentiable(self) -> None:
        """The paper's guidance needs a backward pass through the expert: refuse kernels without one."""
        cfg, dev = self.model_config, self.device
        b, p, c = 1, 2, cfg.chunk_size
        contexts = [tuple(torch.zeros(b, layer.kv_heads, p if layer.cross else p, layer.head_dim, device=dev)
                          for _ in range(2)) for layer in self.model.expert]
        e0 = self.model.expert[0]
        steps = torch.arange(c, device=dev)[None]
        mask_cross = torch.ones(b, c, p, dtype=torch.bool, device=dev)
        mask_self = torch.cat([mask_cross, torch.ones(c, c, dtype=torch.bool, device=dev).tril()[None]], dim=2)
        with torch.enable_grad():
            x = torch.zeros(b, c, cfg.max_action_dim, device=dev, requires_grad=True)
            v = self.model.velocity(self.act["expert"](x), self.time_terms[0], contexts,
                                    e0.rope.tables(p + steps, e0.head_dim), e0.rope.tables(steps, e0.head_dim),
                                    mask_self, mask_cross)
        if not v.requires_grad:
            raise ValueError(f"RtcConfig.guidance='vjp' needs a backward pass through the action expert, which mode "
                             f"{self.config.mode!r} does not have (its kernels are inference-only); use mode "
                             f"'reference' or guidance='constant'")

    def _vjp_guided(self, x: torch.Tensor, k: int, velocity, rtc: RtcInputs) -> torch.Tensor:
        """The RTC paper's guidance: g = (d x1 / d x)^T e with x1 = x - t * v(x), by one backward pass."""
        t = self.euler_t[k]
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v = velocity(xg, k).float()
            x1 = xg - t * v

            def vjp(e):
                return torch.autograd.grad(x1, xg, e.detach())[0]

            return guided_velocity(x, v.detach(), t, self.rtc_step_weights[k], rtc, vjp)

    def rtc_inputs(self, prev_raw: np.ndarray, delay: int, batch: int = 1) -> RtcInputs:
        """prev_raw [n, action_dim] raw-unit actions still to be executed -> RtcInputs (normalised, padded)."""
        cfg = self.model_config
        prev = np.asarray(prev_raw, dtype=np.float32)
        if prev.ndim != 2 or prev.shape[1] != cfg.action_dim or not 1 <= prev.shape[0] <= cfg.chunk_size:
            raise InputError(f"rtc_prefix must have shape [n, {cfg.action_dim}] with 1 <= n <= {cfg.chunk_size}, "
                             f"got {prev.shape}")
        if not np.isfinite(prev).all():
            raise InputError("rtc_prefix holds non-finite values")
        try:
            inp = rtc_inputs(self.preprocess.normalise_actions(torch.from_numpy(prev)), delay, self.rtc,
                             cfg.chunk_size, cfg.max_action_dim)
        except ValueError as e:
            raise InputError(str(e)) from None
        if batch != 1:
            inp = RtcInputs(inp.prev.expand(batch, -1, -1).contiguous(), inp.weights.expand(batch, -1, -1).contiguous())
        return RtcInputs(inp.prev.to(self.device), inp.weights.to(self.device))

    def sample(self, inp: ModelInputs, noise: torch.Tensor | None = None, rtc: RtcInputs | None = None) -> torch.Tensor:
        """Model-level inputs -> normalised, padded actions [B, C, max_action_dim]; records timings.
        ``rtc``: guide toward a previous chunk (Engine.rtc_inputs / runtime.rtc_guidance.rtc_inputs)."""
        shape = (inp.batch, self.model_config.chunk_size, self.model_config.max_action_dim)
        if noise is None:
            noise = torch.randn(shape, generator=self.generator)
        elif tuple(noise.shape) != shape:
            raise InputError(f"noise must have shape {shape}, got {tuple(noise.shape)}")
        t0 = time.perf_counter()
        prefix = self.prefill(inp)
        t1 = time.perf_counter()
        if rtc is not None and tuple(rtc.prev.shape) != shape:
            raise InputError(f"rtc prefix must be padded to {shape}, got {tuple(rtc.prev.shape)}")
        graph = self.decode_graph if rtc is None else self.decode_graph_rtc
        if graph is not None:
            args = (prefix, noise.float().to(self.device)) + (() if rtc is None else (rtc,))
            actions = graph(*args).clone()
        else:
            actions = self.decode(prefix, noise.float(), rtc=rtc)
        t2 = time.perf_counter()
        self.last_timings = Timings(t1 - t0, t2 - t1, t2 - t0)
        return actions

    # ---- robot-level ----------------------------------------------------------------------------
    def inputs_from_observation(self, obs: Observation) -> ModelInputs:
        frames = {}
        for key in obs.images:
            if key not in self.model_config.camera_keys:
                raise InputError(f"unknown camera {key!r}; the model's cameras are {list(self.model_config.camera_keys)}")
        for key in self.model_config.camera_keys:
            if key in obs.missing:
                frames[key] = None
            elif key not in obs.images:
                raise InputError(f"camera {key!r} has no image (mark it in Observation.missing if it is absent)")
            else:
                frames[key] = image_to_chw01(key, obs.images[key])[None]
        state = torch.as_tensor(np.array(obs.state, dtype=np.float32))[None]
        return self.preprocess(frames, state, [obs.task])

    def predict(self, obs: Observation, *, noise: np.ndarray | None = None, dt: float = 1 / 30, seq: int = 0,
                source: str = "edge", rtc_prefix: np.ndarray | None = None, rtc_delay: int = 0) -> ActionChunk:
        """One observation -> one chunk in raw units. ``dt``: the control period the chunk's rows are spaced by
        (ActionChunk.dt), not the flow-matching step ``euler_dt``; ``noise`` [chunk_size, max_action_dim].
        ``rtc_prefix`` [n, action_dim] raw units: the previous chunk's actions from the one executing when this
        observation was taken on; ``rtc_delay``: control ticks they keep executing while this chunk is computed."""
        t0 = time.perf_counter()
        inp = self.inputs_from_observation(obs)
        rtc = None if rtc_prefix is None else self.rtc_inputs(rtc_prefix, rtc_delay)
        nz = None
        if noise is not None:
            shape = (self.model_config.chunk_size, self.model_config.max_action_dim)
            if np.shape(noise) != shape:
                raise InputError(f"noise must have shape {shape}, got {np.shape(noise)}")
            nz = torch.as_tensor(np.asarray(noise, dtype=np.float32))[None]
        actions = self.preprocess.actions(self.sample(inp, nz, rtc).cpu())[0]
        total = time.perf_counter() - t0
        tm = self.last_timings
        return ActionChunk(actions=actions.numpy().astype(np.float32), dt=dt, stamp=obs.stamp, source=source,
                           model=self.spec.name, seq=seq, inference_s=total, prefill_s=tm.prefill_s,
                           decode_s=tm.decode_s)

    def synthetic_observation(self, seed: int = 0) -> Observation:
        rng = np.random.default_rng(seed)
        images = {k: rng.integers(0, 256, size=(s[1], s[2], 3), dtype=np.uint8)
                  for k, s in self.spec.image_shapes.items()}
        return Observation(images, rng.standard_normal(self.model_config.state_dim).astype(np.float32), "warm up")

    def warmup(self, runs: int = 1) -> None:
        obs = self.synthetic_observation()
        for _ in range(runs):
            self.predict(obs)

    def capture_graphs(self) -> float:
        """CUDA only (call at activate, after warmup): capture the whole decode loop; returns seconds."""
        inp = self.inputs_from_observation(self.synthetic_observation())
        noise = torch.randn((inp.batch, self.model_config.chunk_size, self.model_config.max_action_dim), generator=self.generator)
        prefix = self.prefill(inp)
        self.decode_graph = CapturedPhase(self.decode, (prefix, noise.to(self.device)))
        # the guided decode: one more graph over RtcInputs buffers (any delay/prefix length replays it)
        c, a = self.model_config.chunk_size, self.model_config.action_dim
        rtc = self.rtc_inputs(np.zeros((c, a), dtype=np.float32), 1, inp.batch)
        self.decode_graph_rtc = CapturedPhase(self.decode_rtc, (prefix, noise.to(self.device), rtc))
        return self.decode_graph.capture_s + self.decode_graph_rtc.capture_s

    def plan(self) -> list[dict]:
        return self.resolver.plan_rows()

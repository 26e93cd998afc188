"""vla_node's edge engine, cloud client, shadow mode and Placement (vla.py) made from its parameters (params/vla.py)."""
from __future__ import annotations

import os
from typing import Callable

from edgefm_ros.cloud.client.base import read_token
from edgefm_ros.cloud.client.policy import CloudPolicy
from edgefm_ros.control.delay import DelayEstimator
from edgefm_ros.control.rtc import ChunkContinuation
from edgefm_ros.control.stats import RollingStats
from edgefm_ros.params.vla import VlaNodeConfig
from edgefm_ros.placement.shadow import Shadow, ShadowConfig
from edgefm_ros.placement.vla import Placement, PlacementConfig
from edgefm_ros.runtime.engine import Engine


def expand_path(path: str) -> str | None:
    """~ and $VARS expanded; None for an empty path."""
    return os.path.expanduser(os.path.expandvars(path)) if path else None


def load_engine(cfg: VlaNodeConfig) -> Engine:
    """The edge engine of the checkpoint (paths expanded), with the node's mode, tables, threads, vision
    position ids and real-time chunking settings."""
    return Engine.from_checkpoint(expand_path(cfg.checkpoint), expand_path(cfg.vlm_dir), mode=cfg.mode,
                                  tables=[expand_path(t) for t in cfg.tables], threads=cfg.threads or None,
                                  vision_position_ids=cfg.vision_position_ids, rtc=cfg.rtc())


def make_shadow(cfg: VlaNodeConfig, engine) -> Shadow | None:
    """Shadow mode's sampler and logger when shadow_fraction > 0, else None; the action std of the
    checkpoint is the quality's per-joint scale."""
    if cfg.shadow_fraction <= 0:
        return None
    scfg = ShadowConfig(cfg.shadow_fraction, expand_path(cfg.shadow_log), cfg.shadow_tolerance,
                        cfg.shadow_edge_candidate, cfg.shadow_cloud_candidate)
    std = engine.ckpt.stats.action_std.detach().cpu().numpy()  # (action_dim,)
    return Shadow(scfg, std, len(cfg.camera_keys))


def make_placement(engine, cfg: VlaNodeConfig, run_id: str, lat: dict[str, RollingStats] | None = None,
                   log: Callable[[str, str], None] | None = None) -> Placement:
    """The Placement: the control period, the cloud deadline, shadow mode (ValueError "shadow mode: ..." when
    its log cannot be opened), real-time chunking (the last chunk sent and the delay estimate) when
    ``rtc_enabled``. vla_node calls this on its engine thread (the action std is a tensor of the model)."""
    try:
        shadow = make_shadow(cfg, engine)
    except (ValueError, OSError) as e:
        raise ValueError(f"shadow mode: {e}") from e
    dt, chunk_size = 1.0 / cfg.action_rate_hz, engine.spec.chunk_size
    rtc = ChunkContinuation(DelayEstimator(cfg.delay(chunk_size), dt), chunk_size) if cfg.rtc_enabled else None
    kw = {} if log is None else {"log": log}
    return Placement(engine, PlacementConfig(dt, cfg.cloud_deadline_s, run_id), rtc=rtc, shadow=shadow, lat=lat,
                     **kw)


def make_cloud_policy(cfg: VlaNodeConfig, link=None) -> CloudPolicy:
    """The cloud client of ``cloud_url`` (the bearer token from $EDGEFM_CLOUD_TOKEN, as for edgefm-cloud); ``link``
    observes each call (vla_node publishes the samples for router_node's link estimate)."""
    return CloudPolicy(cfg.cloud_url, read_token(), link=link, joint_names=cfg.action_names)

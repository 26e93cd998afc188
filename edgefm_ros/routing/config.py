"""Router configuration: small frozen dataclasses read from (and written back to) ``config/router.yaml``.

Every ``__post_init__`` raises ValueError naming the bad value. ``load_router_config`` checks the YAML
for unknown keys, so a typo fails loudly instead of silently using a default.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from edgefm_ros.routing.features import FEATURE_NAMES, FeatureConfig, feature_names
from edgefm_ros.routing.link import LinkConfig

PLACEMENTS = ("edge", "cloud")
STRENGTHS = ("blur", "detail", "reasoning")
# The quality model's inputs: a bias plus the 10 features, exposure as a magnitude (see predictor.py).
DESIGN_NAMES = ("bias", "blur", "exposure_abs", "jpeg", "detail") + FEATURE_NAMES[4:]


def design_names(features: FeatureConfig = FeatureConfig()) -> tuple[str, ...]:
    """The coefficients' names under a feature configuration: DESIGN_NAMES, then its extensions as named."""
    return DESIGN_NAMES + feature_names(features)[len(FEATURE_NAMES):]


def _finite(owner: str, name: str, value: float, lo: float = -math.inf, hi: float = math.inf) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"{owner}.{name} must be a finite number in [{lo}, {hi}], got {value!r}")


@dataclass(frozen=True)
class Strengths:
    """How well a candidate copes with what an input needs, each in [0, 1] (1: no penalty)."""

    blur: float = 0.5  # robustness to blur, bad exposure and compression artifacts
    detail: float = 0.5  # fine detail / OCR: cluttered scenes, small parts, text and numbers
    reasoning: float = 0.5  # long, conditional, comparative or context-dependent instructions

    def __post_init__(self) -> None:
        for f in fields(self):
            _finite("Strengths", f.name, getattr(self, f.name), 0.0, 1.0)


@dataclass(frozen=True)
class LatencyModel:
    """Compute time in seconds: fixed + per_gparam * params_b + per_mpix * (cameras * resolution^2 / 1e6)."""

    fixed_s: float = 0.02
    per_gparam_s: float = 0.1
    per_mpix_s: float = 0.1

    def __post_init__(self) -> None:
        for f in fields(self):
            _finite("LatencyModel", f.name, getattr(self, f.name), 0.0)


@dataclass(frozen=True)
class Candidate:
    name: str
    model: str
    precision: str  # key of QualityConfig.precision_logit
    resolution: int  # square input side in pixels the model sees
    placement: str  # "edge" | "cloud"
    params_b: float  # model size, billions of parameters
    base_quality: float  # success probability on a clean, simple request, in (0, 1)
    strengths: Strengths = Strengths()
    latency: LatencyModel = LatencyModel()
    power_w: float = 15.0  # power drawn while computing (edge: the robot's; cloud: unused)
    jpeg_quality: int = 90  # cloud: JPEG quality of the images sent (0: raw); edge: ignored
    coefficients: tuple[float, ...] | None = None  # calibrated, DESIGN_NAMES order; None: prior

    def __post_init__(self) -> None:
        owner = f"Candidate {self.name!r}"
        if not self.name:
            raise ValueError("Candidate.name must not be empty")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"{owner}.placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if not (isinstance(self.resolution, int) and 32 <= self.resolution <= 4096):
            raise ValueError(f"{owner}.resolution must be an int in [32, 4096], got {self.resolution!r}")
        _finite(owner, "params_b", self.params_b, 0.0)
        _finite(owner, "base_quality", self.base_quality, 1e-4, 1 - 1e-4)
        _finite(owner, "power_w", self.power_w, 0.0)
        if not (isinstance(self.jpeg_quality, int) and 0 <= self.jpeg_quality <= 100):
            raise ValueError(f"{owner}.jpeg_quality must be an int in [0, 100], got {self.jpeg_quality!r}")
        if self.coefficients is not None:
            if len(self.coefficients) < len(DESIGN_NAMES):
                raise ValueError(f"{owner}.coefficients has {len(self.coefficients)} values, "
                                 f"expected {len(DESIGN_NAMES)} ({', '.join(DESIGN_NAMES)})")
            for n, c in zip(DESIGN_NAMES, self.coefficients):
                _finite(f"{owner}.coefficients", n, c)


@dataclass(frozen=True)
class QualityConfig:
    """Prior quality model (used until a candidate has calibrated coefficients), see predictor.py."""

    reference_resolution: int = 512
    resolution_logit_per_octave: float = 0.3  # logit change per doubling of resolution
    precision_logit: tuple[tuple[str, float], ...] = (
        ("fp32", 0.0), ("bf16", -0.02), ("fp16", -0.02), ("int8", -0.25), ("int4", -0.6))
    # Largest logit penalty of each input need, for a candidate with strength 0 (DESIGN_NAMES[1:]).
    penalties: tuple[tuple[str, float], ...] = (
        ("blur", 2.0), ("exposure_abs", 1.5), ("jpeg", 1.5), ("detail", 1.5), ("text_length", 0.5),
        ("text_entity", 1.5), ("text_question", 0.5), ("text_lexical", 0.8), ("text_reasoning", 1.2),
        ("text_deictic", 0.6))

    def __post_init__(self) -> None:
        _finite("QualityConfig", "reference_resolution", self.reference_resolution, 32, 4096)
        _finite("QualityConfig", "resolution_logit_per_octave", self.resolution_logit_per_octave)
        for k, v in self.precision_logit:
            _finite("QualityConfig.precision_logit", k, v)
        pen = dict(self.penalties)
        if set(pen) != set(DESIGN_NAMES[1:]):
            raise ValueError(f"QualityConfig.penalties must name exactly {DESIGN_NAMES[1:]}, got {sorted(pen)}")
        for k, v in pen.items():
            _finite("QualityConfig.penalties", k, v, 0.0)


@dataclass(frozen=True)
class CostConfig:
    radio_power_w: float = 2.5  # robot's radio while uploading
    idle_power_w: float = 3.0  # robot's compute while waiting for the cloud
    history_alpha: float = 0.2  # EWMA weight of a new measured/predicted latency ratio
    history_clip: tuple[float, float] = (0.25, 4.0)  # bounds of that correction factor

    def __post_init__(self) -> None:
        _finite("CostConfig", "radio_power_w", self.radio_power_w, 0.0)
        _finite("CostConfig", "idle_power_w", self.idle_power_w, 0.0)
        _finite("CostConfig", "history_alpha", self.history_alpha, 0.0, 1.0)
        lo, hi = self.history_clip
        if not (0 < lo <= 1 <= hi < math.inf):
            raise ValueError(f"CostConfig.history_clip must satisfy 0 < lo <= 1 <= hi, got {self.history_clip}")


@dataclass(frozen=True)
class PolicyConfig:
    delta_min: float = 0.03  # the cloud must beat the best edge candidate's quality by more than this
    guard_mbps: float = 15.0  # below this bandwidth estimate: edge only
    guard_hysteresis_mbps: float = 5.0  # ... until the estimate is back above guard + hysteresis
    # from the edge, the cloud must win by delta_min + this; once there, it stays while it wins by delta_min
    cloud_hysteresis: float = 0.0
    default_deadline_s: float = 1.0
    edge_only: str = ""  # the edge-only baseline's candidate; empty: the first edge candidate
    cloud_only: str = ""  # the cloud-only baseline's (and shadow reference) candidate; empty: first cloud

    def __post_init__(self) -> None:
        check_thresholds(self.delta_min, self.guard_mbps, self.guard_hysteresis_mbps, self.cloud_hysteresis)
        _finite("PolicyConfig", "default_deadline_s", self.default_deadline_s, 1e-3)


# the policy's values that can change at runtime (Router.set_thresholds, router_node's parameters)
THRESHOLDS = ("delta_min", "guard_mbps", "guard_hysteresis_mbps", "cloud_hysteresis")


def check_thresholds(delta_min: float, guard_mbps: float, guard_hysteresis_mbps: float,
                     cloud_hysteresis: float = 0.0) -> None:
    """ValueError naming the bad value: delta_min in [-1, 1], guard and its hysteresis in [0, 10000] Mbps,
    cloud_hysteresis in [0, 1]."""
    _finite("router", "delta_min", delta_min, -1.0, 1.0)
    _finite("router", "guard_mbps", guard_mbps, 0.0, 10000.0)
    _finite("router", "guard_hysteresis_mbps", guard_hysteresis_mbps, 0.0, 10000.0)
    _finite("router", "cloud_hysteresis", cloud_hysteresis, 0.0, 1.0)


@dataclass(frozen=True)
class RouterConfig:
    candidates: tuple[Candidate, ...]
    features: FeatureConfig = FeatureConfig()
    quality: QualityConfig = QualityConfig()
    cost: CostConfig = CostConfig()
    link: LinkConfig = LinkConfig()
    policy: PolicyConfig = PolicyConfig()

    def __post_init__(self) -> None:
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"candidate names must be unique, got {names}")
        if not any(c.placement == "edge" for c in self.candidates):
            raise ValueError(f"at least one edge candidate is needed, got {names}")
        known = dict(self.quality.precision_logit)
        for c in self.candidates:
            if c.precision not in known:
                raise ValueError(f"Candidate {c.name!r}.precision {c.precision!r} is not in "
                                 f"quality.precision_logit {sorted(known)}")
        for role, name, placement in (("edge_only", self.policy.edge_only, "edge"),
                                      ("cloud_only", self.policy.cloud_only, "cloud")):
            if name and name not in {c.name for c in self.candidates if c.placement == placement}:
                raise ValueError(f"policy.{role} {name!r} is not a {placement} candidate of {names}")
        want = len(design_names(self.features))
        for c in self.candidates:
            if c.coefficients is not None and len(c.coefficients) != want:
                raise ValueError(f"Candidate {c.name!r}.coefficients has {len(c.coefficients)} values, expected "
                                 f"{want} ({', '.join(design_names(self.features))})")

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise ValueError(f"unknown candidate {name!r}; known: {[c.name for c in self.candidates]}")

    @property
    def edge_only(self) -> str:
        return self.policy.edge_only or next(c.name for c in self.candidates if c.placement == "edge")

    @property
    def cloud_only(self) -> str | None:
        if self.policy.cloud_only:
            return self.policy.cloud_only
        return next((c.name for c in self.candidates if c.placement == "cloud"), None)


# ---------------------------------------------------------------------------------------------
# YAML <-> dataclasses


def _build(cls, doc: Mapping[str, Any] | None, where: str, **nested):
    """``cls`` from a YAML mapping; ValueError naming ``where``, the key and the value for any bad input."""
    if doc is not None and not isinstance(doc, Mapping):
        raise ValueError(f"{where} must be a mapping, got {doc!r:.200}")
    doc = dict(doc or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted((k for k in doc if k not in known), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    for key, conv in nested.items():
        if key in doc:
            try:
                doc[key] = conv(doc[key])
            except (TypeError, AttributeError) as e:
                raise ValueError(f"{where}.{key}: bad value {doc[key]!r:.200} ({e})") from None
    try:
        return cls(**doc)
    except (TypeError, AttributeError) as e:  # a value of the wrong type met a check or a conversion
        raise ValueError(f"{where}: bad value in {doc!r:.300} ({e})") from None


def _pairs(where: str):
    def conv(v):
        if not isinstance(v, Mapping):
            raise ValueError(f"{where} must be a mapping, got {v!r}")
        return tuple((str(k), float(x)) for k, x in v.items())
    return conv


def _candidate(doc: Mapping[str, Any], names: tuple[str, ...] = DESIGN_NAMES) -> Candidate:
    name = doc.get("name", "?") if isinstance(doc, Mapping) else "?"
    where = f"candidates[{name}]"

    def coeffs(v):
        if v is None:
            return None
        if not isinstance(v, Mapping):
            raise ValueError(f"{where}.coefficients must be a mapping {{name: value}}, got {v!r}")
        missing = [n for n in names if n not in v]
        extra = sorted(set(v) - set(names))
        if missing or extra:
            raise ValueError(f"{where}.coefficients: missing {missing}, unknown {extra}")
        return tuple(float(v[n]) for n in names)

    return _build(Candidate, doc, where,
                  strengths=lambda v: _build(Strengths, v, f"{where}.strengths"),
                  latency=lambda v: _build(LatencyModel, v, f"{where}.latency"),
                  coefficients=coeffs)


def router_config_from_dict(doc: Mapping[str, Any]) -> RouterConfig:
    if not isinstance(doc, Mapping):
        raise ValueError(f"router config must be a mapping, got {type(doc).__name__}")
    cands = doc.get("candidates")
    if not isinstance(cands, list) or not cands:
        raise ValueError(f"router config needs a non-empty 'candidates' list, got {cands!r}")

    def feats(v):
        v = dict(v or {})
        for k in ("analysis_size", "coarse_size"):
            if k in v:
                v[k] = tuple(int(x) for x in v[k])
        if "aggregate" in v:
            v["aggregate"] = tuple((str(k), str(m)) for k, m in dict(v["aggregate"]).items())
        if "signals" in v:
            v["signals"] = tuple(v["signals"] or ())
        return _build(FeatureConfig, v, "features")

    def quality(v):
        return _build(QualityConfig, v, "quality", precision_logit=_pairs("quality.precision_logit"),
                      penalties=_pairs("quality.penalties"))

    def cost(v):
        v = dict(v or {})
        if "history_clip" in v:
            v["history_clip"] = tuple(float(x) for x in v["history_clip"])
        return _build(CostConfig, v, "cost")

    try:  # the coefficients' names depend on the features
        names = design_names(feats(doc.get("features")))
    except (TypeError, AttributeError) as e:
        raise ValueError(f"features: bad value {doc.get('features')!r:.200} ({e})") from None
    return _build(RouterConfig, {**doc, "candidates": cands}, "router config",
                  candidates=lambda v: tuple(_candidate(c, names) for c in v), features=feats, quality=quality,
                  cost=cost, link=lambda v: _build(LinkConfig, v, "link"),
                  policy=lambda v: _build(PolicyConfig, v, "policy"))


def load_router_config(path: str | Path) -> RouterConfig:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"router config {str(p)!r} does not exist")
    try:
        doc = yaml.safe_load(p.read_text())
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"router config {str(p)!r} is not readable YAML: {e}") from None
    return router_config_from_dict(doc)


def router_config_to_dict(cfg: RouterConfig) -> dict[str, Any]:
    def cand(c: Candidate) -> dict[str, Any]:
        d = asdict(c)
        d["coefficients"] = (None if c.coefficients is None
                             else {n: float(v) for n, v in zip(design_names(cfg.features), c.coefficients)})
        return d

    feats = asdict(cfg.features)
    feats["analysis_size"], feats["coarse_size"] = list(cfg.features.analysis_size), list(cfg.features.coarse_size)
    feats["aggregate"] = dict(cfg.features.aggregate)
    feats["signals"] = list(cfg.features.signals)
    quality = asdict(cfg.quality)
    quality["precision_logit"], quality["penalties"] = dict(cfg.quality.precision_logit), dict(cfg.quality.penalties)
    cost = asdict(cfg.cost)
    cost["history_clip"] = list(cfg.cost.history_clip)
    return {"features": feats, "quality": quality, "cost": cost, "link": asdict(cfg.link),
            "policy": asdict(cfg.policy), "candidates": [cand(c) for c in cfg.candidates]}


def write_router_config(cfg: RouterConfig, path: str | Path, header: str = "") -> None:
    text = yaml.safe_dump(router_config_to_dict(cfg), sort_keys=False, default_flow_style=None, width=110)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    Path(path).write_text(comment + text)


def with_coefficients(cfg: RouterConfig, coefficients: Mapping[str, tuple[float, ...]]) -> RouterConfig:
    """A copy of ``cfg`` whose named candidates carry the given coefficients (DESIGN_NAMES order)."""
    cands = tuple(replace(c, coefficients=tuple(float(x) for x in coefficients[c.name]))
                  if c.name in coefficients else c for c in cfg.candidates)
    return replace(cfg, candidates=cands)


__all__ = ["Candidate", "CostConfig", "DESIGN_NAMES", "LatencyModel", "PolicyConfig", "QualityConfig",
           "RouterConfig", "Strengths", "check_thresholds", "design_names", "load_router_config", "router_config_from_dict",
           "router_config_to_dict", "with_coefficients", "write_router_config"]

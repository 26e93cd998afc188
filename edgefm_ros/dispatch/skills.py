"""Skills: a verified kernel implementation plus the dispatch records that select it, as one manifest.

A manifest is a YAML file (shipped ones live in ``edgefm_kernels/skills/``)::

    skill: flashinfer-attention      # name: lower case, digits, '-' or '_'
    version: 1                       # integer >= 1
    summary: FlashInfer single-request attention (prefill, decode, cross, GQA)
    device: cuda                     # cpu | cuda
    hw_profiles: [cuda_sm80, cuda_sm90]   # profiles it was verified on
    requires: [flashinfer]           # Python modules that must be importable
    native: []                       # compiled kernels (edgefm_kernels/csrc/<name>.c) that must build and load here
    modes: [fast]                    # engine modes that load it (default [fast]; exact needs fp32 impls)
    default: true                    # loaded automatically in its modes when available (default true)
    impls:                           # what it provides: registered (op_kind, impl_id) pairs
      - {op_kind: attention, impl_id: flashinfer}
    records:                         # dispatch records (dispatch/table.py format)
      - {hw_profile: cuda, op_kind: attention, impl_id: flashinfer}
    verified: {date: ..., device: ..., max_error: ...}   # optional provenance

Validation (``load_skill``) rejects, naming the file and the value: unknown or missing fields, a bad
name/version/device, an impl that is not registered, a record that does not parse, selects an impl
outside ``impls`` or targets hardware outside ``hw_profiles``, an unknown mode, or an exact-mode skill
whose impls are not fp32. A manifest is also a valid dispatch
table file (its ``records``), so ``tables_for`` returns paths the engine loads like any table.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

import edgefm_kernels
from edgefm_kernels import native
from edgefm_kernels.registry import OP_KINDS, get_impl

from .table import DispatchError, Record, parse_records, read_yaml
from .modes import TUNABLE

FIELDS = {"skill", "version", "summary", "device", "hw_profiles", "requires", "native", "modes", "default", "impls",
          "records", "verified"}
REQUIRED = ("skill", "version", "summary", "device", "hw_profiles", "impls", "records")
DEVICES = ("cpu", "cuda")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
PROFILE = re.compile(r"^(cpu|cuda)(_[a-z0-9]+)*$")


class SkillError(ValueError):
    """A manifest that cannot be used; the message names the file and the bad value."""


def builtin_dir() -> Path:
    return Path(edgefm_kernels.__file__).resolve().parent / "skills"


@dataclass(frozen=True)
class Skill:
    name: str
    version: int
    summary: str
    device: str
    hw_profiles: tuple[str, ...]
    impls: tuple[tuple[str, str], ...]
    records: tuple[Record, ...]
    requires: tuple[str, ...] = ()
    native: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("fast",)
    default: bool = True
    verified: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        where = self.path or "<inline>"
        if not NAME.match(self.name):
            raise SkillError(f"{where}: skill name {self.name!r} must be lower case letters, digits, '-' or '_'")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise SkillError(f"{where}: version must be an integer >= 1, got {self.version!r}")
        if self.device not in DEVICES:
            raise SkillError(f"{where}: device {self.device!r} is not one of {DEVICES}")
        if not self.hw_profiles:
            raise SkillError(f"{where}: hw_profiles is empty")
        for p in self.hw_profiles:
            if not PROFILE.match(p) or not p.startswith(self.device):
                raise SkillError(f"{where}: hw profile {p!r} is not a {self.device} profile (e.g. cuda_sm90, cpu_x86)")
        for kind, impl_id in self.impls:
            if kind not in OP_KINDS:
                raise SkillError(f"{where}: impl op_kind {kind!r} is not one of {OP_KINDS}")
            try:
                get_impl(kind, impl_id)
            except KeyError as e:
                raise SkillError(f"{where}: {e.args[0]}") from None
        for m in self.modes:
            if m not in TUNABLE:  # reference mode loads no skill
                raise SkillError(f"{where}: mode {m!r} is not one of {list(TUNABLE)}")
        if "exact" in self.modes:
            for kind, impl_id in self.impls:
                if get_impl(kind, impl_id).precision != "fp32":
                    raise SkillError(f"{where}: exact mode takes fp32 impls only; ({kind}, {impl_id}) is "
                                     f"{get_impl(kind, impl_id).precision}")
        if not self.records:
            raise SkillError(f"{where}: a skill needs at least one record")
        for rec in self.records:
            if (rec.op_kind, rec.impl_id) not in self.impls:
                raise SkillError(f"{where}: record {rec.quote()} selects ({rec.op_kind}, {rec.impl_id}), "
                                 f"which is not among the skill's impls {list(self.impls)}")
            if not rec.hw_profile or not any(p == rec.hw_profile or p.startswith(rec.hw_profile + "_")
                                             for p in self.hw_profiles):
                raise SkillError(f"{where}: record {rec.quote()} targets hw_profile {rec.hw_profile!r}, "
                                 f"outside the skill's hw_profiles {list(self.hw_profiles)}")

    def matches(self, hw_profile: str) -> bool:
        """True when a record of this skill can select on ``hw_profile``."""
        return any(hw_profile == r.hw_profile or hw_profile.startswith(r.hw_profile + "_") for r in self.records)

    def missing(self) -> str | None:
        """Why the skill cannot run on this machine (a requirement or the device), or None."""
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                return f"skill {self.name!r} needs the Python module {module!r}"
        for name in self.native:
            why = native.unavailable(name)
            if why:
                return f"skill {self.name!r} needs the compiled kernel {name!r}: {why}"
        if self.device == "cuda":
            if not torch.cuda.is_available():
                return f"skill {self.name!r} needs a CUDA device"
        return None


def _strings(value: Any, what: str, where: Path) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise SkillError(f"{where}: {what} must be a list of strings, got {value!r}")
    return tuple(value)


def parse_skill(data: Any, path: Path) -> Skill:
    if not isinstance(data, Mapping):
        raise SkillError(f"{path}: a skill manifest is a mapping, got {type(data).__name__}")
    unknown = sorted((k for k in data if k not in FIELDS), key=str)
    if unknown:
        raise SkillError(f"{path}: unknown field(s) {unknown}; known: {sorted(FIELDS)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise SkillError(f"{path}: missing field(s) {missing}")
    impls = data["impls"]
    if not isinstance(impls, list) or not all(isinstance(i, Mapping) and set(i) == {"op_kind", "impl_id"} for i in impls):
        raise SkillError(f"{path}: impls must be a list of {{op_kind, impl_id}} mappings, got {impls!r}")
    try:
        records = parse_records(data["records"], path.name)
    except DispatchError as e:
        raise SkillError(f"{path}: {e}") from None
    default = data.get("default", True)
    if not isinstance(default, bool):
        raise SkillError(f"{path}: default must be true or false, got {default!r}")
    verified = data.get("verified") or {}
    if not isinstance(verified, Mapping):
        raise SkillError(f"{path}: verified must be a mapping, got {verified!r}")
    return Skill(name=str(data["skill"]), version=data["version"], summary=str(data["summary"]),
                 device=str(data["device"]), hw_profiles=_strings(data["hw_profiles"], "hw_profiles", path),
                 impls=tuple((str(i["op_kind"]), str(i["impl_id"])) for i in impls), records=tuple(records),
                 requires=_strings(data.get("requires", []), "requires", path),
                 native=_strings(data.get("native", []), "native", path),
                 modes=_strings(data.get("modes", ["fast"]), "modes", path), default=default,
                 verified=dict(verified), path=path)


def load_skill(path: str | Path) -> Skill:
    path = Path(path)
    return parse_skill(read_yaml(path, "skill manifest", SkillError), path)


def discover(dirs: list[str | Path] | None = None) -> list[Skill]:
    """Every manifest (``*.yaml``) in ``dirs`` (default: the shipped edgefm_kernels/skills/), sorted by name."""
    skills = []
    for d in dirs if dirs is not None else [builtin_dir()]:
        for p in sorted(Path(d).glob("*.yaml")):
            skills.append(load_skill(p))
    names = [s.name for s in skills]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SkillError(f"skill name(s) {dup} defined more than once in {[str(d) for d in dirs or [builtin_dir()]]}")
    return sorted(skills, key=lambda s: s.name)


def tables_for(hw_profile: str, dirs: list[str | Path] | None = None, names: tuple[str, ...] = (),
               mode: str = "fast") -> list[Path]:
    """Manifests the engine loads for ``hw_profile`` in ``mode``: default skills of that mode (plus ``names``)
    that match the profile and can run here. Raises for a requested name that does not exist or cannot run."""
    skills = discover(dirs)
    known = {s.name: s for s in skills}
    for n in names:
        if n not in known:
            raise SkillError(f"unknown skill {n!r}; known: {sorted(known)}")
        why = known[n].missing()
        if why:
            raise SkillError(why)
    return [s.path for s in skills if (s.default or s.name in names) and mode in s.modes
            and s.matches(hw_profile) and s.missing() is None]

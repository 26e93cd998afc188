"""The operator implementation table: records, matching, and resolution once at build.

A record maps a query to an implementation::

    - {model: smolvla, hw_profile: cuda_sm90, op_kind: attention, layer_role: expert_cross_attn,
       op_name: "", stage: decode, shape_sig: "", impl_id: flashinfer_single_decode, impl_params: {}}

Matching: an empty or ``*`` field is a wildcard; ``hw_profile`` also matches by ``_``-component prefix
(``cuda`` matches ``cuda_sm90``). A more specific match always wins, in the priority
op_name > layer_role > shape_sig > stage > hw_profile (exact beats prefix) > model > op_kind; on a tie
the later record wins, so tables loaded later (user tables) override earlier ones (built-in defaults).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

import edgefm_kernels
from edgefm_kernels.registry import Impl, OpSpec, get_impl

from .modes import check_mode

KEY_FIELDS = ("model", "hw_profile", "op_kind", "layer_role", "op_name", "stage", "shape_sig")
RECORD_FIELDS = KEY_FIELDS + ("impl_id", "impl_params", "provenance")
STAGES = ("prefill", "decode")
TABLE_DIR = Path(__file__).resolve().parent / "tables"


class DispatchError(ValueError):
    """A table record that cannot be used: unknown impl, rejected shape/hardware, malformed."""


def _wild(value: str) -> bool:
    return value in ("", "*")


@dataclass(frozen=True)
class Record:
    impl_id: str
    op_kind: str = ""
    model: str = ""
    hw_profile: str = ""
    layer_role: str = ""
    op_name: str = ""
    stage: str = ""
    shape_sig: str = ""
    impl_params: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # "file.yaml#index", for error messages

    def __post_init__(self) -> None:
        if not self.impl_id:
            raise DispatchError(f"record {self.quote()} has no impl_id")
        if not _wild(self.stage) and self.stage not in STAGES:
            raise DispatchError(f"record {self.quote()}: stage {self.stage!r} is not one of {STAGES}")
        if not isinstance(self.impl_params, Mapping):
            raise DispatchError(f"record {self.quote()}: impl_params must be a mapping")

    def quote(self) -> str:
        fields = {k: getattr(self, k) for k in KEY_FIELDS + ("impl_id",) if getattr(self, k)}
        if self.impl_params:
            fields["impl_params"] = dict(self.impl_params)
        return f"{fields} (from {self.source or '<inline>'})"

    def specificity(self, spec: OpSpec) -> tuple[int, ...] | None:
        """Rank of this record for ``spec`` (higher wins), or None when it does not match."""
        rank = []
        for name in ("op_name", "layer_role", "shape_sig", "stage"):
            mine = getattr(self, name)
            if _wild(mine):
                rank.append(0)
            elif mine == getattr(spec, name):
                rank.append(1)
            else:
                return None
        if _wild(self.hw_profile):
            rank.append(0)
        elif self.hw_profile == spec.hw_profile:
            rank.append(2)
        elif spec.hw_profile.startswith(self.hw_profile + "_"):
            rank.append(1)
        else:
            return None
        for name in ("model", "op_kind"):
            mine = getattr(self, name)
            if _wild(mine):
                rank.append(0)
            elif mine == getattr(spec, name):
                rank.append(1)
            else:
                return None
        return tuple(rank)


def parse_records(data: Any, source: str) -> list[Record]:
    """Records from parsed YAML: a list of mappings, or ``{records: [...]}`` with optional metadata."""
    if isinstance(data, Mapping):
        data = data.get("records", [])
    if data is None:
        return []
    if not isinstance(data, list):
        raise DispatchError(f"{source}: a dispatch table is a list of records, got {type(data).__name__}")
    records = []
    for i, raw in enumerate(data):
        where = f"{source}#{i}"
        if not isinstance(raw, Mapping):
            raise DispatchError(f"{where}: a record is a mapping, got {raw!r}")
        unknown = sorted((k for k in raw if k not in RECORD_FIELDS), key=str)
        if unknown:
            raise DispatchError(f"{where}: unknown field(s) {unknown} in record {dict(raw)}; known: {RECORD_FIELDS}")
        for k in ("impl_params", "provenance"):
            if raw.get(k) is not None and not isinstance(raw[k], Mapping):
                raise DispatchError(f"{where}: {k} must be a mapping, got {raw[k]!r}")
        values = {k: ("" if raw.get(k) is None else str(raw[k])) for k in KEY_FIELDS if k in raw}
        rec = Record(impl_id=str(raw.get("impl_id") or ""), impl_params=dict(raw.get("impl_params") or {}),
                     provenance=dict(raw.get("provenance") or {}), source=where, **values)
        if not _wild(rec.op_kind):
            try:
                get_impl(rec.op_kind, rec.impl_id)
            except KeyError as e:
                raise DispatchError(f"record {rec.quote()}: {e.args[0]}") from None
        records.append(rec)
    return records


def read_yaml(path: Path, what: str, error: type[ValueError] = DispatchError) -> Any:
    """Parsed YAML of ``path``; unreadable or invalid files raise ``error`` naming ``what`` and the file."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read {what} {path}: {e}") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise error(f"{what} {path} is not valid YAML: {e}") from None


def load_table(path: str | Path) -> list[Record]:
    path = Path(path)
    return parse_records(read_yaml(path, "dispatch table"), path.name)


@dataclass(frozen=True)
class Resolved:
    spec: OpSpec
    record: Record
    impl: Impl


class Table:
    """An ordered list of records; later records win ties."""

    def __init__(self, records: Sequence[Record]):
        self.records = tuple(records)

    @classmethod
    def from_files(cls, paths: Iterable[str | Path]) -> "Table":
        records: list[Record] = []
        for p in paths:
            records.extend(load_table(p))
        return cls(records)

    def lookup(self, spec: OpSpec) -> Record:
        best, best_rank = None, None
        for index, rec in enumerate(self.records):
            rank = rec.specificity(spec)
            if rank is not None and (best_rank is None or rank + (index,) >= best_rank):
                best, best_rank = rec, rank + (index,)
        if best is None:
            raise DispatchError(f"no record matches {spec.op_kind} {spec.op_name!r} ({spec.layer_role}, "
                                f"{spec.stage}, {spec.shape_sig}, {spec.hw_profile}); the built-in table maps "
                                f"every op_kind to its reference, was it loaded?")
        return best

    def resolve(self, spec: OpSpec) -> Resolved:
        rec = self.lookup(spec)
        try:
            impl = get_impl(spec.op_kind, rec.impl_id)
        except KeyError as e:
            raise DispatchError(f"record {rec.quote()} selected for {spec.op_name!r}: {e.args[0]}") from None
        reason = impl.rejects(spec, rec.impl_params)
        if reason:
            raise DispatchError(f"record {rec.quote()} selected for {spec.op_name!r} "
                                f"(shape {spec.shape_sig}, hw {spec.hw_profile}): {reason}")
        return Resolved(spec, rec, impl)


def builtin_tables(mode: str) -> list[Path]:
    """Built-in tables for a mode: the reference table, then the mode's own."""
    check_mode(mode)
    names = {"reference": ["reference.yaml"], "exact": ["reference.yaml", "exact.yaml"],
             "fast": ["reference.yaml", "exact.yaml", "fast.yaml"]}[mode]
    return [TABLE_DIR / n for n in names]


class OpResolver:
    """What models call to get their kernels: resolves every op once, when the model is built.

    ``stage_of(layer_role)`` maps a role to its phase, so models never name phases themselves.
    ``fallback``: the tables without the tuned one. A tuned table is a record of measurements on some
    machine, not an instruction: where its record cannot serve here (a compiled kernel that does not
    build, another CPU), the op resolves without it and the reason is kept in ``overruled``. Records of
    built-in and user tables stay build-time errors.
    """

    def __init__(self, table: Table, hw_profile: str, model: str, stage_of, fallback: Table | None = None,
                 files: Sequence[Path] = (), tuned: Path | None = None):
        self.table, self.hw_profile, self.model, self.stage_of = table, hw_profile, model, stage_of
        self.fallback = fallback  # ``table`` without its machine-made (tuned) part, or None
        self.files, self.tuned = tuple(files), tuned  # the table files loaded (resolver.build_resolver), the tuned one
        self.resolved: list[Resolved] = []
        self.overruled: list[str] = []  # tuned records that could not serve here, and why
        self.wrap = None  # (spec, impl, op, operands) -> op: set before the model is built to instrument every op

    def restaged(self, stage_of) -> "OpResolver":
        """The same tables with another role -> stage map (and its own record of what it resolved)."""
        return OpResolver(self.table, self.hw_profile, self.model, stage_of, self.fallback, self.files, self.tuned)

    def build(self, op_kind: str, op_name: str, layer_role: str, shape_sig: str,
              dims: Mapping[str, int] | None = None, **operands):
        spec = OpSpec(op_kind=op_kind, op_name=op_name, layer_role=layer_role, stage=self.stage_of(layer_role),
                      shape_sig=shape_sig, hw_profile=self.hw_profile, model=self.model, dims=dict(dims or {}))
        try:
            r = self.table.resolve(spec)
        except DispatchError as e:
            if self.fallback is None:
                raise
            r = self.fallback.resolve(spec)  # the same error again when the record was not the tuned one's
            self.overruled.append(f"{op_name}: {e}")
        self.resolved.append(r)
        try:
            op = r.impl.build(spec, dict(r.record.impl_params), **operands)
        except (ValueError, TypeError, RuntimeError) as e:
            raise DispatchError(f"record {r.record.quote()} failed to build {op_name!r}: {e}") from e
        return op if self.wrap is None else self.wrap(spec, r.impl, op, operands)

    # conveniences that derive the shape signature from the operands
    def linear(self, op_name: str, layer_role: str, weights):
        d_in = weights[0][0].shape[1]
        sig = f"{d_in}->" + "+".join(str(w.shape[0]) for w, _ in weights)
        return self.build("linear", op_name, layer_role, sig, {"in": d_in}, weights=weights)

    def attention(self, op_name: str, layer_role: str, heads: int, kv_heads: int, head_dim: int):
        return self.build("attention", op_name, layer_role, f"h{heads}/{kv_heads}xd{head_dim}",
                          {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim})

    def mlp(self, op_name: str, layer_role: str, weights, act: str, hidden: int, inner: int):
        return self.build("mlp", op_name, layer_role, f"{act}:{hidden}x{inner}", {"hidden": hidden, "inner": inner},
                          weights=weights, act=act)

    def rms_norm(self, op_name: str, layer_role: str, weight, eps: float):
        return self.build("rms_norm", op_name, layer_role, f"d{weight.shape[0]}", weight=weight, eps=eps)

    def layer_norm(self, op_name: str, layer_role: str, weight, bias, eps: float):
        return self.build("layer_norm", op_name, layer_role, f"d{weight.shape[0]}", weight=weight, bias=bias, eps=eps)

    def rope(self, op_name: str, layer_role: str, head_dim: int, max_wavelength: float):
        return self.build("rope", op_name, layer_role, f"d{head_dim}", max_wavelength=max_wavelength)

    def plan_rows(self) -> list[dict[str, str]]:
        rows = []
        for r in self.resolved:
            rows.append({"op_name": r.spec.op_name, "op_kind": r.spec.op_kind, "layer_role": r.spec.layer_role,
                         "stage": r.spec.stage, "shape_sig": r.spec.shape_sig, "impl_id": r.record.impl_id,
                         "impl_params": dict(r.record.impl_params) or "", "record": r.record.source})
        return rows


__all__ = ["DispatchError", "Record", "Table", "OpResolver", "Resolved", "builtin_tables", "load_table",
           "parse_records", "edgefm_kernels"]

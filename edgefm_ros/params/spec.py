"""One declaration per parameter, and what is made from it.

A node's parameters are the fields of one frozen dataclass (a ``NodeConfig`` subclass); each field's default
is a ``param(...)`` that says the rest: description, range or choices, and whether it may change at runtime.
From that one declaration come the ``ParamSpec`` list (``Config.PARAMS``: what ros/params.py declares on the
node, and what parameter files are checked against) and the typed config (``Config.from_values``)::

    class ActionNodeConfig(NodeConfig, node="action_node"):
        control_rate_hz: float = param(50.0, "Rate at which one action is published.", range=(1.0, 1000.0))

        def __post_init__(self):  # checks across parameters; ValueError naming the bad value
            ...

The field's annotation is the parameter's type: bool, int, float, str, tuple[str, ...], tuple[float, ...],
tuple[int, ...]; ``float | None`` (any of them ``| None``) with a None default declares a parameter with no default,
unset until a parameter file or ``ros2 param set`` gives it one (router_node's thresholds: their defaults come
from the router YAML). No ROS here: parameter files are checked without it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping, Sequence, dataclass_transform

TYPES = ("bool", "int", "float", "str", "str[]", "float[]", "int[]")
_ANNOTATIONS = {"bool": "bool", "int": "int", "float": "float", "str": "str", "tuple[str, ...]": "str[]",
                "tuple[float, ...]": "float[]", "tuple[int, ...]": "int[]"}


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # one of TYPES
    default: Any  # None: no default (unset until given)
    description: str
    range: tuple[float, float] | None = None  # inclusive, for int/float (each element for arrays)
    choices: tuple[str, ...] = ()  # allowed values for str (each element for str[])
    read_only: bool = True  # False: may change while the node runs (`ros2 param set`)

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"ParamSpec {self.name!r}: type must be one of {TYPES}, got {self.type!r}")
        if self.default is not None:
            check_value(self, self.default)


def _coerce(name: str, t: str, value: Any) -> Any:
    if t == "bool" and isinstance(value, bool):
        return value
    if t == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if t == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if t == "str" and isinstance(value, str):
        return value
    if t.endswith("[]") and isinstance(value, (list, tuple)):
        return tuple(_coerce(name, t[:-2], v) for v in value)
    raise ValueError(f"parameter {name!r} must be of type {t}, got {value!r}")


def check_value(spec: ParamSpec, value: Any) -> Any:
    """The value coerced to the spec's type; ValueError naming the parameter and the bad value. None stays
    None for a parameter declared without a default."""
    if value is None and spec.default is None:
        return None
    v = _coerce(spec.name, spec.type, value)
    items = v if spec.type.endswith("[]") else (v,)
    for x in items:
        if spec.range is not None and isinstance(x, (int, float)):
            lo, hi = spec.range
            if not (math.isfinite(x) and lo <= x <= hi):
                raise ValueError(f"parameter {spec.name!r} = {value!r} is outside [{lo}, {hi}]")
        if spec.choices and x not in spec.choices:
            raise ValueError(f"parameter {spec.name!r} = {value!r}: choose from {list(spec.choices)}")
    return v


def validate(specs: Sequence[ParamSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with ``values``; unknown names and bad values raise ValueError."""
    by_name = {s.name: s for s in specs}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise ValueError(f"unknown parameters {unknown}; declared: {sorted(by_name)}")
    out = {s.name: check_value(s, s.default) for s in specs}
    out.update({k: check_value(by_name[k], v) for k, v in values.items()})
    return out


def unknown_in_params_file(doc: Mapping[str, Any], node_name: str, specs: Iterable[ParamSpec]) -> list[str]:
    """Parameter names under ``node_name: ros__parameters:`` in a loaded params file that are not declared."""
    params = ((doc.get(node_name) or {}).get("ros__parameters") or {})
    return sorted(set(params) - {s.name for s in specs})


@dataclass(frozen=True)
class _Declared:
    description: str
    range: tuple[float, float] | None
    choices: tuple[str, ...]
    read_only: bool


def param(default: Any, description: str, *, range: tuple[float, float] | None = None,
          choices: Sequence[str] = (), read_only: bool = True) -> Any:
    """A parameter, declared as the default of a ``NodeConfig`` field (the annotation gives its type)."""
    return dataclasses.field(default=default, metadata={"param": _Declared(description, range, tuple(choices),
                                                                           read_only)})


def _type_of(cls: type, field: dataclasses.Field) -> str:
    t = field.type
    text = t if isinstance(t, str) else t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")
    base = text.replace(" | None", "").strip()
    if base not in _ANNOTATIONS:
        raise TypeError(f"{cls.__name__}.{field.name}: parameter type {text!r} is not one of {list(_ANNOTATIONS)}")
    return _ANNOTATIONS[base]


def _spec(cls: type, field: dataclasses.Field) -> ParamSpec:
    d = field.metadata.get("param")
    if d is None:
        raise TypeError(f"{cls.__name__}.{field.name}: declare it with param(default, description, ...)")
    default = field.default
    return ParamSpec(field.name, _type_of(cls, field), default, d.description, d.range, d.choices, d.read_only)


@dataclass_transform(frozen_default=True, field_specifiers=(param,))
class NodeConfig:
    """Base of each node's parameter declaration: a subclass (``class C(NodeConfig, node="name")``) is made a
    frozen dataclass whose fields are the parameters, with ``NODE`` (the node's default name) and ``PARAMS``
    (one ``ParamSpec`` per field, in field order). The two parameters every node has are declared here."""

    NODE: ClassVar[str] = ""
    PARAMS: ClassVar[tuple[ParamSpec, ...]] = ()

    diagnostics_period_s: float = param(1.0, "Period of /diagnostics.", range=(0.05, 60.0))
    autostart: bool = param(False, "Configure and activate on start (no lifecycle manager needed).")

    def __init_subclass__(cls, node: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not node:
            raise TypeError(f"{cls.__name__}: name the node: class {cls.__name__}(NodeConfig, node='...')")
        dataclass(frozen=True)(cls)
        cls.NODE = node
        cls.PARAMS = tuple(_spec(cls, f) for f in dataclasses.fields(cls))

    @classmethod
    def from_values(cls, values: Mapping[str, Any]):
        """The config from parameter values (missing names take their defaults); ValueError naming an unknown
        name or a bad value."""
        v = validate(cls.PARAMS, values)
        return cls(**{s.name: v[s.name] for s in cls.PARAMS})

    @classmethod
    def spec(cls, name: str) -> ParamSpec:
        for s in cls.PARAMS:
            if s.name == name:
                return s
        raise KeyError(f"{cls.NODE} declares no parameter {name!r}")


dataclass(frozen=True)(NodeConfig)  # the base's own two fields (a subclass's dataclass collects them)

"""Parameters declared in one place: a node lists ``ParamSpec``s; declaring, validating and reading them is here.

The specs are plain data (no rclpy import at module level), so configuration files can be checked against
them without ROS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

TYPES = ("bool", "int", "float", "str", "str[]", "float[]", "int[]")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # one of TYPES
    default: Any
    description: str
    range: tuple[float, float] | None = None  # inclusive, for int/float (each element for arrays)
    choices: tuple[str, ...] = ()  # allowed values for str (each element for str[])

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"ParamSpec {self.name!r}: type must be one of {TYPES}, got {self.type!r}")
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
    """The value coerced to the spec's type; ValueError naming the parameter and the bad value."""
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


def declare(node, specs: Sequence[ParamSpec]) -> dict[str, Any]:
    """Declare every spec on an rclpy node (read-only, with description and range) and read the values."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
    from rclpy.parameter import Parameter

    ptypes = {"bool": Parameter.Type.BOOL, "int": Parameter.Type.INTEGER, "float": Parameter.Type.DOUBLE,
              "str": Parameter.Type.STRING, "str[]": Parameter.Type.STRING_ARRAY,
              "float[]": Parameter.Type.DOUBLE_ARRAY, "int[]": Parameter.Type.INTEGER_ARRAY}
    values = {}
    for s in specs:
        text = s.description + (f" Choices: {', '.join(s.choices)}." if s.choices else "")
        d = ParameterDescriptor(description=text, read_only=True)
        if s.range is not None and s.type in ("int", "float"):
            if s.type == "int":
                d.integer_range = [IntegerRange(from_value=int(s.range[0]), to_value=int(s.range[1]), step=0)]
            else:
                d.floating_point_range = [FloatingPointRange(from_value=float(s.range[0]),
                                                             to_value=float(s.range[1]), step=0.0)]
        # empty arrays cannot carry their type: declare the type, fall back to the default when unset
        default = ptypes[s.type] if s.type.endswith("[]") and not s.default else _ros_value(s)
        p = node.declare_parameter(s.name, default, d)
        v = p.value
        values[s.name] = s.default if v is None else v
    return validate(specs, values)


def _ros_value(spec: ParamSpec) -> Any:
    return list(spec.default) if spec.type.endswith("[]") else spec.default

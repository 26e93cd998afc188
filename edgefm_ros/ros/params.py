"""A node's parameter declaration (edgefm_ros/params) made rclpy parameters: declared with their description,
range and read-only flag, read back, and checked again when one that may change at runtime is set."""
from __future__ import annotations

from typing import Any, Sequence

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.parameter import Parameter

from edgefm_ros.params.spec import ParamSpec, check_value, validate

PTYPES = {"bool": Parameter.Type.BOOL, "int": Parameter.Type.INTEGER, "float": Parameter.Type.DOUBLE,
          "str": Parameter.Type.STRING, "str[]": Parameter.Type.STRING_ARRAY,
          "float[]": Parameter.Type.DOUBLE_ARRAY, "int[]": Parameter.Type.INTEGER_ARRAY}


def descriptor(s: ParamSpec) -> ParameterDescriptor:
    """The spec as rclpy describes it (``ros2 param describe``). A runtime parameter's range goes in its
    description only: rclpy would refuse an out-of-range value before the node's own check, which names the
    value (``check_set``)."""
    text = s.description + (f" Choices: {', '.join(s.choices)}." if s.choices else "")
    if s.range is not None and not s.read_only:
        text += f" Range [{s.range[0]}, {s.range[1]}]; validated on set."
    d = ParameterDescriptor(description=text, read_only=s.read_only)
    if s.range is not None and s.read_only and s.type in ("int", "float"):
        if s.type == "int":
            d.integer_range = [IntegerRange(from_value=int(s.range[0]), to_value=int(s.range[1]), step=0)]
        else:
            d.floating_point_range = [FloatingPointRange(from_value=float(s.range[0]), to_value=float(s.range[1]),
                                                         step=0.0)]
    return d


def declare(node, specs: Sequence[ParamSpec]) -> dict[str, Any]:
    """Declare every spec on an rclpy node and read the values (validated: ValueError naming a bad one)."""
    values = {}
    for s in specs:
        # an empty array or an unset parameter cannot carry its type: declare the type alone
        unset = s.default is None or (s.type.endswith("[]") and not s.default)
        default = PTYPES[s.type] if unset else list(s.default) if s.type.endswith("[]") else s.default
        v = node.declare_parameter(s.name, default, descriptor(s)).value
        values[s.name] = s.default if v is None else v
    return validate(specs, values)


def check_set(specs: Sequence[ParamSpec], params) -> dict[str, Any]:
    """The values of ``params`` (rclpy Parameters being set) that are declared runtime-changeable, checked
    against their specs; ValueError naming a bad value. Read-only ones never get here (rclpy refuses them)."""
    by_name = {s.name: s for s in specs if not s.read_only}
    return {p.name: check_value(by_name[p.name], p.value) for p in params if p.name in by_name}

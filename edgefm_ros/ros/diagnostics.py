"""diagnostic_msgs helpers: one DiagnosticStatus from a level, a message and a dict of values."""
from __future__ import annotations

import math
from typing import Mapping

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

OK, WARN, ERROR, STALE = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR, DiagnosticStatus.STALE


def format_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def make_status(name: str, hardware_id: str, level: bytes, message: str,
                values: Mapping[str, object]) -> DiagnosticStatus:
    return DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                            values=[KeyValue(key=k, value=format_value(v)) for k, v in values.items()])


def make_array(stamp, statuses: list[DiagnosticStatus]) -> DiagnosticArray:
    msg = DiagnosticArray(status=statuses)
    msg.header.stamp = stamp
    return msg


def publish_status(node, pub, what: str, level: bytes, message: str, values: Mapping[str, object]) -> None:
    """One status "<node name>: <what>" on ``pub`` (/diagnostics); nothing once the context is gone."""
    status = make_status(f"{node.get_name()}: {what}", node.get_fully_qualified_name(), level, message, values)
    try:
        pub.publish(make_array(node.get_clock().now().to_msg(), [status]))
    except Exception:  # context gone during shutdown
        pass


def status_values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def worst(levels: list[bytes]) -> bytes:
    """The most severe of the given levels (OK < WARN < ERROR < STALE)."""
    return max(levels, key=lambda b: b[0]) if levels else OK

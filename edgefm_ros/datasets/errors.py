"""The error a bad recording raises: it names the bag, the topic and the time."""
from __future__ import annotations


def format_time(t_ns: int | None, bag_start_ns: int | None = None) -> str:
    """'t=1761234567.123456789 s (12.345 s into the bag)' or 't=... s'."""
    if t_ns is None:
        return ""
    s = f"t={t_ns // 10**9}.{t_ns % 10**9:09d} s"
    if bag_start_ns is not None:
        s += f" ({(t_ns - bag_start_ns) * 1e-9:.3f} s into the bag)"
    return s


class RecordingError(ValueError):
    """A recording that cannot become a dataset. ``str(e)``: 'BAG: TOPIC at t=...: what is wrong'."""

    def __init__(self, bag: str, topic: str | None, t_ns: int | None, problem: str,
                 bag_start_ns: int | None = None):
        self.bag, self.topic, self.t_ns, self.problem = str(bag), topic, t_ns, problem
        where = self.bag
        if topic:
            where += f": topic {topic}"
        when = format_time(t_ns, bag_start_ns)
        if when:
            where += f" at {when}"
        super().__init__(f"{where}: {problem}")

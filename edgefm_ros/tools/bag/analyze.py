"""Read a recorded run (chunks, commands, queue status, routes, diagnostics) back into numpy arrays."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from rosbags.rosbag2 import Reader

from edgefm_ros.tools.bag.typestore import make_typestore

CHUNK, STATUS, ROUTE, DIAG = ("edgefm_ros/msg/ActionChunk", "edgefm_ros/msg/QueueStatus",
                              "edgefm_ros/msg/RouteDecision", "diagnostic_msgs/msg/DiagnosticArray")
COMMANDS = ("trajectory_msgs/msg/JointTrajectory", "std_msgs/msg/Float64MultiArray", "sensor_msgs/msg/JointState")


def _sec(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


@dataclass
class Run:
    """Arrays in recording order; times in seconds (ROS time)."""

    chunk_recv: list = field(default_factory=list)  # receive time
    chunk_stamp: list = field(default_factory=list)  # observation time (header)
    chunk_seq: list = field(default_factory=list)
    chunk_source: list = field(default_factory=list)
    chunk_inference: list = field(default_factory=list)  # observation -> chunk ready (s)
    chunk_prefill: list = field(default_factory=list)
    chunk_decode: list = field(default_factory=list)
    chunk_joint_names: set = field(default_factory=set)
    chunk_shape: set = field(default_factory=set)
    cmd_recv: list = field(default_factory=list)
    cmd_stamp: list = field(default_factory=list)  # header stamp (receive time for Float64MultiArray)
    cmd_pos: list = field(default_factory=list)
    cmd_joint_names: set = field(default_factory=set)
    status_time: list = field(default_factory=list)
    status_depth: list = field(default_factory=list)
    status_holding: list = field(default_factory=list)
    status_underruns: list = field(default_factory=list)
    routes: Counter = field(default_factory=Counter)
    diagnostics: dict = field(default_factory=dict)  # status name -> (level, message, {key: value}) last seen
    diag_history: list = field(default_factory=list)  # (time, name, level, message, values)

    @property
    def positions(self) -> np.ndarray:  # (n_commands, n_joints)
        return np.asarray(self.cmd_pos, dtype=np.float64)


def read_run(path: str, command_topic: str | None = None) -> Run:
    ts = make_typestore()
    run = Run()
    with Reader(path) as r:
        for conn, t_ns, data in r.messages():
            t = t_ns * 1e-9
            mt = conn.msgtype
            if mt in (CHUNK, STATUS, ROUTE, DIAG) or (mt in COMMANDS and conn.topic == (command_topic or conn.topic)):
                m = ts.deserialize_cdr(data, mt)
            else:
                continue
            if mt == CHUNK:
                run.chunk_recv.append(t)
                run.chunk_stamp.append(_sec(m.header.stamp))
                run.chunk_seq.append(int(m.sequence))
                run.chunk_source.append(m.source)
                run.chunk_inference.append(m.inference_time)
                run.chunk_prefill.append(m.prefill_time)
                run.chunk_decode.append(m.decode_time)
                run.chunk_joint_names.add(tuple(m.joint_names))
                run.chunk_shape.add((int(m.chunk_size), int(m.action_dim)))
            elif mt == STATUS:
                run.status_time.append(t)
                run.status_depth.append(int(m.queue_size))
                run.status_holding.append(bool(m.holding))
                run.status_underruns.append(int(m.underruns))
            elif mt == ROUTE:
                run.routes[m.target] += 1
            elif mt == DIAG:
                for s in m.status:
                    vals = {kv.key: kv.value for kv in s.values}
                    run.diagnostics[s.name] = (int(s.level[0]) if isinstance(s.level, bytes) else int(s.level),
                                               s.message, vals)
                    run.diag_history.append((t, s.name, run.diagnostics[s.name][0], s.message, vals))
            else:
                _add_command(run, mt, m, t)
    return run


def _add_command(run: Run, mt: str, m, t: float) -> None:
    run.cmd_recv.append(t)
    if mt == COMMANDS[0]:
        run.cmd_stamp.append(_sec(m.header.stamp))
        run.cmd_pos.append(np.asarray(m.points[0].positions, dtype=np.float64))
        run.cmd_joint_names.add(tuple(m.joint_names))
    elif mt == COMMANDS[1]:
        run.cmd_stamp.append(t)
        run.cmd_pos.append(np.asarray(m.data, dtype=np.float64))
    else:
        run.cmd_stamp.append(_sec(m.header.stamp))
        run.cmd_pos.append(np.asarray(m.position, dtype=np.float64))
        run.cmd_joint_names.add(tuple(m.name))


def percentiles(x, qs=(50, 99)) -> dict[str, float]:
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return {f"p{q}": float("nan") for q in qs} | {"max": float("nan")}
    return {f"p{q}": float(np.percentile(a, q)) for q in qs} | {"max": float(a.max())}


def period_counts(d: np.ndarray, period: float) -> dict[str, float]:
    """From the intervals ``d`` between consecutive commands (seconds): missed, periods skipped by a late
    command; early, commands less than half a period after the last (a catch-up after a stall); stalls, late
    commands as events (one stall of the process, however many periods it skipped). Counted apart: summed, one
    early command would hide a missed one. All NaN for no interval."""
    ticks = np.round(np.asarray(d, dtype=np.float64) / period)  # periods between consecutive commands
    if ticks.size == 0:
        return dict.fromkeys(("missed", "early", "stalls"), float("nan"))
    return {"missed": float(np.sum(np.maximum(ticks - 1, 0))), "early": float(np.sum(ticks == 0)),
            "stalls": float(np.sum(ticks >= 2))}


def command_timing(run: Run, period: float, t0: float = -np.inf, t1: float = np.inf) -> dict[str, float]:
    """Rate and |period error| of the commands stamped within [t0, t1]."""
    t = np.asarray(run.cmd_stamp, dtype=np.float64)
    t = t[(t >= t0) & (t <= t1)]
    if t.size < 2:
        return {"commands": float(t.size), "rate_hz": float("nan"), "err_p50_ms": float("nan"),
                "err_p99_ms": float("nan"), "err_max_ms": float("nan"), **period_counts([], period)}
    d = np.diff(t)
    p = percentiles(np.abs(d - period) * 1e3)
    return {"commands": float(t.size), "rate_hz": (t.size - 1) / (t[-1] - t[0]), "err_p50_ms": p["p50"],
            "err_p99_ms": p["p99"], "err_max_ms": p["max"], **period_counts(d, period)}

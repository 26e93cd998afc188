"""Control-rate benchmark: action_node at 50 Hz while vla_node infers (by default continuously: chunk_size_threshold
1.0, a new chunk as soon as the last is merged), on a looping synthetic bag; real processes and DDS.

Reports, from the recorded commands (header stamp = publish time) after the warm-up: achieved rate, |period
error| p50/p99/max, missed ticks; queue-empty ticks (from action_node's QueueStatus); chunks arrived and their
inference time; frame-to-action latency (the chunk's observation stamp, the newest of its camera frames and joint
state, to the first command after the chunk arrived; a chunk whose rows are all past by then is counted late).
Passes (exit 0) when p99 |period error| <= 2 ms, no missed or early ticks and the queue is never empty.

    source scripts/env.sh && python benchmarks/bench_control_rate.py [--duration 60] [--realtime-priority 50]
    # issue 15: FULL fast mode, chunk 50 at 50 Hz, threshold 0.5, 60 s
    python benchmarks/bench_control_rate.py --preset realtime --checkpoint DIR --vlm VLM_DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

# option -> value when neither it nor a preset sets it; presets override these, options override presets
DEFAULTS = {"mode": "exact", "chunk_size_threshold": 1.0, "duration": 60.0, "action_rate_hz": 30.0, "warmup": 1.0}
PRESETS = {"realtime": {"mode": "fast", "chunk_size_threshold": 0.5, "duration": 60.0, "action_rate_hz": 50.0,
                        "warmup": 5.0}}
BAG_BYTES = 200e6  # raw frames in the looping bag at most (a 3x480x640 bag loops every ~2.4 s)


def parse(argv=None) -> argparse.Namespace:
    from edgefm_ros.dispatch.modes import MODES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), help="realtime: issue 15's check (fast mode, threshold "
                   "0.5, chunk rows at the control rate, 60 s after 5 s warm-up); needs --checkpoint")
    p.add_argument("--duration", type=float, help=f"seconds measured after the warm-up ({DEFAULTS['duration']:g})")
    p.add_argument("--warmup", type=float, help=f"seconds from the first chunk to measuring ({DEFAULTS['warmup']:g})")
    p.add_argument("--rate", type=float, default=50.0, help="control rate (Hz)")
    p.add_argument("--transport", default="raw", choices=("raw", "compressed"),
                   help="camera frames as sensor_msgs/Image or JPEG CompressedImage (decoded only when used)")
    p.add_argument("--mode", choices=MODES, help=f"vla_node engine mode ({DEFAULTS['mode']})")
    p.add_argument("--chunk-size-threshold", type=float, help="action_node requests a chunk below this queue "
                   f"fill ({DEFAULTS['chunk_size_threshold']:g}: infer continuously)")
    p.add_argument("--action-rate-hz", type=float, help=f"rate of the chunk's rows ({DEFAULTS['action_rate_hz']:g})")
    p.add_argument("--realtime-priority", type=int, default=50 if os.geteuid() == 0 else 0,
                   help="SCHED_FIFO priority of the control thread (0: normal scheduling)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of vla_node (2: both cores busy)")
    p.add_argument("--checkpoint", help="model (default: the demo checkpoint, random weights)")
    p.add_argument("--vlm", help="VLM dir of --checkpoint")
    p.add_argument("--out", default="/tmp/edgefm_bench_control", help="work dir (bag, logs, record)")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args(argv)
    for k, v in DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, PRESETS.get(a.preset, {}).get(k, v))
    if a.preset and not a.checkpoint:
        p.error(f"--preset {a.preset} needs --checkpoint (the FULL checkpoint) and --vlm")
    if not (a.duration > 0 and a.warmup >= 0):
        p.error(f"--duration must be > 0 and --warmup >= 0, got {a.duration} and {a.warmup}")
    return a


def queue_empty_ticks(status_time, holding, t0: float, t1: float) -> tuple[int, int]:
    """(statuses saying the queue was empty, statuses) among those received within [t0, t1]."""
    t = np.asarray(status_time, dtype=np.float64)
    w = (t >= t0) & (t <= t1)
    return int(np.sum(np.asarray(holding, dtype=bool)[w])), int(np.sum(w))


def frame_to_action(chunk_recv, chunk_stamp, rows: int, dt: float, cmd_stamp,
                    period: float) -> tuple[np.ndarray, int]:
    """Per chunk: the first command stamped at or after its arrival minus its observation stamp (s). A chunk
    whose last row (stamp + (rows - 1) * dt) is past on arrival, or before that command's tick, commands
    nothing (late): counted, not measured. Commands are stamped when published, a little after their tick
    (less than period / 2). Returns (latencies of the chunks that command, late chunks)."""
    c = np.sort(np.asarray(cmd_stamp, dtype=np.float64))
    recv, stamp = np.asarray(chunk_recv, dtype=np.float64), np.asarray(chunk_stamp, dtype=np.float64)
    end = stamp + (rows - 1) * dt  # the chunk's last row
    i = np.searchsorted(c, recv)
    after = i < c.size  # a command followed the chunk
    first = c[np.minimum(i, c.size - 1)] if c.size else np.full(recv.shape, np.nan)
    late = (recv > end) | (after & (first - 0.5 * period > end))
    used = after & ~late
    return (first - stamp)[used], int(np.sum(late))


def play_until_measured(s, bag: str, warmup: float, duration: float, first_chunk_timeout: float = 120.0) -> None:
    """Replay ``bag`` in a loop until ``warmup + duration`` seconds after vla_node reports its first chunk."""
    stop = threading.Event()

    def stopper():
        s.wait_for(lambda: float(s.diagnostics("vla_node").get("chunks") or 0) > 0 or not s.alive("vla_node"),
                   first_chunk_timeout, 0.2)
        stop.wait(warmup + duration + 1.5)  # diagnostics come once a second: a margin past the window
        stop.set()

    threading.Thread(target=stopper, daemon=True).start()
    s.player(bag, loop=True).play(stop)


def _p(x) -> dict[str, float]:
    from edgefm_ros.tools.bag.analyze import percentiles

    return percentiles(x, (50, 90))


def main() -> int:
    a = parse()
    from edgefm_ros.tools.bag.analyze import command_timing, read_run
    from edgefm_ros.tools.bag.make import MakeConfig, camera_topics, make_bag
    from edgefm_ros.tools.graph import OUTPUT_TOPICS, ReplaySession
    from edgefm_ros.tools.bag.synth import JOINTS
    from edgefm_ros.tools.graph import choose_model, model_spec

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = choose_model(a.checkpoint, a.vlm, 2, (120, 160))
    cfg = model_spec(model)
    n_cam, (_, h, w) = len(cfg.camera_keys), cfg.image_shapes[0]  # the bag's frames: the model's raw shape
    bag = out / f"bag-{n_cam}cam-{h}x{w}-{a.transport}"
    if not bag.exists():
        bag_s = float(np.clip(BAG_BYTES / (n_cam * 30.0 * h * w * 3), 2.0, 10.0))
        make_bag(MakeConfig(str(bag), duration_s=bag_s, cameras=n_cam, width=w, height=h, transport=a.transport))
    if a.preset == "realtime" and cfg.chunk_size != 50:
        print(f"WARNING: the checkpoint's chunk_size is {cfg.chunk_size}, not 50", flush=True)
    cams = [camera_topics(i)[0 if a.transport == "raw" else 1] for i in range(n_cam)]
    params = {
        "vla_node": dict(checkpoint=model.checkpoint, vlm_dir=model.vlm_dir, mode=a.mode, threads=a.threads,
                         camera_topics=cams, camera_keys=list(cfg.camera_keys), joint_states_topic="/joint_states",
                         state_joint_names=list(JOINTS[:cfg.state_dim]), instruction_topic="/instruction",
                         action_rate_hz=a.action_rate_hz, max_observation_age_s=0.5, diagnostics_period_s=1.0,
                         autostart=True),
        "action_node": dict(control_rate_hz=a.rate, joint_names=list(JOINTS[:cfg.action_dim]),
                            command_type="joint_state", command_topic="/edgefm/command",
                            chunk_size_threshold=a.chunk_size_threshold, realtime_priority=a.realtime_priority,
                            diagnostics_period_s=1.0, autostart=True),
    }
    domain = 10 + os.getpid() % 90
    print(f"model {model.checkpoint} ({'random weights' if model.random_weights else model.origin}), mode {a.mode}, "
          f"chunk {cfg.chunk_size} rows at {a.action_rate_hz:g} Hz, {n_cam} cameras {h}x{w}; {a.duration:g} s at "
          f"{a.rate:g} Hz after {a.warmup:g} s warm-up, threshold {a.chunk_size_threshold:g}, realtime_priority "
          f"{a.realtime_priority}, vla threads {a.threads}", flush=True)
    with ReplaySession(out / "run", params, ("vla_node", "action_node"), domain,
                       OUTPUT_TOPICS + ("/edgefm/command",)) as s:
        s.wait_active(timeout=120)
        load0 = os.getloadavg()[0]
        play_until_measured(s, str(bag), a.warmup, a.duration)
        t1 = time.time()
        diag_a, diag_v = s.diagnostics("action_node"), s.diagnostics("vla_node")
        load1 = os.getloadavg()[0]
    run = read_run(str(s.record_path), "/edgefm/command")
    if not run.chunk_recv:
        print(f"FAIL: no chunk arrived; logs in {out / 'run'}")
        return 1
    start = run.chunk_recv[0] + a.warmup  # warmed up: the first chunk is merged, the warm-up passed
    end = min(start + a.duration, t1)
    span = end - start
    timing = command_timing(run, 1.0 / a.rate, start, end)
    win = [i for i, t in enumerate(run.chunk_recv) if start <= t <= end]  # chunks arrived while measured
    pick = lambda x: np.asarray(x, dtype=np.float64)[win]  # noqa: E731
    empty, statuses = queue_empty_ticks(run.status_time, run.status_holding, start, end)
    f2a, late = frame_to_action(pick(run.chunk_recv), pick(run.chunk_stamp), cfg.chunk_size, 1.0 / a.action_rate_hz,
                                run.cmd_stamp, 1.0 / a.rate)
    result = {
        "preset": a.preset, "mode": a.mode, "chunk_size": cfg.chunk_size, "action_rate_hz": a.action_rate_hz,
        "chunk_size_threshold": a.chunk_size_threshold, "warmup_s": a.warmup,
        "measured_s": span, "control_rate_hz": timing["rate_hz"], "commands": timing["commands"],
        "period_error_ms": {"p50": timing["err_p50_ms"], "p99": timing["err_p99_ms"], "max": timing["err_max_ms"]},
        "missed_ticks": timing["missed"], "missed_ticks_action_node": diag_a.get("missed_ticks"),
        "action_node_rate_hz": diag_a.get("control_rate_hz"),
        "action_node_jitter_p99_ms": diag_a.get("tick_jitter_p99_ms"),
        "queue_empty_ticks": empty, "queue_status_ticks": statuses,
        "chunks": len(win), "chunks_per_s": len(win) / span if span > 0 else float("nan"), "late_chunks": late,
        "late_chunks_action_node": diag_a.get("late_chunks"),
        "model_compute_ms": _p((pick(run.chunk_prefill) + pick(run.chunk_decode)) * 1e3),
        "observation_to_chunk_ms": _p(pick(run.chunk_inference) * 1e3),
        "frame_to_action_ms": _p(f2a * 1e3),
        "frame_to_action_ms_action_node": {k: diag_a.get(f"frame_to_action_ms_{k}") for k in ("p50", "p99", "max")},
        "loadavg_1min": [load0, load1], "realtime_priority": a.realtime_priority, "vla_threads": a.threads,
        "model": model.checkpoint, "vla_node": diag_v.get("message"),
    }
    result["early_commands"] = timing["early"]  # a catch-up burst after a stall (counted apart from missed)
    checks = {"p99 |period error| <= 2 ms": timing["err_p99_ms"] <= 2.0, "no missed ticks": timing["missed"] == 0,
              "no early commands": timing["early"] == 0, "queue never empty": empty == 0 and statuses > 0,
              "chunks arrived": len(win) > 0, f"measured >= {0.95 * a.duration:g} s": span >= 0.95 * a.duration}
    ok = all(checks.values())
    result["pass"] = bool(ok)
    e, c, o, f = result["period_error_ms"], result["model_compute_ms"], result["observation_to_chunk_ms"], \
        result["frame_to_action_ms"]
    print(f"control rate       {timing['rate_hz']:.3f} Hz over {span:.1f} s ({timing['commands']:.0f} commands)\n"
          f"|period error|     p50 {e['p50']:.3f}  p99 {e['p99']:.3f}  max {e['max']:.3f} ms; missed "
          f"{timing['missed']:.0f}, early {timing['early']:.0f}; the loop itself: {diag_a.get('control_rate_hz')} Hz, "
          f"p99 {diag_a.get('tick_jitter_p99_ms')} ms, missed {diag_a.get('missed_ticks')}\n"
          f"queue empty        {empty} of {statuses} ticks after the warm-up\n"
          f"chunks             {len(win)} ({result['chunks_per_s']:.2f}/s), {late} late (all rows past on arrival; "
          f"action_node counted {diag_a.get('late_chunks')} in the whole run)\n"
          f"inference/chunk    compute p50 {c['p50']:.1f}  p90 {c['p90']:.1f} ms; observation->chunk p50 "
          f"{o['p50']:.1f}  p90 {o['p90']:.1f} ms\n"
          f"frame->action      p50 {f['p50']:.1f}  p90 {f['p90']:.1f}  max {f['max']:.1f} ms (action_node: p50 "
          f"{diag_a.get('frame_to_action_ms_p50')}, p99 {diag_a.get('frame_to_action_ms_p99')} ms)")
    failed = [k for k, v in checks.items() if not v]
    print(f"{'PASS' if ok else 'FAIL: ' + ', '.join(failed)}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2, default=float))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

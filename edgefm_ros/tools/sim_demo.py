"""edgefm-demo sim (the README's main command): the simulated arm doing the tasks from their instructions, in a
closed loop through the node graph (sim_node, vla_node, action_node as processes over DDS) with the
committed trained checkpoint. Prints the report (success, time to success, smoothness, control rate,
latency, underruns) and writes a video of the episodes (the instruction, the end-effector's route drawn
on the scene camera, the chunk boundaries on a timeline, the chunk's source) and a plot.

    edgefm-demo sim [--checkpoint DIR] [--tasks T1,T2] [--seeds A-B] [--out DIR] [--delay-ms N]
    edgefm-demo bag [BAG] ...   the bag replay (edgefm_ros/tools/demo.py, which holds both subcommands)
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import cv2
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from edgefm_ros.sim.env import SCENE_CAMERA
from edgefm_ros.sim.report import format_table, write_report
from edgefm_ros.sim.rollout import checkpoint_tasks
from edgefm_ros.sim.tasks import EVAL_SEEDS, parse_seeds, parse_tasks
from edgefm_ros.tools.sim_ros import Frames, default_checkpoint, episode_windows, joint_states, run_ros

SCALE = 4  # video pixels per camera pixel
BAND = 44  # text band height (px)
FOVY_DEG = 45.0  # MuJoCo's default free-camera field of view (Meta-World keeps it)


def project_scene(points: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """World xyz (n, 3) -> pixel (n, 2) (u right, v down) in the simulator's "scene" camera of size hw."""
    cam = SCENE_CAMERA  # MuJoCo free camera: lookat, distance, azimuth, elevation
    az, el = math.radians(cam.azimuth), math.radians(cam.elevation)
    fwd = np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])
    up = np.array([-math.sin(el) * math.cos(az), -math.sin(el) * math.sin(az), math.cos(el)])
    right = np.cross(fwd, up)
    eye = np.asarray(cam.lookat) - cam.distance * fwd
    d = np.asarray(points, dtype=np.float64).reshape(-1, 3) - eye
    z = np.maximum(d @ fwd, 1e-6)
    f = (hw[0] / 2) / math.tan(math.radians(FOVY_DEG) / 2)
    return np.stack([hw[1] / 2 + f * (d @ right) / z, hw[0] / 2 - f * (d @ up) / z], axis=1)


def _text(img, s: str, xy, scale=0.45, color=(255, 255, 255), thick=1) -> None:
    cv2.putText(img, s, xy, cv2.FONT_HERSHEY_SIMPLEX, scale, color, thick, cv2.LINE_AA)


def compose_frames(rr, js_t: np.ndarray, js_p: np.ndarray):
    """Yield the video's RGB frames (H, W, 3) from a RosRun that kept frames."""
    fr, run = rr.frames, rr.run
    starts = [e for e in rr.events if e["event"] == "start"]
    ends = {w.start: w for w in episode_windows(rr.events)}
    recv = np.asarray(run.chunk_recv)
    src = list(run.chunk_source)
    inf = np.asarray(run.chunk_inference) * 1e3
    for t, scene, wrist in zip(fr.times, fr.scene, fr.wrist):
        ep = next((e for e in reversed(starts) if e["t"] <= t), None)
        if ep is None or wrist is None:
            continue
        h, w = scene.shape[:2]
        big = cv2.resize(scene, (w * SCALE, h * SCALE), interpolation=cv2.INTER_NEAREST)
        wr = cv2.resize(wrist, (w * SCALE, h * SCALE), interpolation=cv2.INTER_NEAREST)
        t0 = ep["t"]
        win = ends.get(t0)
        t_end = win.end if win is not None else t
        # the route: the end effector's path this episode, projected on the scene camera
        sel = (js_t >= t0) & (js_t <= min(t, t_end))
        if sel.sum() >= 2:
            px = (project_scene(js_p[sel, :3], (h, w)) * SCALE).astype(np.int32)
            cv2.polylines(big, [px.reshape(-1, 1, 2)], False, (255, 220, 0), 2, cv2.LINE_AA)
            cv2.circle(big, tuple(int(v) for v in px[-1]), 5, (255, 220, 0), -1)
        frame = np.zeros((BAND + h * SCALE + BAND, 2 * w * SCALE, 3), dtype=np.uint8)
        frame[BAND:BAND + h * SCALE, :w * SCALE] = big
        frame[BAND:BAND + h * SCALE, w * SCALE:] = wr
        _text(frame, f'"{ep["instruction"]}"', (8, 18), 0.55, (255, 255, 255), 1)
        _text(frame, f"{ep['task']}  seed {ep['seed']}  t = {min(t, t_end) - t0:4.1f} s", (8, 37), 0.42,
              (200, 200, 200))
        _text(frame, "scene camera (route in yellow)", (8, BAND + 16), 0.4)
        _text(frame, "wrist camera", (w * SCALE + 8, BAND + 16), 0.4)
        # timeline: chunk boundaries (arrivals) this episode, the cursor, the chunk's source and latency
        y0 = BAND + h * SCALE
        span = max((win.end - t0) if win is not None else 8.0, 1e-3)
        x = lambda tt: int(8 + (frame.shape[1] - 16) * min(max((tt - t0) / span, 0.0), 1.0))  # noqa: E731
        cv2.line(frame, (8, y0 + 12), (frame.shape[1] - 8, y0 + 12), (90, 90, 90), 1)
        mine = np.flatnonzero((recv >= t0) & (recv <= t_end))
        for i in mine[recv[mine] <= t]:
            cv2.line(frame, (x(recv[i]), y0 + 5), (x(recv[i]), y0 + 19), (0, 200, 255), 1)
        cv2.line(frame, (x(min(t, t_end)), y0 + 2), (x(min(t, t_end)), y0 + 22), (255, 255, 255), 2)
        last = [i for i in mine if recv[i] <= t]
        if last:
            i = last[-1]
            _text(frame, f"chunks {len(last)} (blue ticks), last from {src[i]} in {inf[i]:.0f} ms", (8, y0 + 37),
                  0.42, (0, 200, 255))
        if win is not None and t >= win.end:
            ok = win.outcome == "success"
            msg = f"SUCCESS in {win.time_to_success_s:.2f} s" if ok else win.outcome.upper()
            _text(frame, msg, (frame.shape[1] // 2 - 40, BAND + 40), 0.8, (0, 255, 0) if ok else (255, 60, 60), 2)
        yield frame


def write_video(frames, path: Path, fps: float) -> Path:
    """MP4 (H.264 through imageio-ffmpeg's bundled ffmpeg) when available, else an animated GIF."""
    frames = list(frames)
    if not frames:
        raise ValueError("no video frames were recorded")
    try:  # imageio-ffmpeg is optional: without it the video is a GIF
        import imageio_ffmpeg

        out = path.with_suffix(".mp4")
        h, w = frames[0].shape[:2]
        writer = imageio_ffmpeg.write_frames(str(out), (w, h), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                             macro_block_size=2, quality=7)
        writer.send(None)
        for f in frames:
            writer.send(np.ascontiguousarray(f))
        writer.close()
        return out
    except ImportError:
        from PIL import Image

        out = path.with_suffix(".gif")
        imgs = [Image.fromarray(f) for f in frames[::2]]
        imgs[0].save(out, save_all=True, append_images=imgs[1:], duration=int(2000 / fps), loop=0)
        return out


def plot(rr, js_t: np.ndarray, js_p: np.ndarray, path: Path) -> None:
    matplotlib.use("Agg")  # to a file, no display

    run = rr.run
    wins = episode_windows(rr.events)
    t0 = wins[0].start if wins else (js_t[0] if len(js_t) else 0.0)
    fig, ax = plt.subplots(3, 1, figsize=(12, 9), sharex=True, gridspec_kw={"height_ratios": [3, 1.3, 1]})
    ct, cp = np.asarray(run.cmd_stamp) - t0, run.positions
    for j, (name, col) in enumerate(zip(("x", "y", "z"), ("C0", "C1", "C2"))):
        if len(ct):
            ax[0].plot(ct, cp[:, j], color=col, lw=1.2, label=f"commanded {name}")
        if len(js_t):
            ax[0].plot(js_t - t0, js_p[:, j], color=col, lw=0.8, ls="--", label=f"measured {name}")
    for w in wins:
        ax[0].axvspan(w.start - t0, w.end - t0, color="green" if w.outcome == "success" else "red", alpha=0.08)
        ax[0].text(w.start - t0, ax[0].get_ylim()[1], f" {w.task}:{w.seed}\n {w.outcome}", va="top", fontsize=7)
    ax[0].set_ylabel("end effector [m]")
    ax[0].legend(loc="lower right", fontsize=7, ncol=3)
    ax[0].set_title(f"edgefm closed loop through the ROS graph: {Path(rr.report['checkpoint']).name}, "
                    f"success {rr.report['successes']}/{rr.report['episodes']}")
    tr = np.asarray(run.chunk_recv) - t0
    ax[1].plot(tr, np.asarray(run.chunk_inference) * 1e3, ".", ms=3, label="observation -> chunk")
    for t in tr:
        ax[0].axvline(t, color="k", alpha=0.06, lw=0.5)
    ax[1].set_ylabel("latency [ms]")
    ax[1].legend(loc="upper right", fontsize=8)
    ax[2].step(np.asarray(run.status_time) - t0, run.status_depth, where="post", lw=0.8)
    ax[2].set_ylabel("queue [ticks]")
    ax[2].set_xlabel("time [s] (chunk arrivals: grey lines)")
    ax[2].set_xlim(left=-0.5)
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_args(p: argparse.ArgumentParser) -> None:
    """``edgefm-demo sim``'s arguments."""
    p.add_argument("--checkpoint", help="SmolVLA checkpoint (default: checkpoints/smolvla-metaworld)")
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: the checkpoint's)")
    p.add_argument("--seeds", default=None, help="evaluation seeds, 'A-B' or 'A,B' (default: the first one)")
    p.add_argument("--out", default="edgefm_demo_output", help="output dir (video, plot, report, logs)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="extra latency added to every chunk")
    p.add_argument("--aggregate", default=None, help="action_node's aggregate (default: config/sim.yaml's)")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: derived from the pid)")
    p.add_argument("--no-video", action="store_true", help="skip the video")


def run_demo(args) -> dict:
    """``edgefm-demo sim``: the report (also written to <out>/report.json)."""
    ckpt = Path(args.checkpoint or default_checkpoint())
    if not (ckpt / "config.json").is_file():
        raise ValueError(f"checkpoint {ckpt} holds no config.json (train one: see README, `edgefm-vla train`)")
    tasks = parse_tasks(args.tasks) if args.tasks else checkpoint_tasks(ckpt)
    seeds = parse_seeds(args.seeds) if args.seeds else [EVAL_SEEDS[0]]
    episodes = [f"{t}:{s}" for s in seeds for t in tasks]
    out = Path(args.out).resolve()
    print(f"closed loop: {len(episodes)} episodes ({', '.join(tasks)}; seeds {seeds[0]}..{seeds[-1]}) with {ckpt}")
    frames = None if args.no_video else Frames(stride=2)
    rr = run_ros(str(ckpt), episodes, out_dir=out, delay_ms=args.delay_ms, aggregate=args.aggregate,
                 domain_id=args.domain_id, frames=frames)
    js_t, js_p = joint_states(rr.workdir / "run" / "record")
    write_report(rr.report, out / "report.json")
    plot(rr, js_t, js_p, out / "demo.png")
    print()
    print(format_table(rr.report))
    if frames is not None:
        video = write_video(compose_frames(rr, js_t, js_p), out / "demo", fps=15.0)
        rr.report["video"] = str(video)
        print(f"video    : {video}")
    print(f"plot     : {out / 'demo.png'}\nreport   : {out / 'report.json'}\nlogs     : {out / 'run'}")
    return rr.report

"""Converter speed: a 10-minute recording with two 30 Hz cameras -> a LeRobot v3.0 dataset, against the
60-second target.

    python benchmarks/bench_bag_convert.py                          # 480x640 JPEG cameras, 30 fps dataset
    python benchmarks/bench_bag_convert.py --height 64 --width 64 --transport raw   # the simulator's cameras

The bag is what `edgefm-bag record` keeps of a robot running this package: two cameras at 30 Hz
(CompressedImage JPEG as image_transport publishes them, or raw rgb8 Image), joint states at 100 Hz,
JointTrajectory commands at 20 Hz, the instruction and episode events (20 episodes of 30 s). The bag is made
first (not timed), then `convert_bags` runs (timed: both passes, video encoding, metadata). Prints the time,
the ratio to the target and the frames per second; --json writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgefm_ros.datasets.convert import ConvertConfig, convert_bags  # noqa: E402
from edgefm_ros.datasets.mapping import CameraSource, DatasetMapping  # noqa: E402
from edgefm_ros.datasets.progress import ProgressPrinter  # noqa: E402
from edgefm_ros.datasets.synthbag import SynthConfig, camera_topic, write_synthetic_bag  # noqa: E402
from edgefm_ros.datasets.video import VideoConfig  # noqa: E402

TARGET_S = 60.0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_s() -> float:
    """CPU seconds this process (all its threads) has used: with the wall time under load, what an idle
    machine would need at least (cpu_s / cores)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--transport", choices=("compressed", "raw"), default="compressed")
    p.add_argument("--fps", type=int, default=30, help="dataset frame rate (default 30: every camera frame)")
    p.add_argument("--vcodec", default="libsvtav1")
    p.add_argument("--preset", default="", help="encoder preset (default: LeRobot's)")
    p.add_argument("--gop", type=int, default=2, help="keyframe interval (default 2, LeRobot's)")
    p.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    p.add_argument("--workdir", default=None, help="where the bag and dataset go (default: a temporary dir)")
    p.add_argument("--keep", action="store_true", help="keep the bag and the dataset")
    p.add_argument("--reuse-bag", action="store_true", help="convert the bag already in --workdir (made before)")
    p.add_argument("--json", default=None, help="also write the result here")
    a = p.parse_args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench_bag_convert_"))
    work.mkdir(parents=True, exist_ok=True)
    bag, out = work / "rec", work / "dataset"
    for x in (out,) if a.reuse_bag else (bag, out):
        if x.exists():
            shutil.rmtree(x)
    n_ep = max(1, int(round(a.minutes * 2)))
    episodes = tuple((("reach", "push", "drawer-open")[i % 3], a.minutes * 60 / n_ep - 0.5) for i in range(n_ep))
    t0 = time.perf_counter()
    if not (a.reuse_bag and bag.exists()):
        write_synthetic_bag(SynthConfig(str(bag), episodes=episodes, storage=a.storage, height=a.height,
                                        width=a.width, transport=a.transport, settle_s=0.5))
    make_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in bag.iterdir())
    print(f"bag: {a.minutes:g} min, {n_ep} episodes, 2 cameras {a.width}x{a.height} {a.transport} at 30 Hz, "
          f"{size / 2**20:.0f} MiB ({a.storage}); made in {make_s:.0f}s", flush=True)
    mapping = DatasetMapping(cameras=tuple(CameraSource(c, camera_topic(c, a.transport)) for c in ("scene", "wrist")))
    cfg = ConvertConfig(fps=a.fps, video=VideoConfig(vcodec=a.vcodec, preset=a.preset, gop=a.gop))
    t0, c0 = time.perf_counter(), _cpu_s()
    report = convert_bags([bag], out, mapping, cfg, ProgressPrinter(sys.stderr, every_s=10.0))
    conv_s, cpu_s = time.perf_counter() - t0, _cpu_s() - c0
    frames = report.frames * 2
    result = {"seconds": round(conv_s, 2), "cpu_seconds": round(cpu_s, 1),
              "idle_estimate_s": round(cpu_s / (os.cpu_count() or 1), 1), "target_s": TARGET_S, "ratio_to_target": round(conv_s / TARGET_S, 3),
              "camera_frames": frames, "frames_per_s": round(frames / conv_s, 1), "episodes": report.episodes,
              "dataset_fps": a.fps, "minutes": a.minutes, "image": f"{a.width}x{a.height}", "transport": a.transport,
              "vcodec": a.vcodec, "preset": a.preset or "default", "gop": a.gop, "storage": a.storage, "bag_mib": round(size / 2**20, 1),
              "dataset_mib": round(sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20, 1),
              "cpu": _cpu(), "cores": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
              "date": time.strftime("%Y-%m-%d")}
    print(f"convert: {conv_s:.1f}s for {frames} camera frames ({result['frames_per_s']:.0f}/s), "
          f"{conv_s / TARGET_S:.2f}x the {TARGET_S:.0f}s target; dataset {result['dataset_mib']} MiB; "
          f"{result['cpu']}, {result['cores']} cores, load {result['load_1min']}; CPU time {cpu_s:.1f}s "
          f"(at least {result['idle_estimate_s']}s on {result['cores']} idle cores)")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""edgefm-bag: make synthetic sensor bags, replay bags into live topics, record topics, summarise a run.

    edgefm-bag make OUT [--duration 10 --cameras 2 --width 160 --height 120 --storage sqlite3|mcap]
    edgefm-bag play BAG [--rate 1.0 --loop --remap /a:=/b ... --topics ... --no-restamp]
    edgefm-bag record OUT [--topics ... | all topics] [--duration S]
    edgefm-bag info BAG
    edgefm-bag to-dataset BAG... --out DIR [--map FILE.yaml] [--fps N] [--images] (docs/recordings.md)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time

from rosbags.rosbag2 import Reader

from edgefm_ros.datasets.convert import ConvertConfig, convert_bags
from edgefm_ros.datasets.mapping import DatasetMapping, load_mapping, parse_camera_arg
from edgefm_ros.datasets.progress import ProgressPrinter
from edgefm_ros.datasets.video import VideoConfig
from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.tools.bag.make import MakeConfig, make_bag
from edgefm_ros.tools.bag.play import Player, PlayConfig, parse_remap


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefm-bag", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write a bag of synthetic camera, joint-state and instruction streams")
    m.add_argument("out")
    m.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    m.add_argument("--cameras", type=int, default=2)
    m.add_argument("--width", type=int, default=160)
    m.add_argument("--height", type=int, default=120)
    m.add_argument("--camera-hz", type=float, default=30.0)
    m.add_argument("--joint-hz", type=float, default=100.0)
    m.add_argument("--transport", choices=("raw", "compressed", "both"), default="both")
    m.add_argument("--jpeg-quality", type=int, default=85)
    m.add_argument("--tasks", type=int, default=2, help="distinct instructions over the recording")
    m.add_argument("--storage", choices=("sqlite3", "mcap"), default="sqlite3")
    m.add_argument("--seed", type=int, default=0)
    pl = sub.add_parser("play", help="replay a bag into live topics on its timeline")
    pl.add_argument("bag")
    pl.add_argument("--rate", type=float, default=1.0, help="time factor (2.0: twice as fast)")
    pl.add_argument("--loop", action="store_true")
    pl.add_argument("--remap", nargs="*", default=[], metavar="FROM:=TO")
    pl.add_argument("--topics", nargs="*", default=[], help="bag topics to play (default all)")
    pl.add_argument("--no-restamp", action="store_true", help="keep the bag's header stamps")
    pl.add_argument("--start-offset", type=float, default=0.0, help="skip the bag's first seconds")
    pl.add_argument("--delay", type=float, default=0.5, help="seconds to let subscribers connect first")
    r = sub.add_parser("record", help="record topics to a bag until Ctrl-C (or --duration)")
    r.add_argument("out")
    r.add_argument("--topics", nargs="*", default=[], help="topics (default: all that appear)")
    r.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: never)")
    r.add_argument("--storage", choices=("sqlite3", "mcap"), default="sqlite3")
    i = sub.add_parser("info", help="topics and message counts of a bag")
    i.add_argument("bag")
    _to_dataset_parser(sub)
    return p


def _to_dataset_parser(sub) -> None:
    d = sub.add_parser("to-dataset", help="convert recorded bags into a LeRobot v3.0 dataset (docs/recordings.md)")
    d.add_argument("bags", nargs="+", metavar="BAG")
    d.add_argument("--out", required=True, help="dataset directory to create (must not exist)")
    d.add_argument("--map", default=None, metavar="FILE.yaml", help="topic mapping (default: this package's topics)")
    d.add_argument("--fps", type=int, default=None, help="dataset frame rate (default: the mapping's, else 20)")
    d.add_argument("--images", action="store_true", help="cameras as PNG images in the parquet instead of MP4 video")
    d.add_argument("--state-topic", default=None)
    d.add_argument("--state-joints", default=None, help="comma-separated joint names, in order")
    d.add_argument("--action-topic", default=None)
    d.add_argument("--action-joints", default=None, help="comma-separated joint names, in order")
    d.add_argument("--camera", action="append", default=None, metavar="KEY=TOPIC",
                   help="a camera (repeat for each; replaces the mapping's cameras)")
    d.add_argument("--instruction-topic", default=None, help='std_msgs/String instruction ("" for none)')
    d.add_argument("--events-topic", default=None, help='std_msgs/String JSON episode events ("" for none)')
    d.add_argument("--task", default=None, help="task text where the bag has no instruction")
    d.add_argument("--clock", choices=("header", "bag"), default=None, help="message time (default: header)")
    d.add_argument("--max-age", type=float, default=None, help="seconds a stream's sample may be old at a tick")
    d.add_argument("--gap", type=float, default=None, help="a pause this long (s) ends an episode without events")
    d.add_argument("--chunk-size", type=int, default=16, help="an episode must keep this many frames (default 16)")
    d.add_argument("--skip-short", action="store_true", help="leave out shorter episodes instead of failing")
    d.add_argument("--vcodec", default="libsvtav1", help="libsvtav1 (LeRobot's default) | h264 | hevc")
    d.add_argument("--crf", type=int, default=30)
    d.add_argument("--gop", type=int, default=2, help="a keyframe every N frames (default 2, LeRobot's: "
                   "quick random access)")
    d.add_argument("--preset", default="", help="encoder speed: libsvtav1 0..13 (default 12), "
                   "h264/hevc ultrafast..veryslow (default medium)")


def _ros_args() -> list[str]:
    """Only what follows --ros-args reaches rcl (our own FROM:=TO remappings are not ROS remap rules)."""
    argv = sys.argv
    return argv[:1] + (argv[argv.index("--ros-args"):] if "--ros-args" in argv else [])


def _make(a) -> int:
    cfg = MakeConfig(a.out, a.duration, a.cameras, a.width, a.height, a.camera_hz, a.joint_hz, a.transport,
                     a.jpeg_quality, a.storage, a.tasks, seed=a.seed)
    counts = make_bag(cfg)
    print(f"wrote {a.out} ({a.storage}, {a.duration:g}s):")
    for topic, n in sorted(counts.items()):
        print(f"  {topic}: {n}")
    return 0


def _play(a) -> int:
    # ROS only for play and record: make, info and to-dataset run without it
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from edgefm_ros.ros.spin import ShutdownRequest, finish

    cfg = PlayConfig(a.bag, a.rate, a.loop, parse_remap(a.remap), tuple(a.topics), not a.no_restamp,
                     a.start_offset)
    request = ShutdownRequest(rclpy.logging.get_logger("edgefm_bag_player"))  # Ctrl-C / SIGTERM: stop
    rclpy.init(args=_ros_args(), signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("edgefm_bag_player")
    try:
        player = Player(node, cfg)
        print(f"playing {a.bag}: {player.duration_s:.1f}s at x{a.rate:g}{' (loop)' if a.loop else ''}")
        if not request.event.wait(a.delay):
            player.play(request.event)
        print(f"published {player.published} messages")
    finally:
        logger = node.get_logger()
        node.destroy_node()
        finish(request, logger)
    return 0


def _record(a) -> int:
    # ROS only for play and record (as in _play)
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from edgefm_ros.ros.spin import ShutdownRequest, finish
    from edgefm_ros.tools.bag.record import Recorder, RecordConfig

    request = ShutdownRequest(rclpy.logging.get_logger("edgefm_bag_recorder"))  # Ctrl-C / SIGTERM: stop
    rclpy.init(args=_ros_args(), signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("edgefm_bag_recorder")
    rec = Recorder(node, RecordConfig(a.out, tuple(a.topics), a.storage))
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    print(f"recording to {a.out} ({'all topics' if not a.topics else ', '.join(a.topics)})", flush=True)
    end = node.get_clock().now().nanoseconds + int(a.duration * 1e9) if a.duration > 0 else None
    try:
        while rclpy.ok() and not request.requested() and (end is None or node.get_clock().now().nanoseconds < end):
            ex.spin_once(timeout_sec=0.1)
    except ExternalShutdownException:
        pass
    finally:
        rec.close()  # the bag's metadata: written even when stopped by a signal
        logger = node.get_logger()
        node.destroy_node()
        finish(request, logger)
    for topic, n in sorted(rec.counts.items()):
        print(f"  {topic}: {n}")
    return 0


def _info(a) -> int:
    with Reader(a.bag) as r:
        print(f"{a.bag}: {r.duration * 1e-9:.2f}s, {r.message_count} messages")
        for c in r.connections:
            print(f"  {c.topic} [{c.msgtype}] {c.msgcount}")
    return 0


def _to_dataset(a) -> int:
    m = load_mapping(a.map) if a.map else DatasetMapping()
    joints = lambda s: tuple(j.strip() for j in s.split(",") if j.strip())  # noqa: E731
    for name in ("state", "action"):
        src = getattr(m, name)
        topic, names = getattr(a, f"{name}_topic"), getattr(a, f"{name}_joints")
        if topic is not None or names is not None:
            src = dataclasses.replace(src, topic=topic or src.topic,
                                      joints=joints(names) if names is not None else (() if topic else src.joints))
            m = dataclasses.replace(m, **{name: src})
    kw = {k: v for k, v in (("instruction", a.instruction_topic), ("events", a.events_topic), ("task", a.task),
                            ("clock", a.clock), ("max_age_s", a.max_age), ("gap_s", a.gap)) if v is not None}
    if a.camera:
        kw["cameras"] = tuple(parse_camera_arg(c) for c in a.camera)
    m = dataclasses.replace(m, **kw)
    cfg = ConvertConfig(fps=a.fps or m.fps or 20, chunk_size=a.chunk_size, images=a.images,
                        video=VideoConfig(vcodec=a.vcodec, crf=a.crf, preset=a.preset, gop=a.gop), skip_short=a.skip_short)
    # SIGTERM ends the conversion like Ctrl-C: the partial output is removed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.perf_counter()
    report = convert_bags(a.bags, a.out, m, cfg, ProgressPrinter(sys.stderr))
    for line in report.lines():
        print(line)
    print(f"wrote {a.out} in {time.perf_counter() - t0:.1f}s (report: {a.out}/meta/conversion_report.json)")
    return 0


@cli_main("edgefm-bag", subcommands=True)
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--ros-args" in argv:
        argv = argv[:argv.index("--ros-args")]
    a = _parser().parse_args(argv)
    try:
        return {"make": _make, "play": _play, "record": _record, "info": _info,
                "to-dataset": _to_dataset}[a.cmd](a)
    except BrokenPipeError:
        # the reader of stdout went away (the launcher was killed) after the work was done: the summary
        # is lost, the bag is not; stdout goes nowhere so that the exit does not fail on it again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""edgefm-bag: make synthetic sensor bags, replay bags into live topics, record topics, summarise a run.

    edgefm-bag make OUT [--duration 10 --cameras 2 --width 160 --height 120 --storage sqlite3|mcap]
    edgefm-bag play BAG [--rate 1.0 --loop --remap /a:=/b ... --topics ... --no-restamp]
    edgefm-bag record OUT [--topics ... | all topics] [--duration S]
    edgefm-bag info BAG
"""
from __future__ import annotations

import argparse
import os
import sys


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
    return p


def _ros_args() -> list[str]:
    """Only what follows --ros-args reaches rcl (our own FROM:=TO remappings are not ROS remap rules)."""
    argv = sys.argv
    return argv[:1] + (argv[argv.index("--ros-args"):] if "--ros-args" in argv else [])


def _make(a) -> int:
    from edgefm_ros.tools.bag.make import MakeConfig, make_bag

    cfg = MakeConfig(a.out, a.duration, a.cameras, a.width, a.height, a.camera_hz, a.joint_hz, a.transport,
                     a.jpeg_quality, a.storage, a.tasks, seed=a.seed)
    counts = make_bag(cfg)
    print(f"wrote {a.out} ({a.storage}, {a.duration:g}s):")
    for topic, n in sorted(counts.items()):
        print(f"  {topic}: {n}")
    return 0


def _play(a) -> int:
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from edgefm_ros.ros.spin import ShutdownRequest
    from edgefm_ros.tools.bag.play import Player, PlayConfig, parse_remap

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
        node.destroy_node()
        rclpy.try_shutdown()
        request.ignore_further()
    return 0


def _record(a) -> int:
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from edgefm_ros.ros.spin import ShutdownRequest
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
        node.destroy_node()
        rclpy.try_shutdown()
        request.ignore_further()
    for topic, n in sorted(rec.counts.items()):
        print(f"  {topic}: {n}")
    return 0


def _info(a) -> int:
    from rosbags.rosbag2 import Reader

    with Reader(a.bag) as r:
        print(f"{a.bag}: {r.duration * 1e-9:.2f}s, {r.message_count} messages")
        for c in r.connections:
            print(f"  {c.topic} [{c.msgtype}] {c.msgcount}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--ros-args" in argv:
        argv = argv[:argv.index("--ros-args")]
    a = _parser().parse_args(argv)
    try:
        return {"make": _make, "play": _play, "record": _record, "info": _info}[a.cmd](a)
    except BrokenPipeError:
        # the reader of stdout went away (the launcher was killed) after the work was done: the summary
        # is lost, the bag is not; stdout goes nowhere so that the exit does not fail on it again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, FileNotFoundError) as e:
        print(f"edgefm-bag {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

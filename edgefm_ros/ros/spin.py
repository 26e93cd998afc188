"""Running one node as a process (init, build, spin, stop cleanly, exit status), and the spin loop of an
executor that serves a process's other work from a thread."""
from __future__ import annotations

import threading
from typing import Callable

import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor


def run_node(make: Callable[[], object], name: str, args=None, stop: Callable[[object], None] | None = None) -> int:
    """Build the node with ``make()`` and spin it until shutdown.

    Invalid parameters (ValueError / ParameterException raised while building) are logged as fatal
    with the reason and give exit status 2; Ctrl-C and external shutdown exit 0. ``stop(node)`` runs
    before the node is destroyed (worker threads, control loops).
    """
    rclpy.init(args=args)
    try:
        node = make()
    except (ValueError, ParameterException) as e:
        rclpy.logging.get_logger(name).fatal(f"invalid parameters: {e}")
        rclpy.try_shutdown()
        return 2
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if stop is not None:
            stop(node)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


def spin_until_shutdown(executor, context, stop: threading.Event | None = None, period_s: float = 0.05) -> None:
    """``executor.spin_once`` until ``context`` shuts down (or ``stop`` is set); an error raised because the
    context went down mid-spin ends the loop, any other is raised."""
    while context.ok() and not (stop is not None and stop.is_set()):
        try:
            executor.spin_once(timeout_sec=period_s)
        except ExternalShutdownException:
            break
        except Exception:
            if not context.ok():
                break
            raise

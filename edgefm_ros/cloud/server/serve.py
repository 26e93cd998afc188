"""Runs the cloud tier: MLServer with the edgefm runtime, then nginx in front; stops both together.

Readiness: MLServer reports ready only after the engine loaded and warmed up; nginx starts after that,
so the public /v2/health/ready answering 200 means a chunk can be served now.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from edgefm_ros.cloud.server.settings import ServeConfig, free_port, write_run_dir

log = logging.getLogger("edgefm_ros.cloud.server.serve")
PR_SET_PDEATHSIG = 1
MLSERVER_MAIN = "import sys; from mlserver.cli.main import main; sys.argv[0] = 'mlserver'; main()"


def _die_with_parent() -> None:
    """Child-side: get SIGTERM when the supervisor dies, so no orphan keeps the port (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _child_env() -> dict:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[3])  # so MLServer imports this edgefm_ros
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _system_env() -> dict:
    """For nginx (a system binary): without the library path a Python environment may have set."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")}


def url_ok(url: str, timeout: float = 1.0) -> bool:
    ctx = ssl._create_unverified_context() if url.startswith("https") else None  # self-check of our own port
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(url: str, procs: list[subprocess.Popen], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with code {p.returncode} before {url} was ready")
        if url_ok(url):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


def stop(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    for p in reversed(procs):  # nginx first, then MLServer
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in reversed(procs):
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def nginx_path(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not found:
        raise FileNotFoundError(f"nginx executable {name!r} not found: install Debian's nginx-light "
                                "(apt-get install -y nginx-light) or pass --nginx PATH")
    return found


def start(cfg: ServeConfig, run_dir: Path, log=None) -> list[subprocess.Popen]:
    """Starts MLServer (and nginx) and returns once the public endpoint is ready; ``log``: a file both
    write their output to (default: this process's stdout/stderr)."""
    out = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
    rest_port = free_port() if cfg.proxy else cfg.port
    grpc_port = free_port()
    conf = write_run_dir(cfg, run_dir, rest_port, grpc_port)
    nginx = nginx_path(cfg.nginx) if cfg.proxy else None  # fail before loading the model
    mlserver = subprocess.Popen([sys.executable, "-c", MLSERVER_MAIN, "start", str(run_dir)],
                                env=_child_env(), preexec_fn=_die_with_parent, **out)
    procs = [mlserver]
    try:
        wait_ready(f"http://127.0.0.1:{rest_port}/v2/health/ready" if cfg.proxy else
                   f"http://{_connect_host(cfg.host)}:{rest_port}/v2/health/ready", procs, cfg.ready_timeout_s)
        if nginx:
            args = [nginx, "-c", str(conf), "-p", str(run_dir), "-e", "stderr"]
            subprocess.run(args + ["-t", "-q"], check=True, env=_system_env(), **out)
            procs.append(subprocess.Popen(args, env=_system_env(), preexec_fn=_die_with_parent, **out))
            wait_ready(f"{cfg.scheme}://{_connect_host(cfg.host)}:{cfg.port}/v2/health/ready", procs, 30.0)
    except BaseException:
        stop(procs)
        raise
    return procs


def _connect_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def running(cfg: ServeConfig, log=None) -> Iterator[str]:
    """The cloud tier for the duration of a ``with`` block (e.g. the demo); yields its base URL.
    ``log``: a file the servers write their output to (default: inherited stdout/stderr)."""
    with tempfile.TemporaryDirectory(prefix="edgefm-cloud-") as tmp:
        procs = start(cfg, Path(tmp), log)
        try:
            yield f"{cfg.scheme}://{_connect_host(cfg.host)}:{cfg.port}"
        finally:
            stop(procs)


def serve(cfg: ServeConfig) -> int:
    """Runs until SIGTERM/SIGINT or until a child exits; returns the exit code."""
    stopping: list[int] = []
    ready = []

    def on_signal(signum, _frame):
        if not ready:  # still starting: unwind through start()'s cleanup
            raise SystemExit(128 + signum)
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with tempfile.TemporaryDirectory(prefix="edgefm-cloud-") as tmp:
        procs = start(cfg, Path(tmp))
        ready.append(True)
        log.info("edgefm-cloud ready: %s://%s:%d/v2/models/%s (mode %s, auth %s, gRPC %s)", cfg.scheme, cfg.host,
                 cfg.port, cfg.model_name, cfg.mode, "bearer token" if cfg.token else "none",
                 cfg.grpc_port or "loopback only")
        try:
            while not stopping and all(p.poll() is None for p in procs):
                time.sleep(0.2)
        finally:
            dead = [p for p in procs if p.poll() is not None]
            stop(procs)
        if dead and not stopping:
            log.error("%s exited with code %s; stopped the others", dead[0].args[0], dead[0].returncode)
            return 1
    return 0

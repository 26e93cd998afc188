"""Helpers for the cloud tests: the real `edgefm-cloud serve` (MLServer + nginx) as a subprocess in its
own process group on a free port, fresh random observations and noise."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.types import Observation

REPO = Path(__file__).resolve().parents[2]
TOKEN = os.urandom(32).hex()  # 64 hex digits, as `openssl rand -hex 32` gives (the README's recipe)


def need_server_deps() -> None:
    pytest.importorskip("mlserver", reason="MLServer (pip mlserver==1.7.1) is not installed")
    if not (shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")):
        pytest.skip("nginx not installed (apt-get install -y nginx-light)")


def free_port() -> int:
    from edgefm_ros.cloud.server.settings import free_port as fp

    return fp()


class ServerProcess:
    """`python -m edgefm_ros.cloud.cli serve ...` in its own process group (killed as a whole)."""

    def __init__(self, args: list[str], log_path: Path, prefix: list[str] = ()):
        self.args, self.log_path, self.prefix = args, log_path, list(prefix)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.prefix + [sys.executable, "-m", "edgefm_ros.cloud.cli", "serve"] + self.args,
                                     stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        return self

    def wait_ready(self, url: str, timeout_s: float = 60.0) -> None:
        import ssl

        ctx = ssl._create_unverified_context()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(url + "/v2/health/ready", timeout=1.0, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server at {url} not ready after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL the whole group: supervisor, MLServer and nginx die at once (a crashed host)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._reap_group()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._reap_group()

    def _reap_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of the group, if any
        except (ProcessLookupError, PermissionError):
            pass


def random_observation(spec, rng: np.random.Generator, size: tuple[int, int] | None = None,
                       cameras: tuple[str, ...] | None = None) -> Observation:
    images = {}
    for key in cameras or spec.camera_keys:
        h, w = size or spec.image_shapes[key][1:]
        images[key] = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    return Observation(images=images, state=rng.standard_normal(spec.state_dim).astype(np.float32),
                       task=rng.choice(["pick up the red cube", "open the drawer", "stack the blocks"]),
                       stamp=float(rng.uniform(0, 1000)))


def random_noise(spec, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)

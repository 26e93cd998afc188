"""The cloud tier on loopback: protocol overhead (raw vs JPEG) and sustained load from several robots.

    python benchmarks/bench_cloud.py --checkpoint DIR [--vlm DIR] [--cameras 3] [--size 512]
        [--runs 20] [--robots 4] [--rate 5] [--duration 20] [--json out.json]

1. Overhead: the same observation (``--cameras`` cameras of ``--size`` x ``--size``) as raw RGB and as
   JPEG (``--jpeg-quality``), one request at a time. overhead = client round trip - the server's
   Engine.predict time (so: encoding, base64/JSON, nginx, MLServer, payload decoding, thread hand-offs,
   the loopback), reported as a ratio to local inference time (Engine.predict in this process, same
   inputs; interleaved with the remote calls).
2. Sustained load: ``--robots`` simulated robots (threads, one client each) send JPEG requests at
   ``--rate`` Hz each for ``--duration`` s against one server; requests/s, p50/p99 round trip, and
   lost = sent - answered (no deadline is set, so every request must be answered).

Concurrency of the server as benchmarked (the defaults of ``edgefm-cloud serve``): nginx 1 worker,
32 kept-alive upstream connections; MLServer with parallel_workers 0 (one engine in the server
process); request payloads decoded on 2 threads; the engine runs one request at a time on its own
thread, later requests queue (their wait is ``queue_s``). ``--workers N`` starts N engine processes
instead (MLServer parallel_workers). If the checkpoint has fewer cameras than ``--cameras``, a
temporary copy of its config.json declares more (all cameras share the vision weights).

A script that prints numbers, not a timed test: this machine is shared and has 2 cores; compare
ratios from one run. Do not run it in a loop.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefm_ros.cloud import ClientConfig, CloudPolicy, Encoding  # noqa: E402
from edgefm_ros.cloud.server.settings import free_port  # noqa: E402
from edgefm_ros.types import Observation  # noqa: E402

TOKEN = "bench-" + os.urandom(12).hex()


def scene(rng: np.random.Generator, size: int) -> np.ndarray:
    """uint8 (size, size, 3): smooth gradients, a few solid shapes, sensor noise (JPEG-like content)."""
    import cv2

    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    img = np.stack([200 * xx + 30, 150 * yy + 50, 120 * (1 - xx * yy) + 40], axis=-1)
    for _ in range(6):
        c = tuple(int(v) for v in rng.integers(0, 256, 3))
        p = rng.integers(0, size, 2)
        cv2.circle(img, (int(p[0]), int(p[1])), int(rng.integers(size // 20, size // 6)), c, -1)
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def checkpoint_with_cameras(ckpt: Path, cameras: int, size: int, tmp: Path) -> Path:
    cfg = json.loads((ckpt / "config.json").read_text())
    visual = [k for k, v in cfg["input_features"].items() if v.get("type") == "VISUAL"]
    if len(visual) >= cameras:
        return ckpt
    out = tmp / ckpt.name
    out.mkdir()
    for f in ckpt.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    for i in range(len(visual), cameras):
        cfg["input_features"][f"observation.images.bench{i}"] = {"type": "VISUAL", "shape": [3, size, size]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def start_server(ckpt: Path, vlm: str | None, port: int, workers: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               EDGEFM_CLOUD_TOKEN=TOKEN)
    args = [sys.executable, "-m", "edgefm_ros.cloud.cli", "serve", "--checkpoint", str(ckpt), "--port", str(port),
            "--workers", str(workers), "--max-body-mb", "64"] + (["--vlm", vlm] if vlm else [])
    proc = subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("server not ready")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def overhead(cloud: CloudPolicy, engine, obs: Observation, runs: int, warmup: int, quality: int) -> dict:
    """Interleaved round by round (local, raw, JPEG), so host noise hits all three alike."""
    encodings = {"raw": Encoding("raw"), "jpeg": Encoding("jpeg", quality)}
    local, rows = [], {name: [] for name in encodings}
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        engine.predict(obs)
        t_local = time.perf_counter() - t0
        for name, enc in encodings.items():
            cloud.predict(obs, 60.0, enc)
            if i >= warmup:
                r = cloud.last
                compute = r.server.get("engine_s", 0.0)
                rows[name].append((r.total_s, compute, r.server.get("server_s", 0.0), r.encode_s, r.upload_bytes))
        if i >= warmup:
            local.append(t_local)
    out = {"local_s": statistics.median(local)}
    for name, xs in rows.items():
        total, compute, server, encode, sent = zip(*xs)
        ovh = statistics.median(t - c for t, c in zip(total, compute))
        out[name] = {"round_trip_s": statistics.median(total), "server_engine_s": statistics.median(compute),
                     "server_total_s": statistics.median(server), "overhead_s": ovh,
                     "client_encode_s": statistics.median(encode), "overhead_ratio_to_local": ovh / out["local_s"],
                     "request_bytes": int(sent[0])}
    return out


def sustained(url: str, obs: Observation, robots: int, rate_hz: float, duration_s: float, quality: int) -> dict:
    lat: list[float] = []
    sent, answered, failed = [0], [0], [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def robot(i: int) -> None:
        cloud = CloudPolicy(url, TOKEN, config=ClientConfig(max_attempts=1))
        period, nxt = 1.0 / rate_hz, time.monotonic() + i * (1.0 / rate_hz) / robots
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            time.sleep(max(0.0, nxt - now))
            nxt += period
            with lock:
                sent[0] += 1
            t0 = time.perf_counter()
            try:
                cloud.predict(obs, 120.0, Encoding("jpeg", quality), seq=i)
                with lock:
                    answered[0] += 1
                    lat.append(time.perf_counter() - t0)
            except Exception:
                with lock:
                    failed[0] += 1
        cloud.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=robot, args=(i,)) for i in range(robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"robots": robots, "rate_hz_each": rate_hz, "wall_s": wall, "sent": sent[0], "answered": answered[0],
            "failed": failed[0], "lost": sent[0] - answered[0], "requests_per_s": answered[0] / wall,
            "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "max_s": max(lat) if lat else float("nan")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--vlm", default=None)
    p.add_argument("--cameras", type=int, default=3)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--jpeg-quality", type=int, default=90)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--robots", type=int, default=4)
    p.add_argument("--rate", type=float, default=5.0, help="requests per second per robot")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=0, help="MLServer parallel_workers of the server")
    p.add_argument("--skip-load", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()

    from edgefm_ros.runtime.engine import Engine

    rng = np.random.default_rng()
    with tempfile.TemporaryDirectory(prefix="bench-cloud-") as tmp:
        ckpt = checkpoint_with_cameras(Path(a.checkpoint), a.cameras, a.size, Path(tmp))
        engine = Engine.from_checkpoint(ckpt, vlm_dir=a.vlm, mode="exact")
        engine.warmup()
        keys = engine.spec.camera_keys[:a.cameras]
        missing = tuple(k for k in engine.spec.camera_keys if k not in keys)
        state = rng.standard_normal(engine.spec.state_dim).astype(np.float32)
        obs = Observation({k: scene(rng, a.size) for k in keys}, state, "pick up the red cube and put it in the box",
                          missing=missing)
        port = free_port()
        proc = start_server(ckpt, a.vlm, port, a.workers, Path(tmp) / "server.log")
        url = f"http://127.0.0.1:{port}"
        try:
            cloud = CloudPolicy(url, TOKEN)
            result = {"cameras": len(keys), "size": a.size, "jpeg_quality": a.jpeg_quality, "model": engine.spec.name,
                      "overhead": overhead(cloud, engine, obs, a.runs, a.warmup, a.jpeg_quality)}
            if not a.skip_load:
                result["sustained"] = sustained(url, obs, a.robots, a.rate, a.duration, a.jpeg_quality)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    o = result["overhead"]
    print(f"{result['cameras']} cameras {a.size}x{a.size}, model {result['model']}, local inference "
          f"{o['local_s'] * 1e3:.1f} ms (median of {a.runs})")
    for name in ("raw", "jpeg"):
        r = o[name]
        print(f"  {name:4s}: request {r['request_bytes'] / 1e6:6.2f} MB  round trip {r['round_trip_s'] * 1e3:7.1f} ms  "
              f"server engine {r['server_engine_s'] * 1e3:7.1f} ms  overhead {r['overhead_s'] * 1e3:7.1f} ms "
              f"(of which client encoding {r['client_encode_s'] * 1e3:5.1f} ms) "
              f"= {r['overhead_ratio_to_local']:.2f} x local inference")
    if "sustained" in result:
        s = result["sustained"]
        print(f"  load: {s['robots']} robots x {s['rate_hz_each']} Hz for {s['wall_s']:.1f} s: "
              f"{s['requests_per_s']:.1f} req/s, p50 {s['p50_s'] * 1e3:.1f} ms, p99 {s['p99_s'] * 1e3:.1f} ms, "
              f"sent {s['sent']}, answered {s['answered']}, lost {s['lost']}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

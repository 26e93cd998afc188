"""Time the router's feature vector on a 640x480 frame (issue budget: p95 <= 5 ms on the dev machine).

    python benchmarks/bench_router_features.py [--runs 500] [--threads N]

Prints p50/p95/p99 per stage for a raw RGB frame and for the same frame as JPEG bytes (what a
CompressedImage carries), plus a whole Router.decide (features + encoded bytes for the cloud
candidates + prediction + rules). A script that prints numbers, not a timed test: this machine is shared.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefm_ros.routing.features import extract_features, text_features, visual_features  # noqa: E402
from edgefm_ros.routing.link import LinkEstimator  # noqa: E402
from edgefm_ros.routing.router import Router  # noqa: E402


def frame() -> np.ndarray:
    """uint8 (480, 640, 3): a real photograph when scikit-image is installed, else smoothed noise."""
    try:
        from skimage import data

        return np.ascontiguousarray(cv2.resize(data.astronaut(), (640, 480), interpolation=cv2.INTER_AREA))
    except ImportError:
        rng = np.random.default_rng()
        return cv2.GaussianBlur(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8), (0, 0), 2.0)


def timeit(fn, runs: int) -> np.ndarray:
    for _ in range(min(20, runs)):
        fn()
    out = np.empty(runs)
    for i in range(runs):
        t = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t
    return out * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--threads", type=int, default=-1, help="cv2.setNumThreads (default: OpenCV's choice)")
    args = ap.parse_args()
    if args.threads >= 0:
        cv2.setNumThreads(args.threads)
    img = frame()
    ok, jpg = cv2.imencode(".jpg", img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 80])
    jpeg = jpg.tobytes()
    mirrored = np.ascontiguousarray(img[:, ::-1])  # a second camera's frame
    text = "if the red cup is left of the plate, put it in the second drawer"
    router = Router.from_yaml(ROOT / "config" / "router.yaml", link=LinkEstimator())
    for t in range(5):
        router.link.observe(400_000, 400_000 * 8 / 50e6, 0.03, now=float(t))
    cases = {
        "visual raw 640x480": lambda: visual_features(img),
        "visual jpeg 640x480": lambda: visual_features(jpeg),
        "text": lambda: text_features(text),
        "feature vector raw (10)": lambda: extract_features({"cam": img}, text),
        "feature vector jpeg (10)": lambda: extract_features({"cam": jpeg}, text),
        "Router.decide raw": lambda: router.decide({"cam": img}, text, 1.0, now=5.0),
        "Router.decide jpeg": lambda: router.decide({"cam": jpeg}, text, 1.0, now=5.0),
        "Router.decide raw, 2 cams": lambda: router.decide({"a": img, "b": mirrored}, text, 1.0, now=5.0),
    }
    print(f"{'stage':<26} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}   ({args.runs} runs, cv2 threads "
          f"{cv2.getNumThreads()})")
    for name, fn in cases.items():
        ms = timeit(fn, args.runs)
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        print(f"{name:<26} {p50:>8.3f} {p95:>8.3f} {p99:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

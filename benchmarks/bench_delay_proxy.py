"""What the delaying proxy (cloud/delay_proxy.py) adds in front of the real cloud server, against the link model.

    python benchmarks/bench_delay_proxy.py --checkpoint checkpoints/smolvla-cloud --link 20,40 --repeats 5

Starts ``edgefm-cloud serve`` of the checkpoint on loopback (nginx, bearer token, one engine thread), then per
shape (the bare loopback through an unshaped proxy; the link's round trip only; its round trip and rate) times on
one kept-alive connection each: the model's metadata GET (a small request and answer) and a predict with a
random observation at the checkpoint's image size (raw images), whose time minus the server's own compute time
is the wire's. Prints the medians, the added time against the unshaped proxy, and what the link model predicts:
the round trip plus the bytes the proxy forwarded (both directions) over the rate.
"""
from __future__ import annotations

import argparse
import http.client
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from edgefm_ros.cloud import CloudPolicy, Encoding
from edgefm_ros.cloud.delay_proxy import DelayProxy, LinkShape
from edgefm_ros.cloud.server.serve import running
from edgefm_ros.cloud.server.settings import ServeConfig, free_port
from edgefm_ros.sim.rollout import checkpoint_settings
from edgefm_ros.sim.tiers import Link
from edgefm_ros.types import Observation


def metadata_s(url: str, token: str, repeats: int) -> float:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    times = []
    try:
        for k in range(repeats + 1):
            t0 = time.perf_counter()
            conn.request("GET", "/v2/models/smolvla", headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"metadata GET answered {resp.status}")
            if k:  # the first opens the connection
                times.append(time.perf_counter() - t0)
    finally:
        conn.close()
    return statistics.median(times)


def predict_wire_s(url: str, token: str, obs: Observation, repeats: int) -> float:
    """Median of (client's total - encoding - server's time) over ``repeats`` predicts after one warm-up."""
    policy = CloudPolicy(url, token)
    wire = []
    try:
        for k in range(repeats + 1):
            policy.predict(obs, 60.0, Encoding("raw"), seq=k)
            r = policy.last
            if k:
                wire.append(r.total_s - r.encode_s - r.server.get("server_s", 0.0))
    finally:
        policy.close()
    return statistics.median(wire)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="checkpoints/smolvla-cloud")
    p.add_argument("--link", type=Link.parse, default=Link(), help="MBPS,RTT_MS (default 20,40)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    st = checkpoint_settings(args.checkpoint)
    rng = np.random.default_rng(0)
    h, w = st["image_hw"]
    feats = json.loads((Path(args.checkpoint) / "config.json").read_text())["input_features"]
    obs = Observation(images={f"observation.images.{c}": rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                              for c in st["cameras"]},
                      state=np.zeros(feats["observation.state"]["shape"][-1], np.float32), task="close the door",
                      stamp=0.0)
    token = secrets.token_urlsafe(24)
    cfg = ServeConfig(args.checkpoint, mode="exact", port=free_port(), token=token, threads=1, ready_timeout_s=300.0)
    shapes = {"unshaped": LinkShape(0.0), "rtt": LinkShape(args.link.rtt_ms),
              "rtt+rate": LinkShape(args.link.rtt_ms, args.link.mbps)}
    out: dict = {"link": {"mbps": args.link.mbps, "rtt_ms": args.link.rtt_ms}, "shapes": {}}
    with tempfile.NamedTemporaryFile(prefix="edgefm-bench-proxy-", suffix=".log", delete=False) as log:
        print(f"starting the cloud tier (log {log.name}) ...", flush=True)
    with open(log.name, "ab") as log, running(cfg, log=log) as url:
        for name, shape in shapes.items():
            with DelayProxy(url, shape) as proxy:
                meta = metadata_s(proxy.url, token, args.repeats)
                before = proxy.counts()
                meta_bytes = (before.up + before.down) / (args.repeats + 1)
                wire = predict_wire_s(proxy.url, token, obs, args.repeats)
                after = proxy.counts()
            n = args.repeats + 1
            up, down = (after.up - before.up) / n, (after.down - before.down) / n
            out["shapes"][name] = {"metadata_ms": meta * 1e3, "metadata_bytes": meta_bytes,
                                   "predict_wire_ms": wire * 1e3,
                                   "predict_up_bytes": up, "predict_down_bytes": down}
    base = out["shapes"]["unshaped"]
    print(f"link {args.link.mbps:g} Mbit/s, {args.link.rtt_ms:g} ms; medians of {args.repeats}")
    print(f"{'shape':<9} {'metadata ms':>12} {'added':>7} {'model':>7} | {'predict wire ms':>15} {'added':>7} "
          f"{'model':>7} {'up kB':>7}")
    for name, s in out["shapes"].items():
        shape = shapes[name]
        def model_ms(nbytes: float) -> float:
            return shape.rtt_ms + (0.0 if shape.rate_mbps is None else nbytes * 8 / (shape.rate_mbps * 1e6) * 1e3)

        s["metadata_added_ms"] = s["metadata_ms"] - base["metadata_ms"]
        s["predict_added_ms"] = s["predict_wire_ms"] - base["predict_wire_ms"]
        s["metadata_model_ms"] = model_ms(s["metadata_bytes"])
        s["predict_model_ms"] = model_ms(s["predict_up_bytes"] + s["predict_down_bytes"])
        print(f"{name:<9} {s['metadata_ms']:>12.1f} {s['metadata_added_ms']:>7.1f} {s['metadata_model_ms']:>7.1f} | "
              f"{s['predict_wire_ms']:>15.1f} {s['predict_added_ms']:>7.1f} {s['predict_model_ms']:>7.1f} "
              f"{s['predict_up_bytes'] / 1e3:>7.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

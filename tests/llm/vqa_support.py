"""Helpers for the scene-question tests: a router config whose cloud candidate wins when the link is
known, and the real `edgefm-cloud serve --task vqa` (MLServer + nginx) on a free loopback port."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cloud"))  # cloud_support (imported by path)

from cloud_support import TOKEN, ServerProcess, free_port, need_server_deps  # noqa: E402

QUESTIONS = ("what is on the table?", "is the drawer open?", "how many cubes are red?", "where is the cup?")


def router_doc(cloud_quality: float = 0.95, jpeg_quality: int = 0) -> dict:
    """Edge and cloud candidates for VQA: raw images (jpeg_quality 0) keep the cloud's pixels the edge's."""
    strong, weak = {"blur": 1.0, "detail": 1.0, "reasoning": 1.0}, {"blur": 0.0, "detail": 0.0, "reasoning": 0.0}
    common = {"model": "smolvlm2-tiny", "params_b": 0.01, "precision": "fp32", "resolution": 512}
    return {"candidates": [
        {"name": "edge-vqa", "placement": "edge", "base_quality": 0.3, "strengths": weak, "jpeg_quality": 0, **common},
        {"name": "cloud-vqa", "placement": "cloud", "base_quality": cloud_quality, "strengths": strong,
         "jpeg_quality": jpeg_quality, **common}],
        "policy": {"default_deadline_s": 5.0}}


def write_router_yaml(path: Path, **kw) -> Path:
    path.write_text(yaml.safe_dump(router_doc(**kw)))
    return path


def start_vqa_server(model_dir: Path, work: Path, *extra: str) -> ServerProcess:
    """`edgefm-cloud serve --task vqa` with a bearer token behind nginx; ``srv.url``, ``srv.token_file``."""
    need_server_deps()
    (work / "token").write_text(TOKEN + "\n")
    port = free_port()
    srv = ServerProcess(["--task", "vqa", "--checkpoint", str(model_dir), "--port", str(port), "--token-file",
                         str(work / "token"), "--capacity", "512", *extra], work / "server.log")
    srv.url, srv.port, srv.token_file = f"http://127.0.0.1:{port}", port, work / "token"
    srv.start()
    try:
        srv.wait_ready(srv.url, timeout_s=240.0)  # imports alone can take minutes on a loaded 2-core machine
    except BaseException:
        srv.stop()  # never leave a server behind when the fixture fails
        raise
    return srv

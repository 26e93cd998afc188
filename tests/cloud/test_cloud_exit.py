"""`edgefm-cloud serve` stopped by SIGTERM (systemd) or SIGINT (Ctrl-C) leaves nothing: MLServer and nginx
exit with it, their ports are free again, and its temporary directory is gone."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from cloud_support import TOKEN, ServerProcess, free_port, need_server_deps


def _group_alive(pgid: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(pid))
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stopped_by_signal_leaves_no_process_port_or_directory(tiny_dirs, tmp_path, sig, monkeypatch):
    need_server_deps()
    (tmp_path / "token").write_text(TOKEN + "\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the server's temporary directory lands where this test can see it
    port, grpc_port = free_port(), free_port()
    srv = ServerProcess(["--checkpoint", str(tiny_dirs[0]), "--vlm", str(tiny_dirs[1]), "--port", str(port),
                         "--grpc-port", str(grpc_port), "--token-file", str(tmp_path / "token")], tmp_path / "server.log")
    srv.start()
    try:
        srv.wait_ready(f"http://127.0.0.1:{port}", timeout_s=120)
        end = time.monotonic() + 30  # serving (not still starting: a signal then ends it with 128 + signal)
        while "edgefm-cloud ready" not in srv.log() and time.monotonic() < end:
            time.sleep(0.1)
        assert len(_group_alive(srv.proc.pid)) >= 3, "expected the supervisor, MLServer and nginx"
        assert [p.name for p in tmp.iterdir()], "the server made no temporary directory"
        srv.proc.send_signal(sig)
        rc = srv.proc.wait(timeout=30)
        end = time.monotonic() + 5
        while _group_alive(srv.proc.pid) and time.monotonic() < end:
            time.sleep(0.1)
        left = _group_alive(srv.proc.pid)
    finally:
        srv.kill()
    assert rc == 0, srv.log()
    assert not left, f"processes of the server outlived it: {left}"
    assert _port_free(port) and _port_free(grpc_port)
    assert list(tmp.iterdir()) == [], f"left behind: {list(tmp.iterdir())}"

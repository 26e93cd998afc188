"""`edgefm-cloud serve` configuration: validation, and the files rendered from config/cloud/ (the nginx
config is checked by nginx itself, `nginx -t`, in every variant)."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from edgefm_ros.cloud.cli import _parser, config_from_args
from edgefm_ros.cloud.server.settings import ServeConfig, find_config_dir, render_nginx, write_run_dir
from edgefm_ros.cloud.tasks.vla import VlaRuntimeConfig

TOKEN = "abcdefghijklmnop-0123456789"


@pytest.fixture
def certs(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")],
                   check=True, capture_output=True)
    return str(tmp_path / "c.pem"), str(tmp_path / "k.pem")


@pytest.mark.parametrize("kw, message", [
    (dict(mode="turbo"), "mode"),
    (dict(device="tpu"), "device"),
    (dict(model_name="a/b"), "model_name"),
    (dict(port=70000), "port"),
    (dict(token="short"), "token"),
    (dict(token="x" * 20 + '"; return 200;'), "token"),
    (dict(tls_cert="/nonexistent.pem", tls_key="/nonexistent.key"), "tls_cert"),
    (dict(tls_key="/nonexistent.key"), "TLS needs both"),
    (dict(host="0.0.0.0"), "without a bearer token"),
    (dict(proxy=False, token=TOKEN), "need the proxy"),
    (dict(max_body_bytes=10), "max_body_bytes"),
])
def test_bad_serve_config_is_refused_with_the_reason(kw, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(checkpoint="ckpt", **kw)


def test_non_loopback_needs_token_or_explicit_no_auth():
    assert ServeConfig(checkpoint="c", host="0.0.0.0", token=TOKEN).scheme == "http"
    ServeConfig(checkpoint="c", host="10.1.2.3", allow_no_auth=True)
    ServeConfig(checkpoint="c", host="::1")


def test_cli_arguments_and_token_file(tmp_path, monkeypatch):
    (tmp_path / "tok").write_text(TOKEN + "\n")
    args = _parser().parse_args(["serve", "--checkpoint", "ck", "--mode", "fast", "--port", "9001",
                                 "--token-file", str(tmp_path / "tok"), "--max-body-mb", "2"])
    cfg = config_from_args(args)
    assert (cfg.mode, cfg.port, cfg.token, cfg.max_body_bytes) == ("fast", 9001, TOKEN, 2 << 20)
    monkeypatch.setenv("EDGEFM_CLOUD_TOKEN", TOKEN[::-1])
    assert config_from_args(_parser().parse_args(["serve", "--checkpoint", "ck"])).token == TOKEN[::-1]


def test_run_dir_files(tmp_path):
    cfg = ServeConfig(checkpoint=str(tmp_path), vlm=str(tmp_path), mode="fast", token=TOKEN, port=9100, threads=2)
    conf = write_run_dir(cfg, tmp_path, rest_port=9200, grpc_port=9300)
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert (settings["host"], settings["http_port"], settings["grpc_port"]) == ("127.0.0.1", 9200, 9300)
    assert settings["parallel_workers"] == 0 and settings["metrics_endpoint"] is None
    model = json.loads((tmp_path / "smolvla" / "model-settings.json").read_text())
    assert model["implementation"] == "edgefm_ros.cloud.server.runtime.VlaRuntime"
    rc = VlaRuntimeConfig.from_extra(model["parameters"]["extra"])  # the runtime accepts what serve writes
    assert (rc.mode, rc.threads, rc.checkpoint) == ("fast", 2, str(tmp_path.resolve()))
    assert conf.stat().st_mode & 0o077 == 0  # holds the token: owner only
    text = conf.read_text()
    assert f'"Bearer {TOKEN}" 1;' in text and "default 0;" in text and "127.0.0.1:9200" in text
    assert "ssl_certificate" not in text and "grpc_pass" not in text
    with pytest.raises(ValueError, match="unknown keys"):
        VlaRuntimeConfig.from_extra({"checkpoint": "x", "modee": "fast"})
    assert find_config_dir() == find_config_dir(str(find_config_dir()))


@pytest.mark.parametrize("variant", ["open", "token", "tls+grpc"])
def test_rendered_nginx_config_is_valid(tmp_path, variant, request):
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if not nginx:
        pytest.skip("nginx not installed (apt-get install -y nginx-light)")
    kw = {}
    if variant != "open":
        kw["token"] = TOKEN
    if variant == "tls+grpc":
        cert, key = request.getfixturevalue("certs")
        kw.update(tls_cert=cert, tls_key=key, grpc_port=9443)
    cfg = ServeConfig(checkpoint="c", port=9442, **kw)
    text = render_nginx(cfg, (find_config_dir() / "nginx.conf.in").read_text(), tmp_path, 9200, 9300)
    (tmp_path / "nginx.conf").write_text(text)
    r = subprocess.run([nginx, "-t", "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path), "-e", "stderr"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ("default 1;" in text) == (variant == "open")
    assert ("listen 127.0.0.1:9442 ssl;" in text) == (variant == "tls+grpc")
    assert ("grpc_pass grpc://mlserver_grpc;" in text) == (variant == "tls+grpc")

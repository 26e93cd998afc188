"""The shared core without a server: the deadline counts from receipt, the metadata declares every
tensor a client sends, request-level image parameters, the one ClientConfig, RemotePolicy's signature,
and cloud/'s import shape (no cycles, no private names imported across modules)."""
from __future__ import annotations

import ast
import base64
import inspect
import json
import time
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.cloud import ClientConfig, CloudPolicy, Encoding, RemotePolicy
from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor, image
from edgefm_ros.cloud.core.timing import RequestClock
from edgefm_ros.cloud.tasks import TASKS, get_task, vla, vqa
from edgefm_ros.types import Observation

CLOUD = Path(vla.__file__).resolve().parents[1]


def test_deadline_counts_from_receipt_not_from_the_queue():
    clock = RequestClock()
    time.sleep(0.06)  # payload decoding took longer than the budget; the engine thread is free at once
    clock.mark_decoded()
    with pytest.raises(ProtocolError, match="past its deadline of 0.040 s") as e:
        clock.start("r", 0.04)
    assert e.value.status == 504 and clock.started - clock.decoded < 0.04  # the queue alone was within budget
    ok = RequestClock()
    ok.mark_decoded()
    ok.start("r", 5.0)  # within budget: no error
    ok.start("r", None)
    t = ok.timings({"engine_s": 0.0})
    assert t["server_s"] >= t["queue_s"] + t["decode_input_s"] and t["engine_s"] == 0.0
    assert not ok.out_of_time(5.0) and ok.out_of_time(0.0)


def _tensors(request: dict) -> list[Tensor]:
    request = json.loads(json.dumps(request))
    return [Tensor(i["name"], i["datatype"], i["shape"], i.get("parameters", {}), i["data"]) for i in request["inputs"]]


def _matches(spec: dict, t: dict) -> bool:
    return spec["datatype"] == t["datatype"] and len(spec["shape"]) == len(t["shape"]) and all(
        s in (-1, n) for s, n in zip(spec["shape"], t["shape"]))


def test_metadata_declares_every_tensor_the_clients_send_and_decode_accepts(rng):
    cams = ("observation.images.top", "observation.images.wrist")
    limits = vla.VlaLimits(camera_keys=cams, state_dim=6, noise_shape=(8, 32), action_dim=6)
    obs = Observation({k: rng.integers(0, 256, (20, 30, 3), dtype=np.uint8) for k in cams},
                      rng.standard_normal(6).astype(np.float32), "pick")
    req = vla.encode_request(obs, Encoding(), request_id="m", dt=0.1, noise=np.zeros((8, 32), np.float32),
                             rtc_prefix=rng.standard_normal((3, 6)).astype(np.float32), rtc_delay=2)
    meta = vla.metadata(limits)
    declared = {t["name"]: t for t in meta["inputs"]}
    assert set(declared) == {i["name"] for i in req["inputs"]}
    assert all(_matches(declared[i["name"]], i) for i in req["inputs"])
    assert set(req["parameters"]) <= set(meta["parameters"])
    vla.decode_request("m", req["parameters"], _tensors(req), limits)  # and the server takes it
    body = vla.encode_response(np.zeros((8, 6), np.float32), "m", 0, {})
    assert all(_matches(o, b) for o, b in zip(meta["outputs"], body["outputs"]))
    assert set(body["parameters"]) - {"runs", "model", "seq"} <= set(meta["parameters"]["response"].replace(
        ",", " ").split())

    vlimits = vqa.VqaLimits(max_images=2)
    req = vqa.encode_vqa_request("what?", [obs.images[cams[0]]] * 2, request_id="q", system="be brief", seed=3,
                                 deadline_s=1.0)
    meta = vqa.metadata(vlimits)
    declared = {t["name"]: t for t in meta["inputs"]}
    assert set(declared) == {"question", "system", "image_0", "image_1"} == {i["name"] for i in req["inputs"]}
    assert all(_matches(declared[i["name"]], i) for i in req["inputs"])
    assert set(req["parameters"]) <= set(meta["parameters"])
    vqa.decode_vqa_request("q", req["parameters"], _tensors(req), vlimits)
    body = vqa.encode_vqa_response("a cup", [5, 6, 7], "m", "eos", {}, {})
    outs = {o["name"]: o for o in meta["outputs"]}
    assert all(_matches(outs[b["name"]], b) for b in body["outputs"])


def test_image_parameters_may_come_from_the_request():
    rng = np.random.default_rng()
    img = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    t = Tensor("image_0", "BYTES", [1], {}, [base64.b64encode(img.tobytes()).decode()])
    shared = {"image_encoding": "raw", "image_dtype": "uint8", "image_shape": [12, 10, 3], "seed": 1}
    np.testing.assert_array_equal(image(t, 64, 1 << 20, shared), img)
    with pytest.raises(ProtocolError, match="image_0: image_encoding must be one of"):
        image(t, 64, 1 << 20, {})
    own = t._replace(parameters={"image_encoding": "jpeg"})  # the input's own parameters win
    with pytest.raises(ProtocolError, match="not a JPEG"):
        image(own, 64, 1 << 20, shared)


def test_one_client_config_with_defaults_per_task():
    assert ClientConfig() == ClientConfig.for_task("vla")
    q = ClientConfig.for_task("vqa", max_attempts=3)
    assert (q.model_name, q.retry_margin_s, q.threads, q.max_attempts) == ("vqa", 0.05, 2, 3)
    with pytest.raises(ValueError, match="'chat'"):
        ClientConfig.for_task("chat")
    with pytest.raises(ValueError, match="ClientConfig.max_attempts"):
        ClientConfig.for_task("vqa", max_attempts=0)
    assert set(TASKS) == {"vla", "vqa"} and get_task("vqa").streams and not get_task("vla").streams


def test_cloud_policy_is_a_remote_policy_with_its_full_signature():
    cp = CloudPolicy("http://127.0.0.1:9")
    try:
        assert isinstance(cp, RemotePolicy)
        for name in ("predict", "stats", "close"):
            assert inspect.signature(getattr(CloudPolicy, name)) == inspect.signature(getattr(RemotePolicy, name))
    finally:
        cp.close()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of each ``from edgefm_ros.cloud... import ...`` / ``import edgefm_ros.cloud...``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edgefm_ros.cloud"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("edgefm_ros.cloud")]
    return out


def test_cloud_imports_no_private_names_and_has_no_cycle():
    modules = {}
    for f in sorted(CLOUD.rglob("*.py")):
        rel = f.relative_to(CLOUD.parents[1]).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = _imports(f)
    private = [(m, mod, n) for m, imps in modules.items() for mod, names in imps for n in names if n.startswith("_")]
    assert not private
    graph = {m: set() for m in modules}
    for m, imps in modules.items():
        for mod, names in imps:
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in modules] or [mod]
            graph[m].update(t for t in targets if t in modules and t != m)
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, f"import cycle: {' -> '.join(path + [m, n])}"
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    assert {"edgefm_ros.cloud.core.protocol", "edgefm_ros.cloud.tasks.vla", "edgefm_ros.cloud.tasks.vqa",
            "edgefm_ros.cloud.server.runtime", "edgefm_ros.cloud.client.base"} <= set(graph)
    assert not any(m.rsplit(".", 1)[-1].startswith("vqa_") for m in graph)  # the vla/vqa twins are gone

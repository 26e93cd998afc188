"""The scene-question protocol without a server: request/response round trips, every malformed request
refused naming the bad field, the runtime's settings, and the MLServer runtime in-process on a random
tiny SmolLM2 (text only): greedy answers identical to the local engine's."""
from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor
from edgefm_ros.cloud.images import Encoding, decode_image, encode_image
from edgefm_ros.cloud.tasks.vqa import (VqaLimits, VqaRuntimeConfig, decode_vqa_event, decode_vqa_request,
                                        decode_vqa_response, encode_vqa_delta, encode_vqa_error, encode_vqa_final,
                                        encode_vqa_request, encode_vqa_response)
from edgefm_ros.cloud.prompt import vqa_messages

@pytest.fixture
def rng():
    return np.random.default_rng()  # fresh inputs every run


LIMITS = VqaLimits(max_images=3, max_side=256, max_image_bytes=1 << 20, max_question_chars=200, max_new_tokens=64)


def tensors(request: dict) -> list[Tensor]:
    return [Tensor(i["name"], i["datatype"], i["shape"], i.get("parameters", {}), i["data"]) for i in request["inputs"]]


def decode(request: dict, limits: VqaLimits = LIMITS):
    return decode_vqa_request(request["id"], request["parameters"], tensors(json.loads(json.dumps(request))), limits)


def random_images(rng) -> list[np.ndarray]:
    h, w = (int(x) for x in rng.integers(8, 200, size=2))
    return [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8),
            rng.random((3, w, h), dtype=np.float32)]


def test_request_round_trip_raw_and_jpeg(rng):
    images = random_images(rng)
    question = " ".join(rng.choice(["where", "is", "the", "red", "cup", "?"], size=int(rng.integers(1, 8))))
    n, temp, seed = int(rng.integers(1, 65)), float(rng.uniform(0.1, 2.0)), int(rng.integers(0, 1 << 40))
    req = encode_vqa_request(question, images, Encoding("raw"), request_id="r1", system="be brief",
                             max_new_tokens=n, temperature=temp, top_k=5, top_p=0.9, seed=seed, deadline_s=1.5)
    d = decode(req)
    assert (d.request_id, d.question, d.system, d.max_new_tokens, d.seed) == ("r1", question, "be brief", n, seed)
    assert (d.temperature, d.top_k, d.top_p, d.deadline_s) == pytest.approx((temp, 5, 0.9, 1.5))
    assert len(d.images) == 2 and np.array_equal(d.images[0], images[0]) and np.array_equal(d.images[1], images[1])
    assert d.images[1].dtype == np.float32
    enc = Encoding("jpeg", 80, 64)  # downscaled to a longer side of 64, then JPEG
    d = decode(encode_vqa_request(question, images[:1], enc, request_id="r2"))
    expected = decode_image(encode_image(images[0], enc)[0], {"image_encoding": "jpeg"}, 256)
    assert max(d.images[0].shape[:2]) == min(64, max(images[0].shape[:2])) and np.array_equal(d.images[0], expected)
    assert (d.system, d.seed, d.deadline_s, d.max_new_tokens, d.temperature) == (None, None, None, 64, 0.0)


def test_response_round_trip(rng):
    ids = [int(i) for i in rng.integers(0, 50000, size=int(rng.integers(0, 20)))]
    timings = {k: float(v) for k, v in zip(("queue_s", "prefill_s", "decode_s", "server_s"), rng.random(4))}
    body = encode_vqa_response("a red cup", ids, "smolvlm2", "eos", {"tokens_generated": len(ids)}, timings)
    text, tokens, params = decode_vqa_response(json.loads(json.dumps(body)))
    assert (text, tokens, params["stop_reason"]) == ("a red cup", tuple(ids), "eos")
    assert params["tokens_generated"] == len(ids)
    assert all(params[k] == pytest.approx(v) for k, v in timings.items())
    with pytest.raises(ValueError, match="tokens"):
        decode_vqa_response({"outputs": [body["outputs"][0]]})


def test_stream_events_round_trip_and_malformed_ones_are_named(rng):
    ids = [int(i) for i in rng.integers(0, 50000, size=int(rng.integers(1, 12)))]
    words = [str(w) for w in rng.choice(["a ", "red ", "cup", "", " on", " the table", "\u00e9\n"], size=len(ids))]
    deltas = [decode_vqa_event(json.loads(json.dumps(encode_vqa_delta(t, w, i))))
              for i, (t, w) in enumerate(zip(ids, words))]
    assert [(e.kind, e.token, e.text) for e in deltas] == [("delta", t, w) for t, w in zip(ids, words)]
    body = encode_vqa_response("".join(words), ids, "smolvlm2", "length", {}, {"server_s": float(rng.random())})
    final = decode_vqa_event(json.loads(json.dumps(encode_vqa_final(body))))
    assert (final.kind, final.text, final.tokens, final.params["stop_reason"]) == \
        ("final", "".join(words), tuple(ids), "length") and "event" not in final.params
    plain = decode_vqa_event(body)  # no "event" parameter: a response in one piece is a final event
    assert (plain.kind, plain.text, plain.tokens) == ("final", final.text, final.tokens)
    status = int(rng.choice([400, 499, 504]))
    err = decode_vqa_event(json.loads(json.dumps(encode_vqa_error(status, "deadline ran out"))))
    assert (err.kind, err.status, err.error) == ("error", status, "deadline ran out")
    good = encode_vqa_delta(ids[0], "x", 0)
    cases = {"kind": {**good, "parameters": {"event": "partial"}},
             "token": {**good, "parameters": {"event": "delta", "token": -1}},
             "delta": {**good, "outputs": []},
             "status": encode_vqa_error(200, "fine"),
             "answer": {"parameters": {"event": "final"}, "outputs": []}}
    for field, body in cases.items():
        with pytest.raises(ValueError, match=field):
            decode_vqa_event(body)


def _req(**kw) -> dict:
    rng = np.random.default_rng()
    img = rng.integers(0, 256, size=(16, 24, 3), dtype=np.uint8)
    return encode_vqa_request("what is there?", [img] * kw.pop("n_images", 1), request_id="x", **kw)


def _with_input(req: dict, which: str, **changes) -> dict:
    for i in req["inputs"]:
        if i["name"] == which:
            i.update(changes)
    return req


BAD = {
    "no question": (lambda: {**_req(), "inputs": _req()["inputs"][1:]}, "missing input 'question'"),
    "empty question": (lambda: _with_input(_req(), "question", data=["   "]), "'question' must be 1..200"),
    "long question": (lambda: _with_input(_req(), "question", data=["x" * 201]), "'question' must be 1..200"),
    "question not text": (lambda: _with_input(_req(), "question", datatype="FP32"), "'question' must be BYTES"),
    "unknown input": (lambda: {**_req(), "inputs": _req()["inputs"] + [{"name": "state", "datatype": "FP32",
                                                                         "shape": [1], "data": [0.0]}]},
                      "unknown input"),
    "duplicate": (lambda: {**_req(), "inputs": _req()["inputs"] * 2}, "given twice"),
    "image numbering": (lambda: _with_input(_req(), "image_0", name="image_1"), "image_0..image_0"),
    "too many images": (lambda: _req(n_images=4), "too many images: 4"),
    "bad base64": (lambda: _with_input(_req(), "image_0", data=["**not base64**"]), "'image_0'.*base64"),
    "shape mismatch": (lambda: _with_input(_req(), "image_0", parameters={
        "image_encoding": "raw", "image_dtype": "uint8", "image_shape": [17, 24, 3]}), "image_0.*do not match"),
    "not a jpeg": (lambda: _with_input(_req(), "image_0", parameters={"image_encoding": "jpeg"}), "not a JPEG"),
    "too large image": (lambda: _with_input(_req(), "image_0", data=[base64.b64encode(bytes(2 << 20)).decode()]),
                        "over"),
    "max_new_tokens 0": (lambda: _req(max_new_tokens=0), "'max_new_tokens' must be an integer in \\[1, 64\\]"),
    "max_new_tokens big": (lambda: _req(max_new_tokens=65), "'max_new_tokens'"),
    "max_new_tokens text": (lambda: {**_req(), "parameters": {"max_new_tokens": "ten"}}, "'max_new_tokens'.*'ten'"),
    "max_new_tokens bool": (lambda: {**_req(), "parameters": {"max_new_tokens": True}}, "'max_new_tokens'"),
    "max_new_tokens frac": (lambda: {**_req(), "parameters": {"max_new_tokens": 2.5}}, "'max_new_tokens'"),
    "temperature": (lambda: _req(temperature=-0.5), "'temperature'"),
    "temperature nan": (lambda: {**_req(), "parameters": {"temperature": float("nan")}}, "'temperature'"),
    "top_p": (lambda: _req(top_p=0.0), "'top_p'"),
    "seed": (lambda: _req(seed=-1), "'seed'"),
    "deadline": (lambda: _req(deadline_s=-1.0), "'deadline_s'.*got -1.0"),
    "deadline nan": (lambda: {**_req(), "parameters": {"deadline_s": float("nan")}}, "'deadline_s'.*got nan"),
    "deadline text": (lambda: {**_req(), "parameters": {"deadline_s": "2"}}, "'deadline_s'.*got '2'"),
    "max_new_tokens float": (lambda: {**_req(), "parameters": {"max_new_tokens": 8.0}}, "'max_new_tokens'.*got 8.0"),
    "seed bool": (lambda: {**_req(), "parameters": {"seed": False}}, "'seed'.*got False"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_requests_are_refused_naming_the_field(case):
    make, message = BAD[case]
    req = make()
    with pytest.raises(ProtocolError, match=message) as e:
        decode_vqa_request(req["id"], req["parameters"], tensors(req), LIMITS)
    assert e.value.status == (413 if case == "too large image" else 400)


def test_text_only_model_refuses_images():
    with pytest.raises(ProtocolError, match="text-only"):
        decode(_req(), VqaLimits(max_images=0))
    assert decode(_req(n_images=0), VqaLimits(max_images=0)).images == ()


def test_messages_and_settings():
    assert vqa_messages("q?", 0) == [{"role": "user", "content": "q?"}]
    m = vqa_messages("q?", 2, "sys")
    assert m[0] == {"role": "system", "content": "sys"}
    assert [c["type"] for c in m[1]["content"]] == ["image", "image", "text"]
    with pytest.raises(ValueError, match="unknown keys \\['checkpoint'\\]"):
        VqaRuntimeConfig.from_extra({"checkpoint": "x"})
    with pytest.raises(ValueError, match="max_new_tokens 512 leaves no room"):
        VqaRuntimeConfig(capacity=512, max_new_tokens=512)


def test_serve_vqa_task_settings(tmp_path):
    from edgefm_ros.cloud.cli import _parser, config_from_args
    from edgefm_ros.cloud.server.settings import write_run_dir

    cfg = config_from_args(_parser().parse_args(["serve", "--task", "vqa", "--capacity", "300"]))
    assert (cfg.task, cfg.checkpoint, cfg.model_name) == ("vqa", "", "vqa")
    write_run_dir(cfg, tmp_path, 1234, 1235)
    m = json.loads((tmp_path / "vqa" / "model-settings.json").read_text())
    assert m["implementation"] == "edgefm_ros.cloud.server.runtime.VqaRuntime"
    rc = VqaRuntimeConfig.from_extra(m["parameters"]["extra"])
    assert (rc.model, rc.capacity, rc.max_new_tokens) == ("", 300, 150)
    with pytest.raises(ValueError, match="needs a checkpoint"):
        config_from_args(_parser().parse_args(["serve"]))
    with pytest.raises(ValueError, match="device 'cuda'"):
        config_from_args(_parser().parse_args(["serve", "--task", "vqa", "--device", "cuda"]))


def _infer(runtime, request: dict):
    from mlserver.types import InferenceRequest

    return asyncio.run(runtime.predict(InferenceRequest.model_validate(request)))


def test_runtime_in_process_text_model_matches_local_greedy(tied_llama, engine, rng):
    """VqaRuntime.load/predict as MLServer calls them (no HTTP): token-for-token the local engine's answer."""
    pytest.importorskip("mlserver", reason="MLServer (pip mlserver==1.7.1) is not installed")
    from mlserver.errors import MLServerError
    from mlserver.settings import ModelParameters, ModelSettings

    from edgefm_ros.cloud.server.runtime import VqaRuntime
    from edgefm_ros.generation.generate import SamplingConfig

    settings = ModelSettings(name="vqa", implementation=VqaRuntime,
                             parameters=ModelParameters(extra={"model": str(tied_llama[0]), "capacity": 256,
                                                               "max_new_tokens": 32}))
    runtime = VqaRuntime(settings)
    assert asyncio.run(runtime.load())
    question = str(rng.choice(["what is on the table?", "is the door open?", "name the red object"]))
    n = int(rng.integers(4, 12))
    resp = _infer(runtime, encode_vqa_request(question, [], request_id="t1", system="short answers",
                                             max_new_tokens=n))
    body = json.loads(resp.model_dump_json())
    text, tokens, params = decode_vqa_response(body)
    local = engine.generate(vqa_messages(question, 0, "short answers"), SamplingConfig(max_new_tokens=n))
    assert tokens == tuple(local.tokens) and text == local.text
    assert params["tokens_generated"] == len(tokens) and params["stop_reason"] == local.stop_reason
    assert 0 < params["prefill_s"] <= params["engine_s"] <= params["server_s"]
    with pytest.raises(MLServerError, match="text-only") as e:
        _infer(runtime, _req())
    assert e.value.status_code == 400

    # predict_stream: one delta per token, in order, then the final response; errors come in-band
    async def stream(request):
        async def one():
            yield InferenceRequest.model_validate(request)
        return [json.loads(r.model_dump_json()) for r in [r async for r in runtime.predict_stream(one())]]

    from mlserver.types import InferenceRequest

    events = [decode_vqa_event(b) for b in asyncio.run(stream(encode_vqa_request(
        question, [], request_id="t2", system="short answers", max_new_tokens=n)))]
    deltas, final = events[:-1], events[-1]
    assert {e.kind for e in deltas} == {"delta"} and final.kind == "final"
    assert [e.token for e in deltas][:len(local.tokens)] == local.tokens  # (+ the stop id when it ended on one)
    assert len(deltas) == len(local.tokens) + (local.stop_reason == "eos")
    assert "".join(e.text for e in deltas) == final.text == local.text and final.tokens == tuple(local.tokens)
    events = [decode_vqa_event(b) for b in asyncio.run(stream(_req()))]
    assert [(e.kind, e.status) for e in events] == [("error", 400)] and "text-only" in events[0].error

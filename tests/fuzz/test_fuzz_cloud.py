"""The cloud's request decoders (cloud/tasks/vla.py, vqa.py over cloud/core/protocol.py) on fuzzed requests:
a valid request with one input field or one parameter replaced by a fuzzed value, inputs added or dropped.
Each decodes or raises ProtocolError (a 4xx) naming the parameter or input; nothing else escapes. The
clients' response decoders get the same treatment (ValueError)."""
import base64
import copy

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st

from edgefm_ros.cloud.core.protocol import ProtocolError, Tensor
from edgefm_ros.cloud.tasks import vla, vqa

CAMS = ("cam1", "cam2")
LIMITS = vla.VlaLimits(camera_keys=CAMS, state_dim=3, noise_shape=(4, 2), max_side=64, max_image_bytes=4096,
                       max_task_chars=32)
VQA_LIMITS = vqa.VqaLimits(max_images=2, max_side=64, max_image_bytes=4096, max_question_chars=32, max_new_tokens=16)
leaf = (st.none() | st.booleans() | st.integers(-2 ** 64, 2 ** 64) | st.floats() | st.text(max_size=6)
        | st.binary(max_size=6) | st.sampled_from(["FP32", "BYTES", "raw", "jpeg", "uint8", "float32", "cam1"]))
values = st.recursive(leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                      max_leaves=8)


FIELDS = {"name": st.text(max_size=8) | st.sampled_from(["cam1", "cam2", "state", "task", "noise", "image_0"]),
          "datatype": st.sampled_from(["BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]),
          "shape": st.lists(st.integers(-2, 2 ** 63 - 1) | st.integers(0, 9), max_size=4),
          "parameters": st.dictionaries(st.text(max_size=12), values, max_size=3), "data": values}


def raw_image(h: int = 5, w: int = 7, seed: int = 0) -> Tensor:
    img = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Tensor("cam1", "BYTES", [1], {"image_encoding": "raw", "image_dtype": "uint8", "image_shape": [h, w, 3]},
                  [base64.b64encode(img.tobytes()).decode()])


def vla_request() -> tuple[dict, list[Tensor]]:
    params = {"stamp": 12.5, "dt": 0.02, "seq": 3, "deadline_s": 0.5, "missing": []}
    inputs = [Tensor("state", "FP32", [3], {}, [0.1, -0.2, 0.3]), Tensor("task", "BYTES", [1], {}, ["pick it"]),
              raw_image(), raw_image(3, 4, 1)._replace(name="cam2"), Tensor("noise", "FP32", [4, 2], {}, [0.0] * 8)]
    if hasattr(vla, "RTC_PREFIX"):  # real-time chunking's optional inputs
        inputs.append(Tensor(vla.RTC_PREFIX, "FP32", [2, 2], {}, [0.5, -0.5, 0.25, 0.0]))
        params[vla.RTC_DELAY] = 1
    return params, inputs


def vqa_request() -> tuple[dict, list[Tensor]]:
    params = {"max_new_tokens": 8, "temperature": 0.5, "top_k": 4, "top_p": 0.9, "seed": 1, "deadline_s": 2.0}
    inputs = [Tensor("question", "BYTES", [1], {}, ["what is red?"]), Tensor("system", "BYTES", [1], {}, ["be brief"]),
              raw_image()._replace(name="image_0")]
    return params, inputs


@st.composite
def mutation(draw, base):
    params, inputs = copy.deepcopy(base())
    how = draw(st.sampled_from(["param", "param", "field", "field", "image_param", "drop", "add", "none"]))
    named = None
    if how == "param":
        named = draw(st.sampled_from(sorted(params) + ["stamp", "other"]))
        params[named] = draw(values)
    elif how in ("field", "image_param") and inputs:
        i = draw(st.integers(0, len(inputs) - 1))
        named = inputs[i].name
        if how == "field":  # typed as the server library (MLServer's pydantic request) delivers them
            field = draw(st.sampled_from(["datatype", "shape", "data", "parameters", "name"]))
            inputs[i] = inputs[i]._replace(**{field: draw(FIELDS[field])})
            if field == "name":
                named = None  # an input renamed: the message names the new or the missing one
        else:
            p = dict(inputs[i].parameters)
            p[draw(st.sampled_from(["image_encoding", "image_dtype", "image_shape"]))] = draw(values)
            inputs[i] = inputs[i]._replace(parameters=p)
    elif how == "drop" and inputs:
        inputs.pop(draw(st.integers(0, len(inputs) - 1)))
    elif how == "add":
        inputs.append(Tensor(draw(st.sampled_from(["cam1", "cam3", "state", "image_1", "image_7", "x"])), "BYTES", [1],
                             {}, [draw(st.text(max_size=8))]))
    return params, inputs, how, named


def check_refusal(e: ProtocolError, named) -> None:
    assert 400 <= e.status < 500 and str(e)
    if named is not None:
        assert repr(named) in str(e) or named in str(e), (named, str(e))


@given(case=mutation(vla_request))
def test_fuzz_vla_request(case):
    params, inputs, how, named = case
    try:
        req = vla.decode_request("r1", params, inputs, LIMITS)
    except ProtocolError as e:
        event(f"refused ({how})")
        check_refusal(e, named)
        return
    assert req.obs.state.shape == (3,) and req.obs.state.dtype == np.float32
    assert set(req.obs.images) <= set(CAMS) and req.obs.task.strip()
    for img in req.obs.images.values():
        assert img.ndim == 3 and max(img.shape) <= 64


@given(case=mutation(vqa_request))
def test_fuzz_vqa_request(case):
    params, inputs, how, named = case
    try:
        req = vqa.decode_vqa_request("r1", params, inputs, VQA_LIMITS)
    except ProtocolError as e:
        event(f"refused ({how})")
        check_refusal(e, named)
        return
    assert req.question.strip() and 1 <= req.max_new_tokens <= 16 and len(req.images) <= 2


outputs = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["actions", "answer", "tokens", "x"]),
                                          "shape": values | st.lists(st.integers(-1, 5), max_size=3),
                                          "data": values | st.lists(st.floats(width=32), max_size=12),
                                          "datatype": values}), max_size=3)
event_params = st.dictionaries(st.sampled_from(["event", "status", "error", "delta", "text", "tokens", "x"]),
                               values | st.sampled_from(["delta", "final", "error"]) | st.integers(300, 600), max_size=4)


@given(body=values | st.dictionaries(st.sampled_from(["outputs", "parameters", "id"]),
                                     values | outputs | event_params, max_size=3))
def test_fuzz_response_decoders(body):
    """What a client reads from a server (or from anything answering at its address)."""
    decoders = [vla.decode_response, vqa.decode_vqa_response] + ([vqa.decode_vqa_event]
                                                                   if hasattr(vqa, "decode_vqa_event") else [])
    for decode in decoders:
        try:
            decode(body)
        except ValueError:
            event("refused")

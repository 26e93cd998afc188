"""Our safetensors parser (runtime/safetensors_mmap.py) on corrupted headers: each file either loads, with
every tensor inside the file, or raises SafetensorsError naming the bad value; nothing else escapes."""
import json
import struct

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from edgefm_ros.runtime.safetensors_mmap import DTYPES, MAX_HEADER, MappedSafetensors, SafetensorsError


def write(path, header, data: bytes = b"", length: int | None = None) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One file path every example of a module rewrites (a fresh directory per example costs more than the parse)."""
    return tmp_path_factory.mktemp("fuzz") / "x.safetensors"


def entry(shape, offsets, dtype="F32"):
    return {"t": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}


@pytest.mark.parametrize("shape,offsets,bad", [
    ([-1, -4], [0, 16], "-1"),  # numel 4 > 0: torch would refuse the view
    ([2 ** 62, 2 ** 62, 0], [0, 0], str(2 ** 62)),  # zero bytes, but torch's size computation overflows
    ([2.5, 2], [0, 16], "2.5"),  # was read as (2, 2)
    ([True, 4], [0, 16], "True"),  # was read as (1, 4)
    ([4], [0, 2 ** 70], str(2 ** 70)),  # offsets out of range
    ([4], [8, 24], "[8, 24)"),  # end past the data
    ([4], [16, 0], "[16, 0)"),  # start after end
    ([4], [0.0, 16], "0.0"),
    ("4", [0, 16], "'4'"),
    ([4], [0, 16, 32], "[0, 16, 32]"),
])
def test_bad_shapes_and_offsets_are_named(tmp_path, shape, offsets, bad):
    p = tmp_path / "x.safetensors"
    write(p, entry(shape, offsets), bytes(16))
    with pytest.raises(SafetensorsError, match="corrupted") as e:
        MappedSafetensors(p)
    assert bad in str(e.value) and "'t'" in str(e.value)


@pytest.mark.parametrize("length", [2 ** 64 - 1, 2 ** 63, MAX_HEADER + 1, 40])
def test_header_length_beyond_the_file_is_refused_before_reading(tmp_path, length):
    p = tmp_path / "x.safetensors"
    write(p, b"{}" + bytes(20), length=length)
    with pytest.raises(SafetensorsError, match=f"header length {length}"):
        MappedSafetensors(p)


def test_a_valid_file_still_loads(tmp_path):
    p = tmp_path / "x.safetensors"
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    write(p, {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [24, 24]}, "__metadata__": {"k": "v"}},
          a.numpy().tobytes())
    f = MappedSafetensors(p)
    assert torch.equal(f.get("a"), a) and f.get("e").shape == (0, 5) and f.metadata == {"k": "v"}


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=6),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
                           max_leaves=12)
dims = st.one_of(st.integers(-3, 2 ** 64), st.integers(0, 6), st.floats(allow_nan=True), st.booleans(), st.text(max_size=2))
entries = st.fixed_dictionaries({
    "dtype": st.sampled_from(sorted(DTYPES) + ["F8", "", "f32"]) | json_values,
    "shape": st.lists(dims, max_size=4) | json_values,
    "data_offsets": st.lists(st.integers(-2, 2 ** 64) | st.integers(0, 64) | json_values, max_size=3) | json_values,
}, optional={"extra": json_values})


@given(header=st.dictionaries(st.text(max_size=4), entries | json_values, max_size=4),
       metadata=st.none() | json_values, data=st.binary(max_size=96), length_delta=st.integers(-4, 4) | st.just(0))
def test_fuzz_header(scratch, header, metadata, data, length_delta):
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    p = scratch
    write(p, raw, data, length=max(len(raw) + length_delta, 0))
    try:
        f = MappedSafetensors(p)
    except SafetensorsError as e:
        event("refused")
        assert str(p) in str(e) and "corrupted" in str(e)
        return
    for key in f.keys():  # everything accepted is a view inside the file with the declared shape
        t = f.get(key)
        dtype, shape, offset, nbytes = f.entries[key]
        assert t.shape == shape and t.dtype == dtype and offset + nbytes <= p.stat().st_size


@given(blob=st.binary(max_size=200))
def test_fuzz_raw_bytes(scratch, blob):
    p = scratch
    p.write_bytes(blob)
    try:
        f = MappedSafetensors(p)
    except SafetensorsError:
        event("refused")
        return
    for key in f.keys():
        f.get(key)


@st.composite
def near_valid(draw):
    """A valid header of 1-3 tensors, then one field of one entry replaced by a fuzzed value (or none)."""
    header, offset = {}, 0
    for i in range(draw(st.integers(1, 3))):
        dt = draw(st.sampled_from(sorted(DTYPES)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        n = torch.empty((), dtype=DTYPES[dt]).element_size()
        for d in shape:
            n *= d
        header[f"t{i}"] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    victim = draw(st.sampled_from(sorted(header)))
    field = draw(st.sampled_from(["none", "dtype", "shape", "data_offsets", "dim", "offset"]))
    e = header[victim]
    if field in ("dtype", "shape", "data_offsets"):
        e[field] = draw(json_values)
    elif field == "dim" and e["shape"]:
        e["shape"][draw(st.integers(0, len(e["shape"]) - 1))] = draw(dims)
    elif field == "offset":
        e["data_offsets"][draw(st.integers(0, 1))] = draw(st.integers(-2, 2 ** 64) | st.floats() | st.booleans())
    return header, offset, field


@given(case=near_valid(), slack=st.integers(-8, 8))
def test_fuzz_near_valid_headers(scratch, case, slack):
    header, size, field = case
    p = scratch
    write(p, header, bytes(max(size + slack, 0)))
    try:
        f = MappedSafetensors(p)
    except SafetensorsError as e:
        event("refused")
        assert "corrupted" in str(e)
        assert field != "none" or slack < 0, f"a valid header was refused: {e}"
        return
    for key, e in header.items():
        t = f.get(key)
        assert list(t.shape) == e["shape"] and t.dtype == DTYPES[e["dtype"]]

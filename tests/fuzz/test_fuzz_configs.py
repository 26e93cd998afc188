"""Dispatch tables, skill manifests, router configs and router logs from outside: the shipped files with one
value replaced by a fuzzed one (or fuzzed whole). Each either parses or raises the documented error
(DispatchError, SkillError, ValueError) naming where it is; no TypeError, KeyError or AttributeError escapes."""
import copy
import json
from pathlib import Path

import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from edgefm_ros.routing.config import router_config_from_dict
from edgefm_ros.routing.log import read_log, record_from_dict
from edgefm_ros.dispatch.table import TABLE_DIR, DispatchError, load_table, parse_records
from edgefm_ros.dispatch.skills import SkillError, builtin_dir, load_skill, parse_skill

ROOT = Path(__file__).resolve().parents[2]
leaf = (st.none() | st.booleans() | st.integers(-2 ** 65, 2 ** 65) | st.floats() | st.text(max_size=8)
        | st.sampled_from(["exact", "fast", "decode", "linear", "bf16", "cpu_x86_avx512", "*", ""]))
values = st.recursive(leaf, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6) | st.integers(), kids,
                                                                                        max_size=3), max_leaves=8)


def paths(doc, prefix=()):
    """Every (path, value) of a nested dict/list document, containers included."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


def mutated(doc, draw):
    """``doc`` with one node (picked by ``draw``) replaced, deleted or given an extra key."""
    doc = copy.deepcopy(doc)
    spots = [p for p, _ in paths(doc) if p]
    where = draw(st.sampled_from(spots))
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    how = draw(st.sampled_from(["replace", "replace", "delete", "extra"]))
    if how == "replace":
        parent[where[-1]] = draw(values)
    elif how == "delete":
        del parent[where[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=5) | st.integers())] = draw(values)
    return doc


def shipped(path: Path):
    return yaml.safe_load(path.read_text())


TABLES = [shipped(TABLE_DIR / n) for n in ("reference.yaml", "exact.yaml", "fast.yaml")]
SKILLS = [(p, shipped(p)) for p in sorted(builtin_dir().glob("*.yaml"))]
ROUTER = shipped(ROOT / "config" / "router.yaml")


@given(data=st.data())
def test_fuzz_dispatch_tables(data):
    doc = data.draw(st.sampled_from(TABLES).map(lambda d: mutated(d, data.draw)) | values)
    try:
        parse_records(doc, "fuzz.yaml")
    except DispatchError as e:
        event("refused")
        assert "fuzz.yaml" in str(e) or "record" in str(e)


@given(data=st.data())
def test_fuzz_skill_manifests(data):
    path, doc = data.draw(st.sampled_from(SKILLS))
    doc = data.draw(st.just(doc).map(lambda d: mutated(d, data.draw)) | values)
    try:
        parse_skill(doc, path)
    except SkillError as e:
        event("refused")
        assert str(path) in str(e) or path.name in str(e)


@given(data=st.data())
def test_fuzz_router_config(data):
    doc = data.draw(st.just(ROUTER).map(lambda d: mutated(d, data.draw)) | values)
    try:
        router_config_from_dict(doc)
    except ValueError as e:
        event("refused")
        assert str(e)



def a_record():
    from edgefm_ros.routing.features import FEATURE_NAMES

    return {"request_id": "r1", "candidate": "edge", "features": {n: 0.5 for n in FEATURE_NAMES}, "quality": 0.9,
            "latency_s": 0.2, "placement": "edge", "served": True, "bandwidth_mbps": None}


@given(data=st.data())
def test_fuzz_router_log_records(data):
    d = data.draw(st.just(a_record()).map(lambda d: mutated(d, data.draw)) | values)
    try:
        record_from_dict(d, "fuzz:1")
    except ValueError as e:
        event("refused")
        assert "fuzz:1" in str(e)


@given(lines=st.lists(st.binary(max_size=40) | st.just(json.dumps(a_record()).encode()), max_size=4))
def test_fuzz_router_log_files(tmp_path_factory, lines):
    p = tmp_path_factory.mktemp("log") / "log.jsonl"
    p.write_bytes(b"\n".join(l.replace(b"\n", b" ") for l in lines))
    try:
        records = read_log(p)
    except ValueError as e:
        event("refused")
        assert str(p) in str(e) or "log record" in str(e)
        return
    assert all(r.candidate == "edge" for r in records)


@given(blob=st.binary(max_size=120) | st.text(max_size=120).map(str.encode)
       | st.sampled_from(TABLES).map(lambda d: yaml.safe_dump(d).encode()), cut=st.integers(0, 400))
def test_fuzz_table_and_manifest_files(tmp_path_factory, blob, cut):
    """Whole files, bytes cut or invented: YAML and UTF-8 errors included, each is the documented error."""
    path = tmp_path_factory.mktemp("yaml") / "t.yaml"
    path.write_bytes(blob[:cut])
    refused = []
    try:
        load_table(path)
    except DispatchError as e:
        refused.append("table")
        assert "t.yaml" in str(e)
    try:
        load_skill(path)
    except SkillError as e:
        refused.append("manifest")
        assert "t.yaml" in str(e)
    if refused:
        event(f"refused ({' and '.join(refused)})")

"""One Mode and one resolver builder (dispatch/modes.py, dispatch/resolver.py) for every engine and the tuner."""
import pytest
import yaml

from edgefm_ros.dispatch import resolver as resolver_mod
from edgefm_ros.dispatch import skills
from edgefm_ros.dispatch.table import builtin_tables
from edgefm_ros.runtime.engine import EngineConfig
from edgefm_ros.generation.generate import LlmEngineConfig
from edgefm_ros.dispatch.modes import MODES, TUNABLE, check_mode
from edgefm_ros.dispatch.resolver import build_resolver

HW = "cpu_x86_avx512_bf16"


def test_every_mode_check_names_the_bad_value_and_the_modes():
    assert MODES == ("exact", "fast", "reference") and TUNABLE == ("exact", "fast")
    for make in (lambda m: EngineConfig(mode=m), lambda m: LlmEngineConfig(mode=m), builtin_tables, check_mode):
        with pytest.raises(ValueError, match=r"must be one of \['exact', 'fast', 'reference'\], got 'turbo'"):
            make("turbo")
    with pytest.raises(ValueError, match="tune mode must be one of \\['exact', 'fast'\\], got 'reference'"):
        check_mode("reference", TUNABLE, "tune mode")


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    path = tmp_path / f"{HW}.yaml"
    path.write_text(yaml.safe_dump({"records": [{"hw_profile": HW, "op_kind": "rms_norm", "impl_id": "ref"}]}))
    monkeypatch.setattr(resolver_mod, "tuned_table_path", lambda hw: path)
    return path


@pytest.mark.parametrize("mode", MODES)
def test_tables_in_load_order(mode, tuned, tmp_path):
    user = tmp_path / "user.yaml"
    user.write_text(yaml.safe_dump([{"op_kind": "rope", "impl_id": "ref"}]))
    r = build_resolver(mode, HW, "m", lambda role: "prefill", tables=[user])
    mode_skills = skills.tables_for(HW, mode=mode) if mode != "reference" else []
    want = builtin_tables(mode) + mode_skills + ([tuned] if mode == "fast" else []) + [user]
    assert list(r.files) == want
    assert r.tuned == (tuned if mode == "fast" else None)
    # the fallback is the same tables without the tuned one, and only exists when a tuned table was loaded
    assert (r.fallback is not None) == (mode == "fast")
    if r.fallback is not None:
        assert len(r.fallback.records) == len(r.table.records) - 1
    assert build_resolver(mode, HW, "m", lambda role: "prefill", use_tuned=False).tuned is None


def test_restaged_shares_the_tables_not_the_record_of_what_resolved(tuned):
    base = build_resolver("fast", HW, "m", lambda role: "prefill")
    dec = base.restaged(lambda role: "decode")
    assert dec.table is base.table and dec.fallback is base.fallback and dec.files == base.files
    assert dec.stage_of("x") == "decode" and dec.resolved is not base.resolved

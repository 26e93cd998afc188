"""Skill manifests: the shipped ones validate; every malformed field is rejected naming the file and value."""
import copy

import pytest
import yaml

from edgefm_ros.dispatch import skills
from edgefm_ros.dispatch.table import Table, builtin_tables

GOOD = {
    "skill": "cpu-test", "version": 2, "summary": "a test skill", "device": "cpu",
    "hw_profiles": ["cpu_x86_avx512_bf16"], "requires": [],
    "impls": [{"op_kind": "linear", "impl_id": "bf16"}],
    "records": [{"hw_profile": "cpu_x86", "op_kind": "linear", "layer_role": "vlm_qkv", "impl_id": "bf16"}],
}


def write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_skills_validate_and_target_their_devices():
    found = {s.name: s for s in skills.discover()}
    assert {"cuda-bf16", "cuda-flashinfer", "cuda-triton", "cuda-sm90-fp8", "cpu-avx512-exact"} <= set(found)
    for s in found.values():
        if s.device == "cuda":
            assert s.matches("cuda_sm90") and not s.matches("cpu_x86_avx512_bf16") and s.modes == ("fast",)
    panel = found["cpu-avx512-exact"]
    assert panel.modes == ("exact",) and panel.native == ("panel_gemm", "cpu_rows", "attention")
    assert panel.matches("cpu_x86_avx512_bf16") and panel.matches("cpu_x86_avx512")
    assert not panel.matches("cpu_x86_avx2") and not panel.matches("cuda_sm90")


def test_skills_load_only_in_their_modes(tmp_path):
    p = write(tmp_path, {**GOOD, "impls": [{"op_kind": "linear", "impl_id": "fused"}],
                         "records": [{"hw_profile": "cpu_x86", "op_kind": "linear", "impl_id": "fused"}],
                         "modes": ["exact"]})
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path], mode="exact") == [p]
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path], mode="fast") == []


def test_native_requirement_that_cannot_build_keeps_the_skill_out(tmp_path):
    write(tmp_path, {**GOOD, "native": ["no_such_kernel_xyz"]})
    assert "no_such_kernel_xyz" in skills.load_skill(tmp_path / "s.yaml").missing()
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path]) == []


def test_a_valid_manifest_is_also_a_table(tmp_path):
    p = write(tmp_path, GOOD)
    s = skills.load_skill(p)
    assert s.matches("cpu_x86_avx512_bf16") and s.missing() is None
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path]) == [p]
    assert skills.tables_for("cpu_arm64_neon", [tmp_path]) == []
    tbl = Table.from_files(builtin_tables("exact") + [p])
    from edgefm_kernels.registry import OpSpec
    spec = OpSpec("linear", "x", "vlm_qkv", "prefill", "", "cpu_x86_avx512_bf16")
    assert tbl.lookup(spec).impl_id == "bf16"


@pytest.mark.parametrize("change,message", [
    ({"skill": "Bad Name"}, "skill name"),
    ({"version": 0}, "version"),
    ({"version": "1"}, "version"),
    ({"device": "tpu"}, "device"),
    ({"hw_profiles": ["cuda_sm90"]}, "not a cpu profile"),
    ({"hw_profiles": []}, "empty"),
    ({"hw_profiles": "cpu_x86"}, "list of strings"),
    ({"impls": [{"op_kind": "linear", "impl_id": "nope"}]}, "nope"),
    ({"impls": [{"op_kind": "conv", "impl_id": "x"}]}, "conv"),
    ({"impls": [{"op": "linear"}]}, "impls must be"),
    ({"records": []}, "at least one record"),
    ({"records": [{"hw_profile": "cpu_x86", "op_kind": "linear", "impl_id": "int8_dyn"}]}, "not among"),
    ({"records": [{"op_kind": "linear", "impl_id": "bf16"}]}, "outside the skill"),
    ({"records": [{"hw_profile": "cuda", "op_kind": "linear", "impl_id": "bf16"}]}, "outside the skill"),
    ({"records": [{"hw_profile": "cpu", "op_kind": "linear", "impl_id": "bf16", "stage": "later"}]}, "stage"),
    ({"default": "yes"}, "default"),
    ({"extra": 1}, "unknown field"),
    ({"modes": ["turbo"]}, "mode 'turbo'"),
    ({"modes": ["exact"]}, "exact mode takes fp32 impls only"),
    ({"native": "panel_gemm"}, "native must be a list"),
])
def test_malformed_manifests_are_rejected(tmp_path, change, message):
    data = copy.deepcopy(GOOD)
    data.update(change)
    p = write(tmp_path, data)
    with pytest.raises(skills.SkillError, match=message) as e:
        skills.load_skill(p)
    assert str(p) in str(e.value)


def test_missing_fields_and_bad_yaml(tmp_path):
    data = dict(GOOD)
    del data["records"]
    with pytest.raises(skills.SkillError, match="missing field"):
        skills.load_skill(write(tmp_path, data))
    bad = tmp_path / "bad.yaml"
    bad.write_text("skill: [unclosed")
    with pytest.raises(skills.SkillError, match="not valid YAML"):
        skills.load_skill(bad)


def test_requirements_and_requested_names(tmp_path):
    data = {**GOOD, "requires": ["no_such_module_xyz"]}
    write(tmp_path, data)
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path]) == []
    with pytest.raises(skills.SkillError, match="no_such_module_xyz"):
        skills.tables_for("cpu_x86_avx512_bf16", [tmp_path], names=("cpu-test",))
    with pytest.raises(skills.SkillError, match="unknown skill"):
        skills.tables_for("cpu_x86_avx512_bf16", [tmp_path], names=("other",))


def test_opt_in_skills_load_only_by_name(tmp_path):
    p = write(tmp_path, {**GOOD, "default": False})
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path]) == []
    assert skills.tables_for("cpu_x86_avx512_bf16", [tmp_path], names=("cpu-test",)) == [p]


def test_duplicate_names_are_rejected(tmp_path):
    write(tmp_path, GOOD, "a.yaml")
    write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(skills.SkillError, match="more than once"):
        skills.discover([tmp_path])

"""The operator table: wildcards, specificity order, hw prefixes, later-wins ties, build-time errors."""
import pytest
import yaml

from edgefm_kernels.registry import OpSpec

from edgefm_ros.dispatch.table import DispatchError, OpResolver, Record, Table, builtin_tables, parse_records


def S(**kw):
    base = dict(op_kind="linear", op_name="vlm.layers.3.self_attn.qkv", layer_role="vlm_qkv", stage="prefill",
                shape_sig="960->960+320+320", hw_profile="cpu_x86_avx512_bf16", model="smolvla")
    base.update(kw)
    return OpSpec(**base)


def table(*recs):
    return Table(parse_records([dict(r) for r in recs], "test.yaml"))


def pick(tbl, spec=None):
    return tbl.lookup(spec or S()).impl_id


def test_wildcards_match_everything():
    assert pick(table({"op_kind": "linear", "impl_id": "ref"})) == "ref"
    assert pick(table({"op_kind": "*", "impl_id": "fused", "model": "", "stage": "*"})) == "fused"


@pytest.mark.parametrize("specific,general", [
    ({"op_name": "vlm.layers.3.self_attn.qkv"}, {"layer_role": "vlm_qkv", "shape_sig": "960->960+320+320",
                                                 "stage": "prefill", "hw_profile": "cpu_x86_avx512_bf16"}),
    ({"layer_role": "vlm_qkv"}, {"shape_sig": "960->960+320+320", "stage": "prefill", "model": "smolvla"}),
    ({"shape_sig": "960->960+320+320"}, {"stage": "prefill", "hw_profile": "cpu_x86_avx512_bf16"}),
    ({"stage": "prefill"}, {"hw_profile": "cpu_x86_avx512_bf16", "model": "smolvla"}),
    ({"hw_profile": "cpu_x86_avx512_bf16"}, {"hw_profile": "cpu_x86"}),  # exact beats prefix
    ({"hw_profile": "cpu"}, {"model": "smolvla"}),
    ({"model": "smolvla"}, {}),
])
def test_priority_order(specific, general):
    """A higher-priority field outranks any number of lower-priority ones, in either file order."""
    a = {"op_kind": "linear", "impl_id": "bf16", **specific}
    b = {"op_kind": "linear", "impl_id": "fused", **general}
    assert pick(table(a, b)) == "bf16"
    assert pick(table(b, a)) == "bf16"


def test_tie_goes_to_the_later_record():
    a = {"op_kind": "linear", "layer_role": "vlm_qkv", "impl_id": "fused"}
    b = {"op_kind": "linear", "layer_role": "vlm_qkv", "impl_id": "bf16"}
    assert pick(table(a, b)) == "bf16" and pick(table(b, a)) == "fused"


def test_user_table_overrides_builtin(tmp_path):
    user = tmp_path / "user.yaml"
    builtin = Table.from_files(builtin_tables("exact"))
    rec = builtin.lookup(S())  # the built-in choice for this op
    same = {k: getattr(rec, k) for k in ("model", "hw_profile", "op_kind", "layer_role", "op_name", "stage", "shape_sig")
            if getattr(rec, k)}
    user.write_text(yaml.safe_dump({"records": [{**same, "impl_id": "int8_dyn"}]}))
    assert rec.impl_id != "int8_dyn"
    assert Table.from_files(builtin_tables("exact") + [user]).lookup(S()).impl_id == "int8_dyn"


@pytest.mark.parametrize("rec", [
    {"op_kind": "linear", "layer_role": "expert_qkv"},
    {"op_kind": "linear", "stage": "decode"},
    {"op_kind": "linear", "hw_profile": "cuda"},
    {"op_kind": "linear", "hw_profile": "cpu_x86_avx512_bf16_amx"},  # longer than the profile: no match
    {"op_kind": "linear", "hw_profile": "cpu_x8"},  # prefixes are whole `_` components
    {"op_kind": "attention"},
    {"op_kind": "linear", "model": "pi0"},
])
def test_non_matching_fields(rec):
    tbl = table({"op_kind": "linear", "impl_id": "ref"}, {**rec, "impl_id": "fused" if rec["op_kind"] == "linear" else "sdpa"})
    assert pick(tbl) == "ref"


def test_errors_name_the_record():
    with pytest.raises(DispatchError, match="no_such_kernel"):
        table({"op_kind": "linear", "impl_id": "no_such_kernel"})
    with pytest.raises(DispatchError, match="stage 'warmup'"):
        table({"op_kind": "linear", "impl_id": "ref", "stage": "warmup"})
    with pytest.raises(DispatchError, match="unknown field"):
        table({"op_kind": "linear", "impl_id": "ref", "layer": "x"})
    with pytest.raises(DispatchError, match="no impl_id"):
        table({"op_kind": "linear"})
    with pytest.raises(DispatchError, match="no record matches"):
        table({"op_kind": "mlp", "impl_id": "ref"}).lookup(S())


def test_rejected_impl_is_a_build_error_not_a_fallback():
    """A record whose impl refuses the hardware fails when the op is built, quoting the record."""
    tbl = table({"op_kind": "linear", "impl_id": "ref"},
                {"op_kind": "linear", "hw_profile": "cuda", "impl_id": "fused", "impl_params": {"backend": "mkl"}})
    with pytest.raises(DispatchError, match="mkl") as e:
        tbl.resolve(S(hw_profile="cuda_sm90"))
    assert "from test.yaml#1" in str(e.value)
    with pytest.raises(DispatchError, match="parameter"):
        table({"op_kind": "linear", "impl_id": "fused", "impl_params": {"blocks": 4}}).resolve(S())


def test_a_tuned_record_that_cannot_serve_here_is_overruled_not_fatal():
    """The tuned table is measurements from some machine: a record of it that rejects this hardware gives
    way to the untuned tables (reason kept); the same record from a built-in or user table stays an error."""
    import torch

    base = [{"op_kind": "linear", "impl_id": "ref"}]
    tuned = {"op_kind": "linear", "layer_role": "vlm_qkv", "impl_id": "fused", "impl_params": {"backend": "mkl"}}
    stage = lambda role: "prefill"  # noqa: E731
    w = [(torch.randn(8, 4), None)]
    res = OpResolver(table(*base, tuned), "cuda_sm90", "smolvla", stage, fallback=table(*base))
    kern = res.linear("vlm.layers.0.qkv", "vlm_qkv", w)
    assert kern(torch.randn(2, 4)).shape == (2, 8)
    (row,) = res.plan_rows()
    assert row["impl_id"] == "ref" and len(res.overruled) == 1 and "mkl" in res.overruled[0]
    with pytest.raises(DispatchError, match="mkl"):
        OpResolver(table(*base, tuned), "cuda_sm90", "smolvla", stage).linear("vlm.layers.0.qkv", "vlm_qkv", w)
    bad_base = [{"op_kind": "linear", "impl_id": "fused", "impl_params": {"backend": "mkl"}}]
    with pytest.raises(DispatchError, match="mkl"):  # the fallback's own record rejects too: its error
        OpResolver(table(*bad_base, tuned), "cuda_sm90", "smolvla", stage,
                   fallback=table(*bad_base)).linear("vlm.layers.0.qkv", "vlm_qkv", w)


def test_resolver_builds_once_and_records_the_plan():
    import torch

    tbl = Table.from_files(builtin_tables("fast"))
    res = OpResolver(tbl, "cpu_x86_avx512_bf16_amx", "smolvla", lambda role: "decode" if role.startswith("expert") else "prefill")
    w = [(torch.randn(8, 4), None), (torch.randn(4, 4), None)]
    kern = res.linear("expert.layers.0.qkv", "expert_self_qkv", w)
    q, k = kern(torch.randn(2, 4))
    assert q.shape == (2, 8) and k.shape == (2, 4)
    (row,) = res.plan_rows()
    assert row["stage"] == "decode" and row["shape_sig"] == "4->8+4" and row["impl_id"] == "bf16"


@pytest.mark.parametrize("mode", ["reference", "exact", "fast"])
@pytest.mark.parametrize("hw", ["cpu_x86_avx512_bf16_amx", "cpu_x86_avx512_bf16", "cpu_x86_avx512_vnni", "cpu_x86_avx2", "cpu_arm64_neon", "cuda_sm90", "cuda_sm87"])
def test_builtin_tables_resolve_every_op_kind(mode, hw):
    """Every op kind the model uses resolves, on every profile, to an impl that accepts it."""
    tbl = Table.from_files(builtin_tables(mode))
    dims = {"attention": {"heads": 15, "kv_heads": 5, "head_dim": 64}, "linear": {"in": 960},
            "mlp": {"hidden": 960, "inner": 2560}}
    kinds = ["attention", "linear", "mlp", "rms_norm", "layer_norm", "rope", "patch_embed", "pixel_shuffle"]
    for kind in kinds + (["cast"] if mode != "reference" else []):
        for role in ("vision_x", "vlm_x", "expert_x"):
            r = tbl.resolve(S(op_kind=kind, layer_role=role, hw_profile=hw, dims=dims.get(kind, {})))
            assert r.impl.op_kind == kind


def test_fast_table_precision_follows_the_cpu():
    """bf16 GEMMs only with AMX; AVX-512 without it (AVX512-BF16 included, where oneDNN's bf16 GEMMs ran at
    half the fp32 rate) keeps fp32 activations around int8 GEMMs; AVX2 stays fp32 throughout."""
    tbl = Table.from_files(builtin_tables("fast"))
    amx = "cpu_x86_avx512_bf16_amx"
    assert tbl.lookup(S(hw_profile=amx)).impl_id == "bf16"
    assert tbl.lookup(S(op_kind="mlp", layer_role="vision_mlp", hw_profile=amx)).impl_id == "bf16"
    assert tbl.lookup(S(op_kind="cast", hw_profile=amx)).impl_id == "bf16"
    for hw in ("cpu_x86_avx512_bf16", "cpu_x86_avx512_vnni", "cpu_x86_avx512"):
        for kind, role in (("linear", "vlm_qkv"), ("mlp", "vision_mlp"), ("mlp", "expert_mlp")):
            assert tbl.lookup(S(op_kind=kind, layer_role=role, hw_profile=hw)).impl_id == "int8_dyn", (hw, role)
        assert tbl.lookup(S(op_kind="cast", hw_profile=hw)).impl_id == "fp32"
        assert tbl.lookup(S(op_kind="patch_embed", hw_profile=hw)).impl_id == "gemm"
    assert tbl.lookup(S(hw_profile="cpu_x86_avx2")).impl_id in ("ref", "fused")
    assert tbl.lookup(S(op_kind="cast", hw_profile="cpu_x86_avx2")).impl_id == "fp32"
    exact = Table.from_files(builtin_tables("exact"))
    for kind in ("linear", "mlp", "cast", "attention", "rms_norm", "layer_norm", "rope", "patch_embed"):
        rec = exact.resolve(S(op_kind=kind, dims={"heads": 4, "kv_heads": 2}))
        assert rec.impl.precision == "fp32", rec.record.quote()


def test_record_quote_names_the_source():
    r = Record(impl_id="fused", op_kind="linear", layer_role="vlm_qkv", source="t.yaml#3")
    assert "t.yaml#3" in r.quote() and "vlm_qkv" in r.quote()


ROLES = {"linear": ["vision_qkv", "vision_o", "connector_proj", "vlm_qkv", "vlm_o", "expert_self_qkv", "expert_cross_q",
                    "expert_cross_kv", "expert_o", "state_proj", "action_in_proj", "action_time_mlp", "action_out_proj"],
         "mlp": ["vision_mlp", "vlm_mlp", "expert_mlp"], "patch_embed": ["vision_patch"]}


@pytest.mark.parametrize("kind", sorted(ROLES))
@pytest.mark.parametrize("hw,want", [("cpu_x86_avx512_bf16_amx", {"linear": "bf16", "mlp": "bf16", "patch_embed": "bf16"}),
                                     ("cpu_x86_avx512_bf16", {"linear": "int8", "mlp": "int8", "patch_embed": "fp32"})])
def test_fast_mode_runs_every_gemm_role_at_the_cpus_fast_precision(kind, hw, want):
    """Role-specific exact records must not shadow the fast ones (specificity beats file order): bf16 GEMMs
    with AMX, int8 ones (fp32 activations) on AVX-512 without it."""
    tbl = Table.from_files(builtin_tables("fast"))
    for role in ROLES[kind]:
        stage = "decode" if role.startswith("expert") and role != "expert_cross_kv" else "prefill"
        r = tbl.resolve(S(op_kind=kind, layer_role=role, stage=stage, hw_profile=hw,
                          dims={"in": 960, "hidden": 960, "inner": 2560}))
        assert r.impl.precision == want[kind], f"{role}: {r.record.quote()}"

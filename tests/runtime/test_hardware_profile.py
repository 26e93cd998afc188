"""The CPU hardware profile: AMX machines are a profile of their own (the fast table's bf16 choices are
only fast there), and every profile falls back by prefix to the more general ones."""
import platform

import pytest

from edgefm_ros.dispatch import hardware
from edgefm_ros.dispatch.hardware import AMX_FLAGS, cpu_profile

AVX512 = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl"})


@pytest.mark.parametrize("extra,want", [
    (AMX_FLAGS | {"avx512_vnni"}, "cpu_x86_avx512_bf16_amx"),
    ({"avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"}, "cpu_x86_avx512_bf16"),  # no AMX-INT8
    ({"avx512_bf16", "avx512_vnni"}, "cpu_x86_avx512_bf16"),  # Zen 4/5, a VM hiding the tiles
    ({"avx512_vnni"}, "cpu_x86_avx512_vnni"),
    (frozenset(), "cpu_x86_avx512"),
])
def test_cpu_profile_from_flags(extra, want):
    assert cpu_profile("x86_64", AVX512 | extra) == want


def test_amx_tiles_without_avx512_bf16_are_not_the_amx_profile():
    assert cpu_profile("x86_64", frozenset({"avx2"}) | (AMX_FLAGS - {"avx512_bf16"})) == "cpu_x86_avx2"


def test_amx_profile_keeps_the_general_records():
    """Records written for the general profiles still select on the AMX one (prefix match), so skills and
    tables for AVX-512 need no AMX copy."""
    from edgefm_kernels.registry import OpSpec
    from edgefm_ros.dispatch.table import parse_records

    (rec,) = parse_records([{"hw_profile": "cpu_x86_avx512_bf16", "op_kind": "linear", "impl_id": "fused"}], "t")
    spec = OpSpec("linear", "x", "vlm_qkv", "prefill", "", "cpu_x86_avx512_bf16_amx")
    assert rec.specificity(spec) is not None
    assert rec.specificity(OpSpec("linear", "x", "vlm_qkv", "prefill", "", "cpu_x86_avx512_vnni")) is None


def test_detect_reports_this_machine_and_its_fingerprint_names_the_profile():
    hw = hardware.detect("cpu")
    assert hw.profile == cpu_profile(platform.machine(), hw.flags)
    assert ("amx_tile" in hw.flags and "amx_int8" in hw.flags) == hw.profile.endswith("_amx")

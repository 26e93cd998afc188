"""The edgefm-vla command-line contract: predict, bench, plan, errors."""
import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

CLI = [sys.executable, "-m", "edgefm_ros.tools.vla_cli"]


def run(*args):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("convention", ["legacy", "fixed"])
def test_predict_writes_golden_actions(tiny, goldens_by_convention, tmp_path, convention):
    """--from-raw against LeRobot 0.4.4's goldens (legacy ids) and LeRobot 0.6.1's (fixed)."""
    ckpt, vlm, gold = tiny
    want = goldens_by_convention[convention][1]
    out = tmp_path / "a.safetensors"
    r = run("predict", "--checkpoint", ckpt, "--vlm", vlm, "--inputs", gold / "inputs.safetensors", "--out", out,
            "--from-raw", "--vision-position-ids", convention)
    assert r.returncode == 0, r.stderr
    got = load_file(str(out))
    assert got["actions"].dtype.is_floating_point and got["actions"].shape == want["actions"].shape
    assert (got["actions"] - want["actions"]).abs().max() <= 1e-4
    assert (got["actions_unnormalized"] - want["actions_unnormalized"]).abs().max() <= 1e-4


def test_bench_json_fields(tiny, tmp_path):
    ckpt, vlm, gold = tiny
    js = tmp_path / "b.json"
    r = run("bench", "--checkpoint", ckpt, "--vlm", vlm, "--inputs", gold / "inputs.safetensors", "--warmup", 1,
            "--runs", 3, "--json", js)
    assert r.returncode == 0, r.stderr
    d = json.loads(js.read_text())
    for k in ("chunk_s", "prefill_s", "decode_s"):
        assert d[k]["min"] <= d[k]["median"] <= d[k]["max"] and d[k]["min"] > 0
    assert d["chunk_s"]["median"] >= d["decode_s"]["median"]
    assert d["peak_rss_mb"] > 50 and d["threads"] >= 1 and d["mode"] == "exact"
    assert d["hw_profile"].startswith(("cpu_", "cuda_"))


def test_plan_lists_every_op_once(tiny):
    ckpt, vlm, _ = tiny
    r = run("plan", "--checkpoint", ckpt, "--vlm", vlm, "--mode", "exact")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[2:]]
    names = [row[0] for row in rows]
    assert len(names) == len(set(names))
    # TINY: 2 vision layers, 4 VLM layers, 4 expert layers; each kind of op is present
    assert sum(n.startswith("vision.layers.") and n.endswith(".self_attn") for n in names) == 2
    assert "expert.layers.1.self_attn.k_proj" in names  # cross layer: K/V projection of the VLM cache
    stages = {row[0]: row[3] for row in rows}
    assert stages["expert.layers.1.self_attn.k_proj"] == "prefill"
    assert stages["expert.layers.0.self_attn"] == "decode"
    assert stages["vlm.layers.0.self_attn"] == "prefill"


def test_user_table_overrides_and_bad_record_is_named(tiny, tmp_path):
    ckpt, vlm, _ = tiny
    good = tmp_path / "good.yaml"
    good.write_text("- {op_kind: attention, layer_role: expert_cross_attn, impl_id: eager}\n")
    r = run("plan", "--checkpoint", ckpt, "--vlm", vlm, "--table", good)
    assert r.returncode == 0, r.stderr
    row = next(line.split() for line in r.stdout.splitlines() if line.startswith("expert.layers.1.self_attn "))
    assert row[5] == "eager" and "good.yaml#0" in row[-1]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {op_kind: attention, layer_role: vlm_attn, impl_id: no_such_kernel}\n")
    r = run("plan", "--checkpoint", ckpt, "--vlm", vlm, "--table", bad)
    assert r.returncode == 2
    assert "no_such_kernel" in r.stderr and "bad.yaml#0" in r.stderr


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    r = run("plan", "--checkpoint", tmp_path / "nope")
    assert r.returncode == 2
    assert "nope" in r.stderr and "Traceback" not in r.stderr


def test_every_checkpoint_command_takes_the_position_id_choice(tiny):
    ckpt, vlm, _ = tiny
    for cmd in ("predict", "bench", "plan", "tune"):
        r = run(cmd, "--help")
        assert "--vision-position-ids {auto,legacy,fixed}" in r.stdout.replace("\n", " ").replace("  ", " "), cmd
    r = run("plan", "--checkpoint", ckpt, "--vlm", vlm, "--vision-position-ids", "newest")
    assert r.returncode == 2 and "'newest'" in r.stderr

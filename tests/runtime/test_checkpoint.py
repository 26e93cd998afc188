"""Checkpoint loading: errors name the file and key; weights are memory-mapped; the HF cache is searched."""
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from edgefm_ros.runtime.checkpoint import CheckpointError, load_checkpoint
from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.safetensors_mmap import load_all


@pytest.fixture
def ckpt_copy(tiny, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(tiny[0], d, ignore=shutil.ignore_patterns("golden"))
    return d


def rewrite_weights(d, edit):
    w = load_all(d / "model.safetensors")
    edit(w)
    save_file(w, str(d / "model.safetensors"))


def test_missing_weight_named(ckpt_copy, tiny):
    key = "model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"
    rewrite_weights(ckpt_copy, lambda w: w.pop(key))
    with pytest.raises(CheckpointError, match=f"missing weight '{key}'"):
        Engine.from_checkpoint(ckpt_copy, vlm_dir=tiny[1])


def test_unexpected_weight_named(ckpt_copy, tiny):
    rewrite_weights(ckpt_copy, lambda w: w.__setitem__("model.surprise.weight", torch.randn(3)))
    with pytest.raises(CheckpointError, match="model.surprise.weight"):
        Engine.from_checkpoint(ckpt_copy, vlm_dir=tiny[1])


def test_misshaped_weight_named(ckpt_copy, tiny):
    key = "model.state_proj.weight"
    rewrite_weights(ckpt_copy, lambda w: w.__setitem__(key, torch.randn(64, 31)))
    with pytest.raises(CheckpointError, match=r"'model.state_proj.weight' has shape \[64, 31\], expected \[64, 32\]"):
        Engine.from_checkpoint(ckpt_copy, vlm_dir=tiny[1])


@pytest.mark.parametrize("corrupt", ["truncate", "header", "garbage"])
def test_corrupted_safetensors(ckpt_copy, tiny, corrupt):
    path = ckpt_copy / "model.safetensors"
    data = path.read_bytes()
    if corrupt == "truncate":
        data = data[: len(data) // 2]
    elif corrupt == "header":
        data = data[:8] + b"{not json" + data[17:]
    else:
        data = b"\xff" * 8 + data[8:]
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        Engine.from_checkpoint(ckpt_copy, vlm_dir=tiny[1])


def test_missing_stats_named(ckpt_copy, tiny):
    (ckpt_copy / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").unlink()
    with pytest.raises(CheckpointError, match="unnormalizer_processor"):
        load_checkpoint(ckpt_copy, tiny[1])


def test_unknown_backbone_named(ckpt_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(CheckpointError, match="local/smolvlm-tiny"):
        load_checkpoint(ckpt_copy)


def test_backbone_found_in_hf_cache(ckpt_copy, tiny, monkeypatch, tmp_path):
    snap = tmp_path / "hub" / "models--local--smolvlm-tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny[1], snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    ck = load_checkpoint(ckpt_copy)
    assert ck.vlm_dir == snap


def test_missing_tokenizer_named(ckpt_copy, tiny, tmp_path):
    vdir = tmp_path / "vlm"
    shutil.copytree(tiny[1], vdir)
    (vdir / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer"):
        Engine.from_checkpoint(ckpt_copy, vlm_dir=vdir)


def test_wrong_policy_type(ckpt_copy, tiny):
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["type"] = "pi0"
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'pi0'"):
        load_checkpoint(ckpt_copy, tiny[1])


def test_weights_are_memory_mapped_and_lm_head_not_loaded(tiny):
    """Reference linears hold views into the file mapping (no copy); lm_head is never touched."""
    exact_engine = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="reference")
    src = exact_engine.weights
    region = torch.frombuffer(src.file._map, dtype=torch.uint8)
    lo, hi = region.data_ptr(), region.data_ptr() + region.numel()
    w = exact_engine.model.text.layers[0].o.weights[0]  # reference linear: weight used as stored
    assert lo <= w.data_ptr() < hi
    assert lo <= exact_engine.model.text.token_embedding.data_ptr() < hi
    assert "model.vlm_with_expert.vlm.lm_head.weight" not in src.used


def test_make_checkpoint_roundtrip(tmp_path):
    """The demo's generated checkpoint is deterministic and loads through the same path."""
    import numpy as np

    from edgefm_ros.training.random_checkpoint import make_checkpoint

    a = make_checkpoint(tmp_path / "a", seed=3)
    b = make_checkpoint(tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert "RANDOM WEIGHTS" in (a / "README.md").read_text()
    engine = Engine.from_checkpoint(a)
    chunk = engine.predict(engine.synthetic_observation(1))
    assert chunk.actions.shape == (50, 6) and np.isfinite(chunk.actions).all()


def test_fast_engine_builds_past_a_tuned_record_this_machine_cannot_run(tiny, tmp_path, monkeypatch, caplog):
    """A tuned table made elsewhere (here: a GPU kernel for a CPU op) is overruled op by op, with a warning;
    the engine still builds and predicts, and the plan shows what served instead."""
    import logging

    import yaml

    from edgefm_ros.runtime import engine as engine_mod
    from edgefm_ros.dispatch import resolver as resolver_mod
    from edgefm_ros.dispatch.hardware import detect

    profile = detect("cpu").profile
    tuned = tmp_path / f"{profile}.yaml"
    tuned.write_text(yaml.safe_dump({"records": [
        {"hw_profile": profile, "op_kind": "attention", "layer_role": "expert_cross_attn", "impl_id": "flashinfer"}]}))
    monkeypatch.setattr(resolver_mod, "tuned_table_path", lambda hw: tuned)
    with caplog.at_level(logging.WARNING, logger="edgefm_ros.runtime.engine"):
        eng = engine_mod.Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="fast")
    assert tuned in eng.table_files and eng.resolver.overruled
    assert all("flashinfer" in why for why in eng.resolver.overruled)
    assert "cannot serve on this machine" in caplog.text
    rows = [r for r in eng.plan() if r["layer_role"] == "expert_cross_attn"]
    assert rows and all(r["impl_id"] != "flashinfer" and tuned.name not in r["record"] for r in rows)
    assert torch.isfinite(torch.as_tensor(eng.predict(eng.synthetic_observation()).actions)).all()


@pytest.mark.parametrize("where", ["here", "elsewhere", "unrecorded"])
def test_fast_engine_warns_when_its_tuned_table_was_measured_on_another_machine(tiny, tmp_path, monkeypatch, caplog,
                                                                               where):
    """A tuned table records the machine it timed (name, threads, fingerprint). From another machine every
    record may still serve and yet be slow here (bf16 GEMMs chosen on AMX ran at half the fp32 rate without
    it): the engine says so, naming both machines and the fix; tuned here, or with no machine recorded, it
    does not."""
    import logging

    import yaml

    from edgefm_ros.runtime import engine as engine_mod
    from edgefm_ros.dispatch import resolver as resolver_mod
    from edgefm_ros.dispatch.hardware import detect

    hw = detect("cpu")
    table = {"records": [{"hw_profile": hw.profile, "op_kind": "rms_norm", "impl_id": "ref"}]}
    if where != "unrecorded":
        table["hw"] = {"name": "Some Other CPU", "threads": 8,
                       "fingerprint": hw.fingerprint if where == "here" else "0123456789abcdef"}
    tuned = tmp_path / f"{hw.profile}.yaml"
    tuned.write_text(yaml.safe_dump(table))
    monkeypatch.setattr(resolver_mod, "tuned_table_path", lambda profile: tuned)
    with caplog.at_level(logging.WARNING, logger="edgefm_ros.runtime.engine"):
        eng = engine_mod.Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="fast")
    assert eng.resolver.tuned == tuned
    if where == "elsewhere":
        assert "Some Other CPU, 8 threads, fingerprint 0123456789abcdef" in eng.tuned_elsewhere
        assert hw.fingerprint in eng.tuned_elsewhere and "edgefm-vla tune" in eng.tuned_elsewhere
        assert "tuned on another machine" in caplog.text
    else:
        assert eng.tuned_elsewhere is None and "tuned on another machine" not in caplog.text

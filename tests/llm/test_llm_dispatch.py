"""LlmEngine resolves through the Engine's resolver builder: the mode's skills and user tables reach the
autoregressive path (a stage-specific record splits prefill and decode into two builds)."""
import torch
import yaml

from edgefm_ros.dispatch import skills
from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig, SamplingConfig


def test_llm_engine_loads_the_modes_skills_and_user_tables(tied_llama, tmp_path):
    user = tmp_path / "decode_rms.yaml"
    user.write_text(yaml.safe_dump([{"op_kind": "rms_norm", "stage": "decode", "impl_id": "ref"}]))
    eng = LlmEngine.from_dir(tied_llama[0], LlmEngineConfig(capacity=64, tables=(str(user),)))
    files = eng.resolvers["decode"].files
    here = skills.tables_for(eng.hardware.profile, mode="exact")
    assert list(files[-1 - len(here):-1]) == here and files[-1] == user  # built-ins, skills, then the user's
    impls = {s: {(r["op_kind"], r["impl_id"]) for r in eng.resolvers[s].plan_rows()} for s in ("prefill", "decode")}
    assert ("rms_norm", "ref") in impls["decode"] and ("rms_norm", "ref") not in impls["prefill"]
    assert eng.lm["decode"] is not eng.lm["prefill"]  # the stage record split the builds
    ids = torch.randint(3, 49000, (6,)).tolist()
    plain = LlmEngine.from_dir(tied_llama[0], LlmEngineConfig(capacity=64, mode="reference"))
    s = SamplingConfig(max_new_tokens=6, stop_ids=())
    assert eng.generate(ids, s).tokens == plain.generate(ids, s).tokens  # exact mode: the reference's greedy tokens

"""edgefm-llm: generate (chat, streaming, prefix, draft), prefix build, plan; errors exit non-zero."""
import json

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.tools.llm_cli import main


def test_generate_prefix_and_plan(tied_llama, engine, tmp_path, capsys):
    d = str(tied_llama[0])
    assert main(["generate", "--model", d, "--prompt", "where is the cube?", "--max-new", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = engine.generate([{"role": "user", "content": "where is the cube?"}], SamplingConfig(max_new_tokens=6))
    assert out["text"] == ref.text and out["tokens"] == len(ref.tokens) and out["stop_reason"] == ref.stop_reason
    pfile = str(tmp_path / "p.safetensors")
    assert main(["prefix", "--model", d, "--system", "You are a robot.", "--out", pfile]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["tokens"] > 3 and len(built["fingerprint"]) == 64
    assert main(["generate", "--model", d, "--system", "You are a robot.", "--prompt", "hi", "--prefix", pfile,
                 "--max-new", "3", "--json"]) == 0
    cached = json.loads(capsys.readouterr().out)
    assert cached["prefilled_tokens"] == cached["prompt_tokens"] - built["tokens"]
    assert main(["plan", "--model", d]) == 0
    plan = capsys.readouterr().out
    assert "llm.layers.0.self_attn" in plan and "kv" in plan


def test_errors_exit_nonzero(tied_llama, tmp_path, capsys):
    d = str(tied_llama[0])
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    assert main(["generate", "--model", d, "--prompt", "hi", "--prefix", str(tmp_path / "junk.safetensors")]) == 2
    assert "prefix cache" in capsys.readouterr().err
    assert main(["generate", "--model", d, "--prompt", "hi", "--max-new", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err

"""edgefm-llm: train-draft writes a compact draft file; generate --draft (chain or --tree) streams plain greedy."""
import json

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.tools.llm_cli import main


def test_train_draft_then_generate_with_chain_and_tree(tied_llama, engine, tmp_path, capsys):
    d, out = str(tied_llama[0]), str(tmp_path / "draft.safetensors")
    assert main(["train-draft", "--model", d, "--out", out, "--prompts", "4", "--val-prompts", "2", "--new-tokens",
                 "4", "--collect-batch", "3", "--collect-mode", "exact", "--steps", "2", "--batch", "2",
                 "--draft-vocab", "300", "--inner", "32"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["bytes"] > 0 and info["recipe"]["prompts"] == 4 and len(info["rank_accept"]) == 3
    ref = engine.generate([{"role": "user", "content": "where is the cube?"}], SamplingConfig(max_new_tokens=9))
    for extra in ([], ["--tree", "5", "--tree-depth", "3"]):
        assert main(["generate", "--model", d, "--prompt", "where is the cube?", "--max-new", "9", "--draft", out,
                     "--json", *extra]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["text"] == ref.text and "acceptance_length" in got
    assert main(["generate", "--model", d, "--prompt", "hi", "--draft", out, "--tree", "-2"]) == 2

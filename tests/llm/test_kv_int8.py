"""KV codecs through the dispatch table: int8 per token/head with key smoothing."""
import pytest
import torch

from edgefm_kernels.kv import Int8KV, PlainKV
from edgefm_ros.dispatch.table import DispatchError
from edgefm_ros.generation.generate import LlmEngine, LlmEngineConfig


def test_int8_roundtrip_error_and_smoothing_invariance():
    k = torch.randn(2, 3, 50, 16) + 4 * torch.randn(2, 3, 1, 16)  # channel offsets: what smoothing removes
    v = torch.randn(2, 3, 50, 16)
    q = torch.randn(2, 6, 5, 16)
    ref_out = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    errs = {}
    for smooth in (True, False):
        codec = Int8KV(smooth_keys=smooth)
        store = codec.alloc(2, 3, 64, 16, torch.float32)
        codec.write(store, k[:, :, :40], v[:, :, :40], 0)
        codec.write(store, k[:, :, 40:], v[:, :, 40:], 40)
        kk, vv = codec.read(store, 50)
        assert (vv - v).abs().max() <= v.abs().amax(-1, keepdim=True).max() / 127 * 0.51
        out = torch.nn.functional.scaled_dot_product_attention(q, kk.repeat_interleave(2, 1),
                                                               vv.repeat_interleave(2, 1))
        errs[smooth] = (out - ref_out).abs().max().item()
        assert codec.nbytes(store) < 0.3 * PlainKV().nbytes(PlainKV().alloc(2, 3, 64, 16, torch.float32))
    assert errs[True] < 0.05
    assert errs[True] < errs[False]  # smoothing the keys' channel mean reduces the error


def test_engine_int8_kv_logits_close_and_memory_smaller(tmp_path, seed, tiny_tokenizer_dir, llama_factory):
    llama_factory(tmp_path / "m", seed, True, tiny_tokenizer_dir, layers=4, init=0.05)  # trained-like scale
    engine = LlmEngine.from_dir(tmp_path / "m", LlmEngineConfig(capacity=256))
    int8 = LlmEngine.from_dir(tmp_path / "m", LlmEngineConfig(capacity=256, kv_codec="int8"))
    assert type(int8.codec).__name__ == "Int8KV" and type(engine.codec).__name__ == "PlainKV"
    ids = torch.randint(3, 49000, (40,)).tolist()
    ref, _ = engine.prefill(ids[:30], 0)
    got, _ = int8.prefill(ids[:30], 0)
    refs = [engine.forward_decode([t])[0][-1] for t in ids[30:]]
    gots = [int8.forward_decode([t])[0][-1] for t in ids[30:]]
    err = max((a - b).abs().max().item() for a, b in zip([ref] + refs, [got] + gots))
    scale = ref.abs().max().item()
    print(f"int8 KV: max logit error {err:.3g} (logit scale {scale:.3g})")
    assert 0 < err < 0.02 * scale
    assert int8.cache.nbytes() < 0.3 * engine.cache.nbytes()
    # the same choice made by a user table record
    table = tmp_path / "kv.yaml"
    table.write_text("records:\n  - {op_kind: kv, model: smollm2, impl_id: int8, impl_params: {smooth_keys: false}}\n")
    via_table = LlmEngine.from_dir(tmp_path / "m", LlmEngineConfig(capacity=32, tables=(str(table),)))
    assert isinstance(via_table.codec, Int8KV) and not via_table.codec.smooth_keys
    table.write_text("records:\n  - {op_kind: kv, impl_id: int3}\n")
    with pytest.raises(DispatchError, match="int3"):
        LlmEngine.from_dir(tmp_path / "m", LlmEngineConfig(capacity=32, tables=(str(table),)))

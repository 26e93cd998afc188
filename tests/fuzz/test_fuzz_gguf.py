"""Our GGUF reading (generation/gguf_loader.read_gguf) on corrupted files: a small valid Llama GGUF (written
here with the gguf package) with bytes overwritten, counts and lengths set huge, or cut short. Each file
reads, or raises GgufError naming the file; nothing else escapes (the gguf package's IndexError,
UnicodeDecodeError, TypeError ... are translated)."""
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from edgefm_ros.generation.gguf_loader import GgufError, read_gguf
from skips import require_module

H, HEADS, KV, INNER, VOCAB = 8, 2, 1, 16, 12


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> tuple[bytes, object]:
    gguf = require_module("gguf")  # pinned in requirements.txt: a material skip (fails in strict mode)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(INNER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges(["t 0"])
    w.add_eos_token_id(1)
    w.add_bos_token_id(0)
    rng = np.random.default_rng(0)
    hd = H // HEADS
    w.add_tensor("token_embd.weight", rng.standard_normal((VOCAB, H)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    for name, shape in [("attn_norm", (H,)), ("ffn_norm", (H,)), ("attn_q", (H, H)), ("attn_k", (KV * hd, H)),
                        ("attn_v", (KV * hd, H)), ("attn_output", (H, H)), ("ffn_gate", (INNER, H)),
                        ("ffn_up", (INNER, H)), ("ffn_down", (H, INNER))]:
        w.add_tensor(f"blk.0.{name}.weight", rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes(), path.parent / "mutated.gguf"


def test_the_valid_file_reads(valid):
    data, scratch = valid
    scratch.write_bytes(data)
    m = read_gguf(scratch)
    assert m.config.text.hidden == H and m.config.text.vocab == VOCAB and len(m.tensors) == 11


HUGE = st.sampled_from([2 ** 64 - 1, 2 ** 63, 2 ** 32, 2 ** 31 - 1, 10 ** 9, 0, 1]).map(lambda v: v.to_bytes(8, "little"))
patch = st.tuples(st.integers(0, 4095), st.binary(min_size=1, max_size=8) | HUGE)


@given(patches=st.lists(patch, min_size=1, max_size=4), cut=st.none() | st.integers(0, 4400))
def test_fuzz_corrupted_gguf(valid, patches, cut):
    data, scratch = valid
    b = bytearray(data)
    for pos, new in patches:
        pos %= len(b)
        b[pos:pos + len(new)] = new
    scratch.write_bytes(bytes(b[:cut]) if cut is not None else bytes(b))
    try:
        m = read_gguf(scratch)
    except GgufError as e:
        event("refused")
        assert str(scratch) in str(e)
        return
    assert m.config.text.hidden >= 1 and all(t.dtype.is_floating_point for t in m.tensors.values())

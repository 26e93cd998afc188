"""``edgefm-vla profile``'s accounting (dispatch/profile.py) on the TINY checkpoint: GFLOP counted per op
family against the model's shapes, times that add up to the stage, probes that leave the actions alone."""
import torch

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.dispatch.profile import OpProbe, format_rows, measure_peaks


def test_probe_counts_flops_from_the_shapes_and_times_add_up(tiny, golden_inputs, goldens, exact_engine):
    probe = OpProbe()
    engine = Engine.from_checkpoint(tiny[0], vlm_dir=tiny[1], mode="exact", vision_position_ids="legacy",
                                    probe=probe)
    noise = goldens[0]["noise"]
    actions = engine.sample(golden_inputs, noise)
    # instrumenting changes no number
    assert torch.equal(actions, exact_engine.sample(golden_inputs, noise))
    probe.reset()
    engine.sample(golden_inputs, noise)
    rows = probe.rows(engine.last_timings, {"fp32": 100.0, "bf16": 400.0})
    by = {(r["stage"], r["family"]): r for r in rows}
    v = engine.ckpt.vlm.vision
    cams, tokens = len(golden_inputs.images), golden_inputs.batch * v.grid ** 2
    qkv = by[("prefill", "linear:vision_qkv")]
    assert qkv["calls"] == cams // engine.vision_group(1, cams) * v.layers  # one call per camera batch and layer
    assert abs(qkv["gflop"] - cams * v.layers * 2 * tokens * v.hidden * 3 * v.hidden / 1e9) < 1e-9
    attn = by[("prefill", "attention:vision_attn")]
    per_image = v.grid ** 2
    assert abs(attn["gflop"] - cams * v.layers * golden_inputs.batch * 4 * per_image ** 2 * v.hidden / 1e9) < 1e-9
    assert ("decode", "mlp:expert_mlp") in by and by[("decode", "mlp:expert_mlp")]["calls"] % engine.spec.num_steps == 0
    for stage in ("prefill", "decode"):
        parts = [r for r in rows if r["stage"] == stage and r["family"] not in ("total",)]
        total = by[(stage, "total")]
        assert abs(sum(r["ms"] for r in parts) - total["ms"]) < 1e-6 or by[(stage, "glue (not in any op)")]["ms"] == 0
        assert all(r["ms"] >= 0 for r in parts)
        assert all(r["of_peak"] is None or r["of_peak"] == r["gflops"] / 100.0 for r in parts if r["dtype"] == "fp32")
    text = format_rows(rows, {"fp32": 100.0})
    assert "| prefill | attention:vision_attn | fp32 |" in text and "glue" in text


def test_measure_peaks_times_each_dtype():
    peaks = measure_peaks(n=256, repeats=2)
    assert set(peaks) <= {"fp32", "bf16", "int8"} and "fp32" in peaks
    assert all(v > 0 for v in peaks.values())

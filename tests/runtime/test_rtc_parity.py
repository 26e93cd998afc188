"""RTC parity with LeRobot 0.4.4: SmolVLA's sample_actions with its RTCProcessor (LeRobot's guidance form)
on the TINY reference checkpoint and goldens, for every schedule, several delays, horizons, guidance caps and
prefix lengths/widths (tests/runtime/data/lerobot044_rtc_tiny.safetensors, made by
scripts/lerobot_rtc_goldens.py in the LeRobot environment). Our guided decode matches within 1e-4."""
import dataclasses
from pathlib import Path

import pytest

from edgefm_ros.runtime.engine import Engine
from edgefm_ros.runtime.rtc_guidance import SCHEDULES, RtcConfig, rtc_inputs
from edgefm_ros.runtime.safetensors_mmap import load_all

DATA = Path(__file__).resolve().parent / "data" / "lerobot044_rtc_tiny.safetensors"


@pytest.fixture(scope="module")
def lerobot_rtc():
    d = load_all(DATA)
    assert [chr(int(c)) for c in d["schedules"]] == [s[0] for s in SCHEDULES]  # same schedule order
    return d


@pytest.mark.parametrize("case", range(6))
def test_guided_chunk_matches_lerobot(exact_engine, golden_inputs, lerobot_rtc, case):
    d = lerobot_rtc
    delay, horizon, schedule, beta = d[f"meta.{case}"].tolist()
    cfg = RtcConfig(schedule=SCHEDULES[int(schedule)], max_guidance_weight=float(beta), execution_horizon=int(horizon))
    e = Engine(exact_engine.ckpt, dataclasses.replace(exact_engine.config, rtc=cfg), exact_engine.hardware)
    mc = e.model_config
    prefix = e.prefill(golden_inputs)
    rtc = rtc_inputs(d[f"prev.{case}"], int(delay), cfg, mc.chunk_size, mc.max_action_dim)
    got = e.decode(prefix, d[f"noise.{case}"], rtc=rtc)
    want = d[f"actions.{case}"]
    err = (got - want).abs().max().item()
    assert err <= 1e-4, f"case {case} ({cfg}, delay {int(delay)}): max |ours - LeRobot| = {err:.2e}"
    # the guidance did something: the unguided chunk is further away
    free = e.decode(prefix, d[f"noise.{case}"])
    assert (free - want).abs().max().item() > 100 * max(err, 1e-7)


def test_full_guided_chunk_matches_lerobot():
    """FULL (random-weight SmolVLM2-500M SmolVLA, the harness's checkpoint; opt-in like test_full_parity.py):
    LeRobot 0.4.4's guided chunk from scripts/lerobot_rtc_goldens.py --variant full, within 1e-4."""
    from edgefm_ros.runtime.preprocess import ModelInputs
    from skips import require_material, require_opt_in

    h = require_opt_in("EDGEFM_LEROBOT_HARNESS", "FULL goldens come from LeRobot's harness, 1.8 GB")
    art = h / "artifacts" / "full"
    data = art / "golden-rtc" / "rtc.safetensors"
    require_material(data.is_file(), f"no {data}: run scripts/lerobot_rtc_goldens.py --harness {h} --variant full "
                                     f"--out {data} with the harness's python")
    g = load_all(art / "golden" / "inputs.safetensors")
    n = len([k for k in g if k.startswith("images.")])
    inp = ModelInputs(tuple(g[f"images.{i}"] for i in range(n)), tuple(g[f"img_masks.{i}"].bool() for i in range(n)),
                      g["lang_tokens"], g["lang_masks"].bool(), g["state"])
    d = load_all(data)
    base = Engine.from_checkpoint(art / "checkpoint", vlm_dir=h / "vlm" / "SmolVLM2-500M-Video-Instruct",
                                  mode="exact", vision_position_ids="legacy")
    prefix = base.prefill(inp)
    mc = base.model_config
    cases = sorted({int(k.split(".")[1]) for k in d if k.startswith("meta.")})
    assert cases
    for case in cases:
        delay, horizon, schedule, beta = d[f"meta.{case}"].tolist()
        cfg = RtcConfig(schedule=SCHEDULES[int(schedule)], max_guidance_weight=float(beta),
                        execution_horizon=int(horizon))
        e = Engine(base.ckpt, dataclasses.replace(base.config, rtc=cfg), base.hardware) if cfg != base.rtc else base
        got = e.decode(prefix, d[f"noise.{case}"], rtc=rtc_inputs(d[f"prev.{case}"], int(delay), cfg, mc.chunk_size,
                                                                  mc.max_action_dim))
        err = (got - d[f"actions.{case}"]).abs().max().item()
        print(f"FULL RTC case {case} ({cfg.schedule}, d={int(delay)}, H={int(horizon)}): "
              f"max |ours - LeRobot| {err:.2e}")
        assert err <= 1e-4, f"case {case}: {err:.2e}"

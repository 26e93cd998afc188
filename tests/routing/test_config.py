"""router.yaml: loads, rejects typos and bad values with the value named, round-trips."""
from pathlib import Path

import pytest
import yaml

from edgefm_ros.routing.config import (DESIGN_NAMES, load_router_config, router_config_from_dict,
                                       write_router_config)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "router.yaml"


def doc():
    return yaml.safe_load(CONFIG.read_text())


def test_repository_config_loads():
    cfg = load_router_config(CONFIG)
    assert cfg.policy.delta_min == 0.03 and cfg.policy.guard_mbps == 15.0
    assert {c.placement for c in cfg.candidates} == {"edge", "cloud"}
    for c in cfg.candidates:
        assert c.model and c.precision and c.resolution > 0


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["policy"].update(delta_min=2.0), "delta_min"),
    (lambda d: d["policy"].update(gaurd_mbps=10.0), "gaurd_mbps"),
    (lambda d: d["candidates"][0].update(placement="moon"), "placement"),
    (lambda d: d["candidates"][0].update(precision="fp8"), "fp8"),
    (lambda d: d["candidates"][0]["strengths"].update(blur=1.5), "blur"),
    (lambda d: d["candidates"][1].update(name=d["candidates"][0]["name"]), "unique"),
    (lambda d: d["candidates"][0].update(coefficients={"bias": 1.0}), "missing"),
    (lambda d: d["features"]["aggregate"].update(blur="median"), "median"),
    (lambda d: d["link"].update(window=0), "window"),
    (lambda d: d.update(candidates=[c for c in d["candidates"] if c["placement"] == "cloud"]), "edge candidate"),
    (lambda d: d["policy"].update(cloud_only="cloud-xl"), "policy.cloud_only 'cloud-xl' is not a cloud candidate"),
    (lambda d: d["policy"].update(edge_only=d["candidates"][-1]["name"]), "policy.edge_only"),
])
def test_bad_configs_name_the_bad_value(edit, needle):
    d = doc()
    edit(d)
    with pytest.raises(ValueError, match=needle):
        router_config_from_dict(d)


def test_write_and_read_back(tmp_path):
    d = doc()
    d["candidates"][0]["coefficients"] = {n: 0.1 * i for i, n in enumerate(DESIGN_NAMES)}
    cfg = router_config_from_dict(d)
    out = tmp_path / "r.yaml"
    write_router_config(cfg, out, header="test header")
    assert out.read_text().startswith("# test header\n")
    assert load_router_config(out) == cfg

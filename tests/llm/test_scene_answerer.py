"""placement/vqa.py's SceneAnswerer without ROS, on a real tiny SmolVLM2 (the LLM fixtures of this folder): a
question routed to the cloud is answered on the edge when the cloud cannot answer (scene_query_node over ROS:
test_scene_query_node.py; with a real cloud server: test_vqa_cloud.py)."""
import sys
from pathlib import Path

import numpy as np
import pytest

from edgefm_ros.cloud import BreakerConfig
from edgefm_ros.cloud.client.base import ClientConfig
from edgefm_ros.cloud.client.vqa import VqaClient
from edgefm_ros.cloud.server.settings import free_port
from edgefm_ros.params.scene_query import SceneQueryConfig
from edgefm_ros.placement.vqa import SceneAnswerer
from edgefm_ros.routing.router import Router

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vqa_support import QUESTIONS, write_router_yaml  # noqa: E402


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_cloud_decision_without_a_reachable_cloud_is_answered_on_the_edge(tiny_vlm, tmp_path, stream):
    """A cloud decision: no client -> edge-fallback; a dead endpoint -> connection, then the breaker opens
    and the next question is not even sent; every answer is the edge's own (cloud_stream on and off)."""
    engine = tiny_vlm[2]
    cfg = SceneQueryConfig.from_values({"max_new_tokens": 5, "cloud_timeout_s": 2.0, "static_bandwidth_mbps": 50.0,
                                        "system_prompt": "Be brief.", "cloud_stream": stream})
    router = Router.from_yaml(write_router_yaml(tmp_path / "router.yaml"))
    rng = np.random.default_rng()
    frames = {"/cam": rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)}
    q = str(rng.choice(QUESTIONS))
    edge = SceneAnswerer(engine, cfg).answer(q, frames, lambda t: None)
    assert (edge.source, edge.target) == ("edge", "edge")
    a = SceneAnswerer(engine, cfg, router).answer(q, frames, lambda t: None)
    assert (a.source, a.target, a.reason, a.fallback) == ("edge-fallback", "cloud", "cloud_gain", "no cloud_url")
    assert a.text == edge.text and a.cloud_s < 0.1
    dead = VqaClient(f"http://127.0.0.1:{free_port()}", link=router.link,
                     config=ClientConfig.for_task("vqa", breaker=BreakerConfig(failures=1)))
    answerer = SceneAnswerer(engine, cfg, router, dead)
    partials = []
    first = answerer.answer(q, frames, partials.append)
    second = answerer.answer(q, frames, lambda t: None)
    assert first.fallback.startswith("connection") and second.fallback.startswith("breaker_open")
    assert first.source == second.source == "edge-fallback" and first.text == second.text == edge.text
    assert partials and partials[-1].strip() == edge.text  # the fallback answer streams like any edge answer
    assert dead.stats()["sent"] == 1 and first.cloud_s < cfg.cloud_timeout_s
    dead.close()

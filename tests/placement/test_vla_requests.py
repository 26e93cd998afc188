"""vla_node's chunk stamping (placement/vla_requests.py): a chunk asked for while the robot holds starts when it
is ready; any other keeps its observation's time."""
import numpy as np

from edgefm_ros.params.vla import VlaNodeConfig
from edgefm_ros.placement.runs import PlacementRun
from edgefm_ros.placement.vla import Computed
from edgefm_ros.placement.vla_requests import ChunkRequests
from edgefm_ros.types import ActionChunk, Observation

RNG = np.random.default_rng()


def _out(obs):
    chunk = ActionChunk(actions=RNG.normal(size=(8, 4)).astype(np.float32), dt=0.05, stamp=obs.stamp)
    return Computed(chunk, "edge", PlacementRun("edge", None, 0.1), obs, None, 1, None, None, None)


def test_held_chunks_start_when_ready():
    obs = Observation({}, np.zeros(4, np.float32), "go", stamp=float(RNG.uniform(10, 20)))
    ready = obs.stamp + float(RNG.uniform(0.05, 2.0))
    cfg = VlaNodeConfig(checkpoint="ck", camera_topics=("/cam",), state_joint_names=("a", "b", "c", "d"), action_rate_hz=20.0)
    req = ChunkRequests()
    moving = req.stamped(_out(obs), obs, cfg, ready, held=False)
    held = req.stamped(_out(obs), obs, cfg, ready, held=True)
    assert moving.stamp == obs.stamp and held.stamp == ready
    assert held.inference_s == moving.inference_s == ready - obs.stamp  # the latency is still measured
    off = req.stamped(_out(obs), obs, VlaNodeConfig(checkpoint="ck", camera_topics=("/cam",), state_joint_names=("a", "b", "c", "d"), action_rate_hz=20.0, restamp_held=False), ready, held=True)
    assert off.stamp == obs.stamp

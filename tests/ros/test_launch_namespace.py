"""edgefm.launch.py under a namespace, started as a user starts it: the robot's params file (config/edgefm.yaml,
installed), a checkpoint whose backbone is not in the Hugging Face cache (the tiny one, through the
``checkpoint`` and ``vlm`` arguments) and no camera keys (the checkpoint's own), a bag playing the robot's
topics. Every node of the graph talks to its peers: the graph's own topics are under the namespace (nothing
at the root), the robot's are where the robot has them; the decision reaches vla_node, the chunks action_node,
the queue status vla_node, the commands the robot's controller topic. Ctrl-C ends every process with 0."""
from __future__ import annotations

import signal
import subprocess
import threading
import time

import pytest

from launch_helpers import DiagnosticsObserver, need_ros2_launch

NS = "arm7"
BOUND_S = 15.0


@pytest.fixture
def launch_ready(ros):
    need_ros2_launch()


class Watcher:
    """Counts the messages on the graph's topics, in the namespace and at the root, from this process."""

    def __init__(self, domain_id: int):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import Float64MultiArray

        from edgefm_ros.msg import ActionChunk, QueueStatus, RouteDecision
        from edgefm_ros.params import topics
        from edgefm_ros.ros.spin import spin_until_shutdown

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("namespace_watcher", context=self.context)
        self.count: dict[str, int] = {}
        self.graph = {t: f"/{NS}/{t}" for t in (topics.ACTION_CHUNK, topics.QUEUE_STATUS, topics.ROUTE)}
        for (rel, full), mtype in zip(self.graph.items(), (ActionChunk, QueueStatus, RouteDecision)):
            self._count(mtype, full)
            self._count(mtype, "/" + rel)  # the same name at the root: nobody must publish there
        self.command = "/forward_position_controller/commands"  # config/edgefm.yaml's command topic
        self._count(Float64MultiArray, self.command)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=spin_until_shutdown, args=(self.executor, self.context),
                                        daemon=True)
        self._thread.start()

    def _count(self, mtype, topic: str) -> None:
        from edgefm_ros.ros import qos

        self.count[topic] = 0

        def on(_msg, t=topic):
            self.count[t] += 1
        self.node.create_subscription(mtype, topic, on, qos.LATEST)

    def publishers(self, topic: str) -> list[str]:
        return sorted(f"{i.node_namespace.rstrip('/')}/{i.node_name}"
                      for i in self.node.get_publishers_info_by_topic(topic))

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._thread.join(timeout=2.0)


def _wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_graph_under_a_namespace_talks_to_its_peers(launch_ready, tiny_model, short_bag, tmp_path, ros_domain_id):
    from edgefm_ros.tools.graph import LaunchedGraph

    ckpt, vlm = tiny_model
    obs = DiagnosticsObserver(ros_domain_id)
    watch = Watcher(ros_domain_id)
    g = LaunchedGraph("edgefm.launch.py", {"checkpoint": ckpt, "vlm": vlm, "namespace": NS},
                      tmp_path / "launch.log")
    player = None
    try:
        g.wait_ready(("vla_node", "action_node", "router_node"), timeout=120)
        player = subprocess.Popen(["edgefm-bag", "play", "--loop", short_bag], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT)
        chunk, status, route = watch.graph.values()

        def talking() -> bool:  # the diagnostics come once a second (config/edgefm.yaml): wait for each node's
            v, a, r = (obs.get(n) for n in ("vla_node", "action_node", "router_node"))
            return (watch.count[chunk] >= 2 and watch.count[route] >= 1 and watch.count[watch.command] >= 20
                    and int(v.get("chunks", "0")) >= 2 and v.get("route", "edge (no decision)") != "edge (no decision)"
                    and int(a.get("chunks", "0")) >= 1 and int(r.get("decisions", "0")) >= 1)
        assert _wait(talking, 60), (watch.count, obs.get("vla_node"), g.text()[-3000:])
        vla, action, router = (obs.get(n) for n in ("vla_node", "action_node", "router_node"))
        pubs = {t: watch.publishers(t) for t in (chunk, status, route, watch.command)}
    finally:
        if player is not None:
            player.send_signal(signal.SIGINT)
            player.wait(15)
        result = g.stop(signal.SIGINT, "launch", BOUND_S)
        watch.close()
        obs.close()
    # the graph's own topics: in the namespace, each published by its node there; nothing at the root
    assert pubs == {chunk: [f"/{NS}/vla_node"], status: [f"/{NS}/action_node"], route: [f"/{NS}/router_node"],
                    watch.command: [f"/{NS}/action_node"]}, pubs
    assert all(watch.count["/" + rel] == 0 for rel in watch.graph), watch.count
    # the checkpoint's cameras, taken from the robot's absolute topics (no camera_keys given)
    keys = ("observation.images.camera1", "observation.images.camera2")
    assert all(float(vla[f"age_{k}_s"]) < 5.0 for k in keys), vla
    assert float(vla["age_joint_states_s"]) < 5.0 and vla["task"], vla
    # router -> vla_node, vla_node -> action_node, action_node -> vla_node (it asked for every chunk)
    assert vla["route"].split(" ")[0] in ("edge", "cloud") and "(no decision)" not in vla["route"], vla
    assert int(action["chunks"]) >= 1 and int(action["last_chunk_sequence"]) >= 1, action
    assert int(router["decisions"]) >= 1 and int(router["fresh_cameras"]) == 2, router
    assert {n: d["state"] for n, d in (("vla_node", vla), ("action_node", action), ("router_node", router))} == \
        {"vla_node": "active", "action_node": "active", "router_node": "active"}
    assert result.abnormal() == [] and set(result.codes.values()) == {0}, (result, g.log)

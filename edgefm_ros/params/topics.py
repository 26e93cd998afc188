"""The graph's topic names, and the one rule for which are relative.

The rule: the graph's own topics (between our nodes: chunks, queue status, routes, link samples, episode
starts, the simulator's events and resets, scene questions) are relative, so a namespace (launch argument
``namespace``) moves them with the nodes and two graphs can run side by side. The robot's topics (its
sensors: cameras, joint states; its controller's command input; the task instruction from whoever gives it)
are absolute: the robot's drivers publish them where they are, whatever namespace our nodes run in.
``/diagnostics`` is absolute by ROS convention. Every node parameter naming a topic defaults to a name here.
"""
from __future__ import annotations

# ---- the graph's own: relative -------------------------------------------------------------------------
ACTION_CHUNK = "edgefm/action_chunk"  # vla_node -> action_node (edgefm_ros/ActionChunk)
QUEUE_STATUS = "edgefm/queue_status"  # action_node -> vla_node (edgefm_ros/QueueStatus), every tick
ROUTE = "edgefm/route"  # router_node -> vla_node (edgefm_ros/RouteDecision)
LINK_SAMPLE = "edgefm/link_sample"  # vla_node's cloud calls -> router_node (Float64MultiArray)
EPISODE_START = "edgefm/episode_start"  # sim_node (or an episode manager) -> action_node (std_msgs/Header)
SIM_EVENTS = "sim/events"  # sim_node's episode events (std_msgs/String JSON)
SIM_RESET = "sim/reset"  # -> sim_node: 'task:seed' starts that episode
SCENE_QUESTION = "edgefm/scene_question"
SCENE_ANSWER = "edgefm/scene_answer"
SCENE_ANSWER_PARTIAL = "edgefm/scene_answer_partial"
SCENE_ANSWER_INFO = "edgefm/scene_answer_info"

# ---- the robot's: absolute -----------------------------------------------------------------------------
JOINT_STATES = "/joint_states"
INSTRUCTION = "/instruction"  # std_msgs/String task (latched by sim_node and bag replay)
COMMAND = "/edgefm/command"  # action_node's output: the robot controller's input (sim_node's by default)
CAMERA = "/camera1/image_raw"  # a node's camera when none is configured
SIM_CAMERAS = ("/scene/image_raw", "/wrist/image_raw")  # sim_node's cameras (scene, wrist)
DIAGNOSTICS = "/diagnostics"

GRAPH = (ACTION_CHUNK, QUEUE_STATUS, ROUTE, LINK_SAMPLE, EPISODE_START, SIM_EVENTS, SIM_RESET, SCENE_QUESTION,
         SCENE_ANSWER, SCENE_ANSWER_PARTIAL, SCENE_ANSWER_INFO)
ROBOT = (JOINT_STATES, INSTRUCTION, COMMAND, CAMERA, *SIM_CAMERAS, DIAGNOSTICS)

COMPRESSED_SUFFIX = "/compressed"
TRANSPORTS = ("raw", "compressed")


def transport(topic: str) -> str:
    """"compressed" (sensor_msgs/CompressedImage) for a camera topic ending in /compressed, else "raw"
    (sensor_msgs/Image): image_transport's naming."""
    return "compressed" if topic.rstrip("/").endswith(COMPRESSED_SUFFIX) else "raw"


def transports(topics: tuple[str, ...], given: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Each camera topic's transport: ``given`` (one per topic) when set, else by the topic's name."""
    if given and len(given) != len(topics):
        raise ValueError(f"camera_transports {list(given)} must have one entry per camera topic {list(topics)}")
    return given or tuple(transport(t) for t in topics)


def compressed(topic: str) -> str:
    """The compressed companion of a raw camera topic (<topic>/compressed)."""
    return topic.rstrip("/") + COMPRESSED_SUFFIX

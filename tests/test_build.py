"""The foundation: colcon-built messages, install space, packaging metadata and real DDS between processes."""
import json
import math
import os
import signal
import string
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from skips import require_material, require_module

REPO_ROOT = Path(__file__).resolve().parent.parent
MSG_NAMES = ("ActionChunk", "RouteDecision", "QueueStatus")
NODE_NAMES = ("vla_node", "action_node", "router_node", "scene_query_node")
CONSOLE_SCRIPTS = {
    "edgefm-vla": "edgefm_ros.tools.vla_cli:main",
    "edgefm-bag": "edgefm_ros.tools.bag_cli:main",
    "edgefm-router": "edgefm_ros.tools.router_cli:main",
    "edgefm-cloud": "edgefm_ros.cloud.cli:main",
    "edgefm-demo": "edgefm_ros.tools.demo:main",
    "edgefm-llm": "edgefm_ros.tools.llm_cli:main",
    "edgefm-sim": "edgefm_ros.tools.sim_cli:main",
    "edgefm-shm-clean": "edgefm_ros.housekeeping.shm:main",
}
# .msg primitive -> the type name rosidl reports in get_fields_and_field_types()
ROSIDL_NAMES = {
    "bool": "boolean", "byte": "octet", "char": "uint8", "float32": "float", "float64": "double",
    "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
    "uint32": "uint32", "int64": "int64", "uint64": "uint64", "string": "string",
}
INT_BITS = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
SHM_SEGMENT_BYTES = 32 * 1024 * 1024


def parse_msg(name: str) -> dict[str, str]:
    """Field name -> .msg type, read from msg/<name>.msg (the source of truth)."""
    fields = {}
    for line in (REPO_ROOT / "msg" / f"{name}.msg").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            typ, field = line.split()[:2]
            fields[field] = typ
    return fields


def rosidl_name(msg_type: str) -> str:
    if msg_type.endswith("[]"):
        return f"sequence<{rosidl_name(msg_type[:-2])}>"
    return ROSIDL_NAMES.get(msg_type, msg_type)


def random_text(rng, max_len=12) -> str:
    letters = string.ascii_letters + string.digits + "_ -."
    return "".join(rng.choice(list(letters), size=int(rng.integers(1, max_len + 1))))


def random_scalar(rng, typ: str):
    if typ == "bool":
        return bool(rng.integers(0, 2))
    if typ in INT_BITS:
        return int(rng.integers(1, 2 ** INT_BITS[typ] - 1, dtype=np.uint64))
    if typ == "float32":
        return float(np.float32(rng.normal(scale=100.0)))
    if typ == "float64":
        return float(rng.normal(scale=1e3))
    if typ == "string":
        return random_text(rng)
    raise AssertionError(f"no random generator for field type {typ!r}")


def fill_random(msg, fields: dict[str, str], rng):
    """Give every field of msg a fresh random value of its declared type; returns msg."""
    from array import array

    for field, typ in fields.items():
        if typ == "std_msgs/Header":
            header = getattr(msg, field)
            header.stamp.sec = int(rng.integers(1, 2**31 - 1))
            header.stamp.nanosec = int(rng.integers(0, 10**9))
            header.frame_id = random_text(rng)
        elif typ.endswith("[]"):
            n = int(rng.integers(1, 9))
            base = typ[:-2]
            if base == "float32":
                value = array("f", rng.normal(size=n).astype(np.float32))
            else:
                value = [random_scalar(rng, base) for _ in range(n)]
            setattr(msg, field, value)
        else:
            setattr(msg, field, random_scalar(rng, typ))
    return msg


@pytest.fixture(scope="module")
def msgs():
    require_module("rclpy", "rclpy not installed (ROS 2 wheels come with scripts/setup.sh)")
    from edgefm_ros import msg

    return msg


@pytest.mark.parametrize("name", MSG_NAMES)
def test_message_fields_match_msg_files(msgs, name):
    cls = getattr(msgs, name)
    declared = {field: rosidl_name(typ) for field, typ in parse_msg(name).items()}
    assert cls.get_fields_and_field_types() == declared


def test_actionchunk_python_types(msgs):
    chunk = msgs.ActionChunk()
    assert chunk.actions.typecode == "f"  # float32[] -> array('f')
    assert type(chunk.dt) is float and type(chunk.sequence) is int
    assert type(chunk.header).__name__ == "Header"
    with pytest.raises(TypeError):
        chunk.actions = ["not a float"]  # (Jazzy checks scalar ranges only with ROS_PYTHON_CHECK_FIELDS=1)


@pytest.mark.parametrize("name", MSG_NAMES)
def test_message_roundtrips_through_cdr(msgs, name):
    from rclpy.serialization import deserialize_message, serialize_message

    cls = getattr(msgs, name)
    rng = np.random.default_rng()
    original = fill_random(cls(), parse_msg(name), rng)
    data = serialize_message(original)
    assert isinstance(data, bytes) and len(data) > 0
    back = deserialize_message(data, cls)
    assert back == original
    assert back is not original


def test_route_decision_keeps_nan_link_estimates(msgs):
    from rclpy.serialization import deserialize_message, serialize_message

    decision = msgs.RouteDecision(target="edge", bandwidth_mbps=math.nan, rtt_s=math.nan)
    back = deserialize_message(serialize_message(decision), msgs.RouteDecision)
    assert math.isnan(back.bandwidth_mbps) and math.isnan(back.rtt_s)
    assert back.target == "edge"


def test_actionchunk_large_matrix_roundtrip(msgs):
    from rclpy.serialization import deserialize_message, serialize_message

    rng = np.random.default_rng()
    actions = rng.normal(size=(50, 32)).astype(np.float32)  # (chunk, max_action_dim)
    chunk = msgs.ActionChunk(chunk_size=50, action_dim=32, actions=actions.ravel().tolist())
    back = deserialize_message(serialize_message(chunk), msgs.ActionChunk)
    got = np.asarray(back.actions, dtype=np.float32).reshape(back.chunk_size, back.action_dim)
    np.testing.assert_array_equal(got, actions)


PUBLISHER = textwrap.dedent(
    """
    import json, sys, time
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from edgefm_ros.msg import ActionChunk

    values = json.loads(open(sys.argv[1]).read())
    rclpy.init()
    node = rclpy.create_node("build_test_publisher")
    pub = node.create_publisher(ActionChunk, "edgefm/test_chunk", QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    msg = ActionChunk(**{k: v for k, v in values.items() if k not in ("stamp_sec", "stamp_nanosec")})
    msg.header.stamp.sec, msg.header.stamp.nanosec = values["stamp_sec"], values["stamp_nanosec"]
    deadline = time.monotonic() + float(sys.argv[2])
    try:
        while rclpy.ok() and time.monotonic() < deadline:
            pub.publish(msg)
            rclpy.spin_once(node, timeout_sec=0.05)
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    """
)


def fastdds_segments() -> dict[str, int]:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in shm.glob("fastrtps_*") if p.is_file()}


def test_actionchunk_crosses_processes_over_dds(msgs, ros_domain_id, tmp_path):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    profile = os.environ.get("FASTRTPS_DEFAULT_PROFILES_FILE", "")
    assert Path(profile).resolve() == (REPO_ROOT / "config" / "fastdds_shm.xml").resolve(), profile
    rng = np.random.default_rng()
    chunk_size, action_dim = int(rng.integers(10, 60)), int(rng.integers(4, 33))
    actions = rng.normal(size=(chunk_size, action_dim)).astype(np.float32)
    values = {
        "stamp_sec": int(rng.integers(1, 2**31 - 1)), "stamp_nanosec": int(rng.integers(0, 10**9)),
        "joint_names": [f"joint_{i}_{random_text(rng, 4)}" for i in range(action_dim)],
        "chunk_size": chunk_size, "action_dim": action_dim, "dt": float(rng.uniform(0.005, 0.1)),
        "actions": actions.ravel().tolist(), "source": "edge", "model": random_text(rng),
        "inference_time": float(rng.uniform(0, 1)), "prefill_time": float(rng.uniform(0, 1)),
        "decode_time": float(rng.uniform(0, 1)), "sequence": int(rng.integers(1, 2**40)),
    }
    (tmp_path / "values.json").write_text(json.dumps(values))
    (tmp_path / "pub.py").write_text(PUBLISHER)
    before = fastdds_segments()
    pub = subprocess.Popen(
        [sys.executable, str(tmp_path / "pub.py"), str(tmp_path / "values.json"), "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    received = []
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    try:
        node = rclpy.create_node("build_test_subscriber", context=context)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(msgs.ActionChunk, "edgefm/test_chunk", received.append, qos)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + 30.0
        while not received and time.monotonic() < deadline and pub.poll() is None:
            executor.spin_once(timeout_sec=0.1)
        new_segments = {k: v for k, v in fastdds_segments().items() if k not in before}
        executor.shutdown()
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
        pub.send_signal(signal.SIGINT)
        try:
            out, _ = pub.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            pub.kill()
            out, _ = pub.communicate()
    assert received, f"no ActionChunk arrived within 30 s; publisher said:\n{out}"
    assert "XMLPARSER" not in out, out  # the profile parsed
    got = received[0]
    assert (got.header.stamp.sec, got.header.stamp.nanosec) == (values["stamp_sec"], values["stamp_nanosec"])
    assert list(got.joint_names) == values["joint_names"]
    assert (got.chunk_size, got.action_dim, got.sequence) == (chunk_size, action_dim, values["sequence"])
    assert (got.dt, got.source, got.model) == (values["dt"], "edge", values["model"])
    assert (got.inference_time, got.prefill_time, got.decode_time) == (
        values["inference_time"], values["prefill_time"], values["decode_time"])
    np.testing.assert_array_equal(np.asarray(got.actions, np.float32).reshape(chunk_size, action_dim), actions)
    if Path("/dev/shm").is_dir():  # the profile's transport is in use: 32 MiB segments, not 512 KiB
        assert any(size >= SHM_SEGMENT_BYTES for size in new_segments.values()), (
            f"no 32 MiB Fast DDS shared-memory segment appeared: {new_segments}")



def test_shm_profile_declares_shm_and_udp():
    ns = {"f": "http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"}
    root = ET.parse(REPO_ROOT / "config" / "fastdds_shm.xml").getroot()
    transports = {t.findtext("f:transport_id", namespaces=ns): t for t in root.iterfind(".//f:transport_descriptor", ns)}
    kinds = {tid: t.findtext("f:type", namespaces=ns) for tid, t in transports.items()}
    assert sorted(kinds.values()) == ["SHM", "UDPv4"]
    shm = next(t for t in transports.values() if t.findtext("f:type", namespaces=ns) == "SHM")
    assert int(shm.findtext("f:segment_size", namespaces=ns)) == SHM_SEGMENT_BYTES
    participant = root.find(".//f:participant[@is_default_profile='true']", ns)
    used = [e.text for e in participant.iterfind(".//f:userTransports/f:transport_id", ns)]
    assert sorted(used) == sorted(kinds)
    assert participant.findtext(".//f:useBuiltinTransports", namespaces=ns) == "false"


def test_edgefm_kernels_imports_from_the_tree():
    import edgefm_kernels

    assert Path(edgefm_kernels.__file__).resolve().parent == (REPO_ROOT / "edgefm_kernels").resolve()


def test_install_space_holds_nodes_kernels_and_share(install_root):
    require_material(install_root.is_dir(), f"no colcon install space at {install_root} (run scripts/setup.sh)")
    for name in NODE_NAMES:
        exe = install_root / "lib" / "edgefm_ros" / name
        assert exe.is_file() and os.access(exe, os.X_OK), exe
        assert f"edgefm_ros.nodes.{name} import main" in exe.read_text()
    site = install_root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert (site / "edgefm_kernels" / "__init__.py").is_file()
    assert (site / "edgefm_ros" / "msg" / "_action_chunk.py").is_file()
    installed_init = (site / "edgefm_ros" / "__init__.py").read_text()
    assert installed_init == (REPO_ROOT / "edgefm_ros" / "__init__.py").read_text()  # ours, not rosidl's
    assert (install_root / "share" / "edgefm_ros" / "config" / "fastdds_shm.xml").is_file()
    assert (install_root / "share" / "edgefm_ros" / "package.xml").is_file()


def test_msg_package_and_tree_share_one_namespace(msgs):
    import edgefm_ros

    paths = [Path(p).resolve() for p in edgefm_ros.__path__]
    assert (REPO_ROOT / "edgefm_ros").resolve() in paths
    assert Path(msgs.__file__).resolve().parent.parent in paths


def test_node_launchers_call_their_module():
    for name in NODE_NAMES:
        text = (REPO_ROOT / "bin" / name).read_text()
        assert text.startswith("#!/usr/bin/env python3")
        assert f"from edgefm_ros.nodes.{name} import main" in text
        assert os.access(REPO_ROOT / "bin" / name, os.X_OK)


def test_package_xml_is_format3_with_robot_dependencies():
    root = ET.parse(REPO_ROOT / "package.xml").getroot()
    assert root.get("format") == "3" and root.findtext("name") == "edgefm_ros"
    assert root.findtext("export/build_type") == "ament_cmake"
    execs = {e.text for e in root.iter("exec_depend")} | {e.text for e in root.iter("depend")}
    needed = {"rclpy", "std_msgs", "sensor_msgs", "trajectory_msgs", "diagnostic_msgs",
              "lifecycle_msgs", "rosidl_default_runtime", "python3-numpy"}
    assert needed <= execs, needed - execs
    assert root.find("member_of_group").text == "rosidl_interface_packages"
    cmake = (REPO_ROOT / "CMakeLists.txt").read_text()
    for msg_name in MSG_NAMES:
        assert f"msg/{msg_name}.msg" in cmake
    assert sorted(p.stem for p in (REPO_ROOT / "msg").glob("*.msg")) == sorted(MSG_NAMES)


def test_console_scripts_registered():
    from importlib.metadata import distributions

    # every edgefm_ros distribution: the pip (editable) one has the entry points; colcon's egg-info
    # in the install space has none and would hide it from the deduplicating entry_points()
    found = {ep.name: ep.value for dist in distributions() if dist.metadata["Name"] == "edgefm_ros"
             for ep in dist.entry_points if ep.group == "console_scripts"}
    assert found == CONSOLE_SCRIPTS
    for name in CONSOLE_SCRIPTS:
        assert os.access(Path(sys.executable).parent / name, os.X_OK), name

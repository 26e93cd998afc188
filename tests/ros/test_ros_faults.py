"""Faults with the real nodes: vla_node killed mid-run, a camera that stops, malformed messages."""
from __future__ import annotations

import signal
import threading
import time

import numpy as np

from replay_helpers import CAMERA_KEYS, COMMAND_TOPIC, JOINTS, node_params, record_topics


def _play_in_background(session, bag, **kw):
    stop = threading.Event()
    player = session.player(bag, **kw)
    th = threading.Thread(target=player.play, args=(stop,), daemon=True)
    th.start()
    return stop, th


def test_vla_node_killed_action_node_holds_and_reports(ros, tiny_model, short_bag, tmp_path, ros_domain_id):
    from edgefm_ros.tools.bag.analyze import command_timing, read_run
    from edgefm_ros.tools.graph import ReplaySession

    with ReplaySession(tmp_path, node_params(tiny_model), ("vla_node", "action_node"), ros_domain_id,
                       record_topics()) as s:
        s.wait_active(timeout=60)
        stop, th = _play_in_background(s, short_bag)
        assert s.wait_for(lambda: int(s.diagnostics("action_node").get("chunks", 0)) >= 5, 15)
        t_kill = time.time()
        s.stop_node("vla_node", signal.SIGKILL)
        time.sleep(2.5)
        diag = s.diagnostics("action_node")
        assert s.alive("action_node")
        stop.set()
        th.join(5)
    assert "holding last commanded position" in diag["message"] and "producer lost" in diag["message"], diag
    assert diag["holding"] == "true" and int(diag["underruns"]) > 0

    run = read_run(str(s.record_path), COMMAND_TOPIC)
    assert max(run.chunk_recv) < t_kill + 0.2, "a chunk arrived after vla_node was killed"
    stamps = np.asarray(run.cmd_stamp)
    after = stamps > t_kill + 1.0  # the queue (at most 0.7 s of actions) has drained
    held = run.positions[after]
    assert len(held) > 50
    assert np.all(held == held[0]), "the held command moved"
    np.testing.assert_array_equal(held[0], run.positions[np.flatnonzero(stamps <= t_kill + 1.0)[-1]])
    timing = command_timing(run, 1 / 50, t_kill + 1.0, stamps.max())
    assert abs(timing["rate_hz"] - 50.0) < 1.0, timing  # the control loop keeps its rate while holding
    t, holding = np.asarray(run.status_time), np.asarray(run.status_holding)
    assert holding[t > t_kill + 1.0].all()


def test_stopped_camera_is_refused_and_reported(ros, tiny_model, short_bag, tmp_path, ros_domain_id):
    from edgefm_ros.tools.bag.analyze import read_run
    from edgefm_ros.tools.graph import ReplaySession

    with ReplaySession(tmp_path, node_params(tiny_model), ("vla_node", "action_node"), ros_domain_id,
                       record_topics()) as s:
        s.wait_active(timeout=60)
        s.play(short_bag, stop_after_s=5.0)  # 5 s: a loaded 2-core CI host made only 1 chunk in 3 s once
        chunks_before = int(s.diagnostics("vla_node").get("chunks", 0))
        t_stop = time.time()  # camera1 (required) publishes nothing from here on
        topics = ("/camera2/image_raw/compressed", "/joint_states", "/instruction")
        s.play(short_bag, stop_after_s=3.0, topics=topics, start_offset_s=3.0)
        diag = s.diagnostics("vla_node")
        assert s.alive("vla_node") and s.alive("action_node")
    assert chunks_before > 3
    assert int(diag["refused_stale_camera"]) > 0
    assert "stale_camera" in diag["message"] and CAMERA_KEYS[0] in diag["message"], diag
    assert float(diag[f"age_{CAMERA_KEYS[0]}_s"]) > 2.0
    run = read_run(str(s.record_path), COMMAND_TOPIC)
    late = [t for t in run.chunk_recv if t > t_stop + 1.0]  # max_observation_age_s 0.5 + compute + transport
    assert not late, f"{len(late)} chunks published from a stale camera"


def _bad_inputs(rng):
    """Malformed messages of every kind vla_node and action_node take in."""
    from sensor_msgs.msg import CompressedImage, Image, JointState

    from edgefm_ros.msg import ActionChunk

    wrong_encoding = Image(height=48, width=64, encoding="yuv422", step=128, data=bytes(48 * 128))
    short = Image(height=48, width=64, encoding="rgb8", step=192,
                  data=rng.integers(0, 256, 48 * 192 - int(rng.integers(1, 500)), dtype=np.uint8).tobytes())
    garbage_jpeg = CompressedImage(format="jpeg", data=rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
    unknown = JointState(name=[f"joint_{i}" for i in range(6)], position=rng.normal(size=6).tolist())
    nan_pos = rng.normal(size=6)
    nan_pos[rng.integers(6)] = np.nan
    nan = JointState(name=list(JOINTS), position=nan_pos.tolist())
    mismatch = JointState(name=list(JOINTS), position=rng.normal(size=4).tolist())
    bad_size = ActionChunk(joint_names=list(JOINTS), chunk_size=8, action_dim=6, dt=0.1,
                           actions=rng.normal(size=40).astype(np.float32).tolist(), source="edge", sequence=1000)
    nan_chunk = rng.normal(size=48).astype(np.float32)
    nan_chunk[rng.integers(48)] = np.nan
    nan_actions = ActionChunk(joint_names=list(JOINTS), chunk_size=8, action_dim=6, dt=0.1, actions=nan_chunk.tolist(),
                              source="edge", sequence=1001)
    wrong_joints = ActionChunk(joint_names=[f"j{i}" for i in range(6)], chunk_size=8, action_dim=6, dt=0.1,
                               actions=rng.normal(size=48).astype(np.float32).tolist(), source="edge", sequence=1002)
    return [wrong_encoding, short], [garbage_jpeg], [unknown, nan, mismatch], [bad_size, nan_actions, wrong_joints]


def test_malformed_messages_do_not_crash_and_produce_nothing(ros, tiny_model, tmp_path, ros_domain_id):
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import String

    from edgefm_ros.msg import ActionChunk
    from edgefm_ros.ros import qos
    from edgefm_ros.ros.convert import rgb_to_image_msg, to_stamp
    from edgefm_ros.sensors.camera import encode_jpeg
    from edgefm_ros.tools.bag.analyze import read_run
    from edgefm_ros.tools.bag.make import published_joint_order
    from edgefm_ros.tools.graph import ReplaySession
    from edgefm_ros.tools.bag.synth import Scene, SceneConfig, joint_positions

    rng = np.random.default_rng()
    images, jpegs, joints, chunks = _bad_inputs(rng)
    scene = Scene(SceneConfig(64, 48, 2, int(rng.integers(1000))))
    names = published_joint_order()
    with ReplaySession(tmp_path, node_params(tiny_model), ("vla_node", "action_node"), ros_domain_id,
                       record_topics()) as s:
        n = s.node
        cam1 = n.create_publisher(Image, "/camera1/image_raw", qos.RELIABLE)
        cam2 = n.create_publisher(CompressedImage, "/camera2/image_raw/compressed", qos.RELIABLE)
        js = n.create_publisher(JointState, "/joint_states", qos.RELIABLE)
        task = n.create_publisher(String, "/instruction", qos.LATCHED)
        chunk_pub = n.create_publisher(ActionChunk, "edgefm/action_chunk", qos.RELIABLE)
        s.wait_active(timeout=60)
        task.publish(String(data="Pick up the red cube."))

        def now():
            return to_stamp(time.time())

        def publish_for(seconds, cam1_ok, cam2_ok, joints_ok, bad_chunks=False):
            end = time.monotonic() + seconds
            k = 0
            while time.monotonic() < end:
                t = time.time()
                m1 = rgb_to_image_msg(scene.frame(0, t), t) if cam1_ok else images[k % len(images)]
                m2 = CompressedImage(format="jpeg", data=encode_jpeg(scene.frame(1, t))) if cam2_ok else \
                    jpegs[k % len(jpegs)]
                if joints_ok:
                    q = joint_positions(t)
                    m3 = JointState(name=list(names), position=[q[list(JOINTS).index(j)] if j in JOINTS else 0.0
                                                                for j in names])
                else:
                    m3 = joints[k % len(joints)]
                for m in (m1, m2, m3):
                    m.header.stamp = now()
                cam1.publish(m1), cam2.publish(m2), js.publish(m3)
                if bad_chunks:
                    c = chunks[k % len(chunks)]
                    c.header.stamp = now()
                    chunk_pub.publish(c)
                k += 1
                time.sleep(1 / 30)

        # A: everything malformed -> nothing published, every kind counted
        publish_for(2.0, False, False, False, bad_chunks=True)
        va, aa = s.diagnostics("vla_node"), s.diagnostics("action_node")
        t_a = time.time()
        # B: good joints and camera1, undecodable JPEG on camera2 (required) -> refused, nothing published
        publish_for(1.5, True, False, True)
        vb = s.diagnostics("vla_node")
        t_b = time.time()
        # C: all good -> the nodes were not hurt: chunks and commands flow
        publish_for(2.5, True, True, True)
        time.sleep(0.3)
        vc = s.diagnostics("vla_node")
        assert s.alive("vla_node") and s.alive("action_node")

    assert int(va["bad_image"]) >= 10 and int(va["bad_joint_state"]) >= 10, va
    assert int(va["chunks"]) == 0 and va["level"] == 1, va
    assert int(aa["rejected_chunks"]) >= 10 and int(aa["chunks"]) == 0, aa
    assert aa.get("last_rejection"), aa
    assert int(vb["refused_bad_image"]) > 0 and int(vb["chunks"]) == 0, vb
    assert "bad_image" in vb["message"]
    assert int(vc["chunks"]) > 3, vc
    run = read_run(str(s.record_path), COMMAND_TOPIC)
    produced = [t for t, seq in zip(run.chunk_recv, run.chunk_seq) if seq < 1000]
    assert produced and min(produced) > t_b, "vla_node published a chunk from malformed data"
    assert run.cmd_recv and min(run.cmd_recv) > t_b, "action_node commanded from a malformed chunk"
    assert t_a < t_b

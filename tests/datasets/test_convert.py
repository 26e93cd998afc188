"""edgefm-bag to-dataset end to end on real bags: the LeRobot v3.0 layout, frames chosen by the sync rule
(checked frame by frame through the video), determinism, images, the report, the CLI, and the round trip
into training's data loader."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bags import expected_index, header_stamps, make_bag, parquet_files  # noqa: E402

from edgefm_ros.datasets.convert import ConvertConfig, convert_bags  # noqa: E402
from edgefm_ros.datasets.mapping import DatasetMapping  # noqa: E402
from edgefm_ros.datasets.reader import read_lerobot_dataset  # noqa: E402
from edgefm_ros.datasets.synthbag import arm_state, frame_code_of  # noqa: E402
from edgefm_ros.datasets.video import probe_video  # noqa: E402
from edgefm_ros.tools.bag_cli import main as bag_main  # noqa: E402

FPS = 20


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One MCAP and one sqlite3 bag (coded frames) -> one dataset."""
    d = tmp_path_factory.mktemp("conv")
    bags = [make_bag(d, "a", storage="mcap", frame_code=True),
            make_bag(d, "b", storage="sqlite3", frame_code=True, episodes=(("drawer-open", 1.1),), seed=3,
                     start_s=1_700_000_100.0)]
    report = convert_bags(bags, d / "ds", DatasetMapping(), ConvertConfig(fps=FPS))
    return d, bags, report


def test_layout_and_metadata(converted):
    d, bags, report = converted
    root = d / "ds"
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS
    assert info["total_episodes"] == 3 == report.episodes and info["total_frames"] == report.frames
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    cam = info["features"]["observation.images.scene"]
    assert cam["dtype"] == "video" and cam["shape"] == [24, 32, 3]
    assert cam["info"]["video.codec"] == "av1" and cam["info"]["video.pix_fmt"] == "yuv420p"
    assert info["features"]["observation.state"]["names"] == ["ee_x", "ee_y", "ee_z", "gripper"]
    for key in ("observation.images.scene", "observation.images.wrist"):
        p = probe_video(root / f"videos/{key}/chunk-000/file-000.mp4")
        assert (p["codec"], p["pix_fmt"], p["width"], p["height"]) == ("av1", "yuv420p", 32, 24)
    eps = pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
    assert eps["episode_index"].tolist() == [0, 1, 2]
    assert [list(t) for t in eps["tasks"]] == [["Reach the red target."], ["Push the puck to the goal."],
                                               ["Open the drawer."]]
    assert (eps["dataset_to_index"] - eps["dataset_from_index"] == eps["length"]).all()
    ts = eps["videos/observation.images.scene/from_timestamp"].to_numpy()
    assert np.allclose(ts[1:], eps["videos/observation.images.scene/to_timestamp"].to_numpy()[:-1])
    assert eps["split_by"].tolist() == ["events"] * 3 and eps["task_name"].tolist() == ["reach", "push", "drawer-open"]
    assert eps["success"].all()
    tasks = pd.read_parquet(root / "meta/tasks.parquet")
    assert tasks.loc["Open the drawer.", "task_index"] == 2
    stats = json.loads((root / "meta/stats.json").read_text())
    assert np.asarray(stats["observation.images.scene"]["mean"]).shape == (3, 1, 1)
    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pandas()
    assert data["index"].tolist() == list(range(len(data)))
    assert np.allclose(data["timestamp"], data["frame_index"] / FPS)
    st = np.stack(data["observation.state"])
    assert np.allclose(stats["observation.state"]["mean"], st.mean(0))
    rep = json.loads((root / "meta/conversion_report.json").read_text())
    assert [b["split_by"] for b in rep["bags"]] == ["events", "events"]
    assert rep["bags"][0]["streams"]["observation.images.scene"]["skew_p95_ms"] <= 1000 / 30 + 1


def test_every_row_holds_what_the_sync_rule_picks(converted):
    """State and action exactly, each camera frame (decoded from the MP4) by its code, tick by tick."""
    d, bags, report = converted
    ds = read_lerobot_dataset(d / "ds")
    eps = pd.read_parquet(d / "ds/meta/episodes/chunk-000/file-000.parquet")
    age = int(0.1 * 1e9)
    checked = 0
    for e, row in eps.iterrows():
        bag = Path(row["source_bag"])
        start = int(row["source_start_ns"])
        t0 = 1_700_000_000.0 if bag.name == "a" else 1_700_000_100.0
        stamps = {t: header_stamps(bag, t) for t in ("/joint_states", "/edgefm/command", "/scene/image_raw",
                                                      "/wrist/image_raw")}
        rows = np.flatnonzero(ds.episode_index == e)
        assert report.bags[0 if bag.name == "a" else 1]["dropped"]["inner"] == 0
        for k, r in enumerate(rows):
            tick = start + int(round(k * 1e9 / FPS))
            i = expected_index(stamps["/joint_states"], tick, start, age)
            x = (stamps["/joint_states"][i] * 1e-9) - t0
            np.testing.assert_array_equal(ds.state[r], arm_state(round(x * 100) / 100).astype(np.float32))
            j = expected_index(stamps["/edgefm/command"], tick, start, age)
            xc = stamps["/edgefm/command"][j] * 1e-9 - t0
            np.testing.assert_array_equal(ds.action[r], arm_state(round(xc * 20) / 20 + 0.05).astype(np.float32))
            for cam, topic in (("scene", "/scene/image_raw"), ("wrist", "/wrist/image_raw")):
                c = expected_index(stamps[topic], tick, start, age)
                assert c >= 0 and frame_code_of(ds.images[cam][r]) == c, (e, k, cam)
                checked += 1
    assert checked == 2 * len(ds)


def test_same_bags_give_byte_identical_parquet_and_json(converted, tmp_path):
    d, bags, _ = converted
    convert_bags(bags, tmp_path / "again", DatasetMapping(), ConvertConfig(fps=FPS))
    first, second = parquet_files(d / "ds"), parquet_files(tmp_path / "again")
    assert [p.relative_to(d / "ds") for p in first] == [p.relative_to(tmp_path / "again") for p in second]
    assert len(first) == 3  # data, episodes, tasks
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a
    for name in ("info.json", "stats.json", "conversion_report.json"):
        assert (d / "ds/meta" / name).read_bytes() == (tmp_path / "again/meta" / name).read_bytes()
    # SVT-AV1's output does not depend on its threads' timing: the videos are the same bytes too
    for mp4 in sorted((d / "ds").rglob("*.mp4")):
        assert mp4.read_bytes() == (tmp_path / "again" / mp4.relative_to(d / "ds")).read_bytes(), mp4


def test_images_mode_and_the_training_loader(converted, tmp_path):
    d, bags, _ = converted
    convert_bags(bags[:1], tmp_path / "img", DatasetMapping(), ConvertConfig(fps=FPS, images=True))
    info = json.loads((tmp_path / "img/meta/info.json").read_text())
    assert info["features"]["observation.images.wrist"]["dtype"] == "image" and info["video_path"] is None
    assert not (tmp_path / "img/videos").exists()
    img = read_lerobot_dataset(tmp_path / "img")
    vid = read_lerobot_dataset(d / "ds")
    n = len(img)
    np.testing.assert_array_equal(img.state, vid.state[:n])  # the same ticks, whatever the camera storage
    codes = [frame_code_of(f) for f in img.images["scene"]]
    assert codes == [frame_code_of(f) for f in vid.images["scene"][:n]]
    # PNG is lossless: the frames are the recorded ones exactly
    assert all(np.ptp(f[..., 0]) == 0 for f in img.images["scene"])

    from edgefm_ros.runtime.checkpoint import NormStats
    from edgefm_ros.training.data import ChunkBatcher, read_demos

    demos = read_demos(d / "ds")
    assert type(demos).__name__ == "LeRobotDemos" and demos.episode_task[2] == "drawer-open"
    sim_reader = read_demos(tmp_path / "img")  # an image dataset with this package's columns: the simulator's reader
    assert type(sim_reader).__name__ == "DemoDataset"
    np.testing.assert_array_equal(sim_reader.state, img.state)
    np.testing.assert_array_equal(sim_reader.images["wrist"], img.images["wrist"])
    assert sim_reader.episode_task == img.episode_task and sim_reader.tasks == img.tasks

    class Pre:  # hands back what the batcher gives the preprocessor
        stats = NormStats(torch.zeros(4), torch.ones(4), torch.zeros(4), torch.ones(4))

        def __call__(self, frames, state, tasks):
            return frames, state, tasks

    pre = Pre()
    b = ChunkBatcher(demos, ["observation.images.scene", "observation.images.wrist"], 16, 32, pre)
    batch = b.batch(np.array([0, len(demos) - 1]))
    frames, state, tasks = batch.inputs
    assert frames["observation.images.scene"].shape == (2, 3, 24, 32)
    assert torch.equal(state, torch.from_numpy(demos.state[[0, -1]]))
    assert tasks == ["Reach the red target.", "Open the drawer."]
    assert batch.is_pad[1, 1:].all() and not batch.is_pad[0].any()


def test_cli_converts_and_reports(tmp_path, capsys):
    bag = make_bag(tmp_path, "cli", storage="mcap", episodes=(("reach", 1.0),))
    rc = bag_main(["to-dataset", str(bag), "--out", str(tmp_path / "out"), "--fps", "10", "--chunk-size", "8",
                   "--vcodec", "h264"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "1 episodes" in out.out and "split by events" in out.out and "skew p50" in out.out
    assert "frames:" in out.err  # progress
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["fps"] == 10 and info["features"]["observation.images.scene"]["info"]["video.codec"] == "h264"
    assert probe_video(tmp_path / "out/videos/observation.images.scene/chunk-000/file-000.mp4")["codec"] == "h264"
    rc = bag_main(["to-dataset", str(bag), "--out", str(tmp_path / "out")])
    assert rc == 2 and "already exists" in capsys.readouterr().err


def test_a_few_training_steps_on_a_converted_video_dataset_load_in_the_engine(converted, tmp_path):
    """edgefm-vla train's path: read_demos -> train (tiny, from scratch) -> a checkpoint the Engine runs."""
    from edgefm_ros.runtime.engine import Engine
    from edgefm_ros.training.data import read_demos
    from edgefm_ros.training.recipe import TrainConfig
    from edgefm_ros.training.trainer import train

    d, _, _ = converted
    demos = read_demos(d / "ds")
    r = train(demos, tmp_path / "ck", TrainConfig(steps=2, batch_size=2, log_every=1, save_every=0, threads=1),
              arch="tiny", log=lambda s: None)
    assert r.steps == 2 and np.isfinite(r.final_loss)
    eng = Engine.from_checkpoint(r.out)
    assert sorted(eng.model_config.camera_keys) == ["observation.images.scene", "observation.images.wrist"]
    from edgefm_ros.types import Observation

    obs = Observation({f"observation.images.{c}": demos.images[c][5] for c in ("scene", "wrist")}, demos.state[5],
                      demos.tasks[0])
    chunk = eng.predict(obs)
    assert chunk.actions.shape == (eng.model_config.chunk_size, 4) and np.isfinite(chunk.actions).all()

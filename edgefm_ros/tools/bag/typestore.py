"""The rosbags type store: ROS 2 Jazzy's message types plus edgefm_ros/msg/* read from the .msg files."""
from __future__ import annotations

from pathlib import Path

from rosbags.typesys import Stores, get_types_from_msg, get_typestore

PACKAGE = "edgefm_ros"


def msg_dir() -> Path:
    """msg/ of the source tree, else the installed share/edgefm_ros/msg."""
    src = Path(__file__).resolve().parents[3] / "msg"
    if src.is_dir():
        return src
    try:  # ament_index_python: only in a ROS install
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE)) / "msg"
    except Exception as e:  # no ament index: a pip-only install
        raise FileNotFoundError(f"edgefm_ros msg/ directory not found (looked in {src}): {e}") from e


def make_typestore(require_ours: bool = False):
    """Jazzy's types plus edgefm_ros/msg/*; without the .msg files (a pip-only install) only Jazzy's,
    unless ``require_ours``."""
    ts = get_typestore(Stores.ROS2_JAZZY)
    types = {}
    try:
        d = msg_dir()
    except FileNotFoundError:
        if require_ours:
            raise
        return ts
    for f in sorted(d.glob("*.msg")):
        types.update(get_types_from_msg(f.read_text(), f"{PACKAGE}/msg/{f.stem}"))
    if not types:
        raise FileNotFoundError(f"no .msg files in {d}")
    ts.register(types)
    return ts

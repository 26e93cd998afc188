"""Where the simulation's shipped files are: the source tree first, else the installed share/edgefm_ros."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def share_file(*parts: str) -> Path:
    """A file of the source tree, else of the installed share/edgefm_ros (the tree's path when neither has it,
    so the caller's error names the expected place)."""
    p = REPO.joinpath(*parts)
    if p.exists():
        return p
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory("edgefm_ros")).joinpath(*parts)
    except Exception:  # noqa: BLE001 - not installed: the caller says what is missing
        return p


def default_checkpoint() -> Path:
    """The committed trained checkpoint (checkpoints/smolvla-metaworld)."""
    return share_file("checkpoints", "smolvla-metaworld")

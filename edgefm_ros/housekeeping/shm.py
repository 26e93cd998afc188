"""Fast DDS shared-memory files in /dev/shm that no live process uses, found and removed.

Fast DDS (Jazzy: 2.14) gives every participant a segment ``fastrtps_<16 hex>`` with a lock file
``<segment>_el`` that the owner holds (flock) while it lives, and every listening port a segment
``fastrtps_port<N>`` with a lock file ``_el`` (or ``_sl``) and a named semaphore ``sem.fastrtps_port<N>_mutex``.
The participant's own destructor removes them; a process killed by SIGKILL, the OOM killer or a crash,
or one that exits without finalizers while its participant is alive, leaves them behind (a segment is
32 MiB with config/fastdds_shm.xml).

``clean()`` first runs Fast DDS's own clean-up (``fastdds shm clean``: a file whose lock nobody holds is
a zombie) where the tool is installed, and applies the same lock rule itself where it is not. Fast DDS's
rule only finds files through their lock files; a port segment left without one (its listener gone, the
last writer exited) stays forever, so a second pass removes ``fastrtps_port<N>`` files that have no lock
file and that no live process maps, with their semaphores. A file some process maps is never removed.

    python -m edgefm_ros.housekeeping.shm            # clean, and print what was removed
    python -m edgefm_ros.housekeeping.shm --dry-run  # only list what would be removed
"""
from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from edgefm_ros.housekeeping.cli import cli_main

SHM_DIR = Path("/dev/shm")
SEGMENT = re.compile(r"^fastrtps_[0-9a-z]{16}$")
PORT = re.compile(r"^fastrtps_port\d{1,5}$")
LOCK_SUFFIXES = ("_el", "_sl")
FASTDDS_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Usage:
    """Fast DDS's files in the directory: how many and how many bytes."""
    files: int
    bytes: int

    @property
    def mb(self) -> float:
        return self.bytes / 1e6


@dataclass
class CleanResult:
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    fastdds_tool: bool = False  # `fastdds shm clean` ran

    def summary(self) -> str:
        how = "fastdds shm clean + unmapped lock-less ports" if self.fastdds_tool else "lock and mapping rules"
        return f"removed {len(self.removed)} stale Fast DDS files ({self.removed_bytes / 1e6:.1f} MB; {how})"


def is_fastdds_file(name: str) -> bool:
    return name.startswith("fastrtps_") or (name.startswith("sem.fastrtps_") and name.endswith("_mutex"))


def usage(shm_dir: str | Path = SHM_DIR) -> Usage:
    files = nbytes = 0
    for p in _entries(shm_dir):
        if is_fastdds_file(p.name):
            try:
                nbytes += p.stat().st_blocks * 512  # what the file takes in memory (tmpfs), not its length
            except FileNotFoundError:
                continue
            files += 1
    return Usage(files, nbytes)


def lock_held(path: str | Path) -> bool:
    """Some process holds the flock of this lock file. Probing takes the lock for an instant, as Fast DDS's
    own tool does; a file gone meanwhile counts as not held."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the probe's lock


def mapped_names(shm_dir: str | Path = SHM_DIR, exclude_pids=()) -> set[str]:
    """Names of the files in ``shm_dir`` that some live process maps (from every readable /proc/<pid>/maps),
    not counting ``exclude_pids``."""
    return set().union(*mappers(None, shm_dir, exclude_pids).values())


def mapped_by(pids, shm_dir: str | Path = SHM_DIR) -> set[str]:
    """The Fast DDS files in ``shm_dir`` that any of ``pids`` maps: what a group of processes uses, whatever
    other programs on the machine do."""
    prefix = str(Path(shm_dir)) + "/"
    return {n for pid in pids for n in _maps_of(pid, prefix) if is_fastdds_file(n)}


def _maps_of(pid, prefix: str) -> set[str]:
    """Names of the files under ``prefix`` that process ``pid`` maps (empty when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line[line.find(prefix) + len(prefix):].rstrip("\n").removesuffix(" (deleted)")
                    for line in f if prefix in line}
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return set()


def mappers(names, shm_dir: str | Path = SHM_DIR, exclude_pids=()) -> dict[int, set[str]]:
    """{pid: which of ``names`` (files in ``shm_dir``; None: any) it maps}, for every live process that maps
    any of them, not counting ``exclude_pids``."""
    prefix, want = str(Path(shm_dir)) + "/", None if names is None else set(names)
    skip = {int(p) for p in exclude_pids}
    out: dict[int, set[str]] = {}
    if want is not None and not want:
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        hit = _maps_of(entry, prefix)
        hit = hit if want is None else hit & want
        if hit:
            out[int(entry)] = hit
    return out


def unlocked_ports(shm_dir: str | Path = SHM_DIR) -> list[str]:
    """Port segments in ``shm_dir`` without a lock file (no listener: only writers map them)."""
    names = {p.name for p in _entries(Path(shm_dir))}
    return sorted(n for n in names if PORT.match(n) and not any(n + s in names for s in LOCK_SUFFIXES))


def size_mb(names, shm_dir: str | Path = SHM_DIR) -> float:
    """Memory the named files take (tmpfs blocks), MB."""
    total = 0
    for n in names:
        try:
            total += (Path(shm_dir) / n).stat().st_blocks * 512
        except FileNotFoundError:
            continue
    return total / 1e6


def owned_by(pid: int, shm_dir: str | Path = SHM_DIR) -> list[str]:
    """The segments and ports whose lock file process ``pid`` holds (from /proc/locks): the files Fast DDS
    must remove when that process's participants go."""
    d = Path(shm_dir)
    by_inode = {}
    for p in _entries(d):
        if p.name.endswith(LOCK_SUFFIXES) and is_fastdds_file(p.name):
            try:
                by_inode[p.stat().st_ino] = p.name[:-3]
            except FileNotFoundError:
                continue
    out = set()
    with open("/proc/locks") as f:
        for line in f:
            # "1: FLOCK  ADVISORY  WRITE 1234 00:1c:5678 0 EOF" (a blocked waiter's line has "->" first)
            fields = line.replace("->", "").split()
            if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit() or int(fields[4]) != pid:
                continue
            inode = int(fields[5].rsplit(":", 1)[1])
            if inode in by_inode:
                out.add(by_inode[inode])
    return sorted(out)


def remove_owned(pid: int, shm_dir: str | Path = SHM_DIR, names: Sequence[str] | None = None) -> list[str]:
    """Unlink the files process ``pid`` owns (``owned_by``), with their lock files and port semaphores: for a
    process about to die without running Fast DDS's destructors. Processes that map them keep their
    mappings; the memory goes with the last of those. ``names``: ``owned_by(pid)`` found earlier, when
    there is no time to look now."""
    d = Path(shm_dir)
    out = []
    for name in owned_by(pid, d) if names is None else names:
        for n in (name, *(name + s for s in LOCK_SUFFIXES), f"sem.{name}_mutex"):
            try:
                (d / n).unlink()
                out.append(n)
            except (FileNotFoundError, PermissionError):
                pass
    return out


def stale(shm_dir: str | Path = SHM_DIR, exclude_pids=()) -> list[str]:
    """Fast DDS files no live process uses: a segment or port whose lock file nobody holds (with the lock
    file and, for a port, its semaphore), and a port without a lock file that no process maps.
    ``exclude_pids``: processes whose mappings do not count (the caller itself, once its participant is gone
    and it is about to exit: a port it wrote to while leaving stays mapped by it until it ends)."""
    d = Path(shm_dir)
    names = {p.name for p in _entries(d)}
    out: list[str] = []
    mapped: set[str] | None = None
    for name in sorted(names):
        if not (SEGMENT.match(name) or PORT.match(name)):
            continue
        locks = [name + s for s in LOCK_SUFFIXES if name + s in names]
        if locks:
            if any(lock_held(d / lock) for lock in locks):
                continue
        else:
            if SEGMENT.match(name):
                continue  # a participant creates its lock file first: a segment without one is being made
            mapped = mapped_names(d, exclude_pids) if mapped is None else mapped
            if name in mapped:
                continue
        out += [name, *locks]
        if PORT.match(name) and f"sem.{name}_mutex" in names:
            out.append(f"sem.{name}_mutex")
    # lock files whose segment is gone already (a half-finished clean-up)
    for name in sorted(names):
        base = next((name[:-3] for s in LOCK_SUFFIXES if name.endswith(s)), None)
        if base and (SEGMENT.match(base) or PORT.match(base)) and base not in names and not lock_held(d / name):
            out.append(name)
    return out


def clean(shm_dir: str | Path = SHM_DIR, use_tool: bool = True, dry_run: bool = False,
          exclude_pids=()) -> CleanResult:
    """Remove Fast DDS files no live process uses (see the module's docstring; ``exclude_pids`` as in
    ``stale``); never raises for a file that vanished or could not be removed (another cleaner, another
    user's file)."""
    d = Path(shm_dir)
    before = _sizes(d)
    result = CleanResult()
    tool = shutil.which("fastdds") if use_tool and d == SHM_DIR else None
    if tool and not dry_run:
        try:
            subprocess.run([tool, "shm", "clean"], capture_output=True, timeout=FASTDDS_TIMEOUT_S, check=False,
                           env=_without_bootstrap_guard())
            result.fastdds_tool = True
        except (OSError, subprocess.TimeoutExpired):
            pass
    for name in stale(d, exclude_pids):
        if dry_run:
            result.removed.append(name)
            continue
        try:
            (d / name).unlink()
        except (FileNotFoundError, PermissionError):
            pass
    if dry_run:
        result.removed_bytes = sum(before.get(n, 0) for n in result.removed)
        return result
    after = _sizes(d)
    result.removed += sorted(n for n in before if n not in after)
    result.removed = sorted(set(result.removed))
    result.removed_bytes = sum(before[n] for n in result.removed if n in before)
    return result


def _entries(shm_dir: str | Path) -> list[Path]:
    try:
        return list(Path(shm_dir).iterdir())
    except FileNotFoundError:
        return []


def _sizes(d: Path) -> dict[str, int]:
    out = {}
    for p in _entries(d):
        if is_fastdds_file(p.name):
            try:
                out[p.name] = p.stat().st_blocks * 512
            except FileNotFoundError:
                pass
    return out


def _without_bootstrap_guard() -> dict:
    # the fastdds tool is a Python script of the venv; the ROS wheels' bootstrapper must run in it again
    return {k: v for k, v in os.environ.items() if k != "_ROS_WHEELS_BOOTSTRAP_COMPLETE"}


@cli_main("edgefm-shm-clean")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="edgefm-shm-clean", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=str(SHM_DIR), help="shared-memory directory (default /dev/shm)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p.add_argument("--no-tool", action="store_true", help="do not run `fastdds shm clean`, only our own rules")
    a = p.parse_args(argv)
    before = usage(a.dir)
    r = clean(a.dir, use_tool=not a.no_tool, dry_run=a.dry_run)
    for name in r.removed:
        print(("would remove " if a.dry_run else "removed ") + name)
    after = usage(a.dir)
    print(f"{r.summary()}; Fast DDS files {before.files} ({before.mb:.1f} MB) -> {after.files} ({after.mb:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The shared-memory clean-up's rules on real files and real locks in a private directory: a file whose lock
nobody holds goes, with its lock file and semaphore; a locked one, a mapped lock-less port and a segment
still being made stay."""
from __future__ import annotations

import fcntl
import mmap
import os
import secrets

import pytest

from edgefm_ros.housekeeping import shm


def _segment(d, locked_fd_store=None, size=4096):
    name = f"fastrtps_{secrets.token_hex(8)}"
    (d / name).write_bytes(os.urandom(size))
    (d / (name + "_el")).write_bytes(b"")
    if locked_fd_store is not None:
        fd = os.open(d / (name + "_el"), os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked_fd_store.append(fd)
    return name


def _port(d, n, lock=False):
    name = f"fastrtps_port{n}"
    (d / name).write_bytes(os.urandom(4096))
    (d / f"sem.{name}_mutex").write_bytes(b"\0" * 32)
    if lock:
        (d / (name + "_el")).write_bytes(b"")
    return name


def test_clean_removes_only_what_no_process_uses(tmp_path):
    held: list[int] = []
    dead = _segment(tmp_path)
    live = _segment(tmp_path, held)
    making = f"fastrtps_{secrets.token_hex(8)}"  # no lock file yet: a participant in the middle of creating it
    (tmp_path / making).write_bytes(b"x")
    port_dead = _port(tmp_path, 7001, lock=True)
    port_orphan = _port(tmp_path, 7002)  # no lock file, nobody maps it
    port_mapped = _port(tmp_path, 7003)  # no lock file, but this process maps it
    orphan_lock = f"fastrtps_{secrets.token_hex(8)}_el"
    (tmp_path / orphan_lock).write_bytes(b"")
    other = tmp_path / "not_fastdds"
    other.write_bytes(b"keep")
    f = open(tmp_path / port_mapped, "r+b")
    m = mmap.mmap(f.fileno(), 0)
    try:
        assert sorted(shm.stale(tmp_path)) == sorted(shm.clean(tmp_path, dry_run=True).removed)
        # a process leaving (its participant gone) does not count its own mappings: the mapped port is stale
        # to it, and to nobody else
        assert set(shm.stale(tmp_path, exclude_pids=(os.getpid(),))) == \
            set(shm.stale(tmp_path)) | {port_mapped, f"sem.{port_mapped}_mutex"}
        assert port_mapped not in shm.stale(tmp_path, exclude_pids=(os.getppid(),))
        assert shm.mapped_by([os.getpid()], tmp_path) == {port_mapped}
        assert shm.size_mb([port_mapped], tmp_path) == pytest.approx(4096 / 1e6)
        before = shm.usage(tmp_path)
        r = shm.clean(tmp_path, use_tool=False)
        gone = {dead, dead + "_el", port_dead, port_dead + "_el", f"sem.{port_dead}_mutex",
                port_orphan, f"sem.{port_orphan}_mutex", orphan_lock}
        assert set(r.removed) == gone
        left = {p.name for p in tmp_path.iterdir()}
        assert not (gone & left)
        assert {live, live + "_el", making, port_mapped, f"sem.{port_mapped}_mutex", "not_fastdds"} <= left
        after = shm.usage(tmp_path)
        assert after.files == before.files - len(gone) and r.removed_bytes == before.bytes - after.bytes > 0
        # once its lock is released, the live one is stale too
        os.close(held.pop())
        assert shm.clean(tmp_path, use_tool=False).removed == sorted([live, live + "_el"])
    finally:
        m.close()
        f.close()
        for fd in held:
            os.close(fd)


def test_owned_by_finds_the_holder_of_each_lock(tmp_path):
    held: list[int] = []
    mine = _segment(tmp_path, held)
    free = _segment(tmp_path)
    try:
        owned = shm.owned_by(os.getpid(), tmp_path)
        assert mine in owned and free not in owned
        assert shm.owned_by(1 if os.getpid() != 1 else 2, tmp_path) == []
    finally:
        for fd in held:
            os.close(fd)


def test_cli_dry_run_lists_and_removes_nothing(tmp_path, capsys):
    dead = _segment(tmp_path)
    assert shm.main(["--dir", str(tmp_path), "--dry-run", "--no-tool"]) == 0
    out = capsys.readouterr().out
    assert f"would remove {dead}" in out and (tmp_path / dead).exists()
    assert shm.main(["--dir", str(tmp_path), "--no-tool"]) == 0
    assert not (tmp_path / dead).exists()

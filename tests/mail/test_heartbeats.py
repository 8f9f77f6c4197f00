"""One heartbeat per process, whatever the number of leases it holds: renewing costs one
syscall a second, and a holder that stops renewing is still seen as gone."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from teamrt.mail import FileStore
from teamrt.mail.filestore.leases import HEARTBEAT_PREFIX
from teamrt.mail.store import LEASE_STALE_AFTER

MEMBERS = [f"m{i}" for i in range(50)]


async def test_many_leases_share_one_heartbeat_file(tmp_path: Path) -> None:
    team = tmp_path / "t"
    holder, other = FileStore(team), FileStore(team)
    await holder.open(MEMBERS)
    await other.open([])
    leases = [await holder.acquire_lease(name, f"pid {os.getpid()}, {name}") for name in MEMBERS]
    beats = [p for p in (team / "agents").iterdir() if p.name.startswith(HEARTBEAT_PREFIX)]
    assert len(beats) == 1  # one file for 50 leases
    (beat,) = beats
    lease_files = [team / "agents" / f"{name}.lease" for name in MEMBERS]
    assert all(f"heartbeat {beat.name}" in f.read_text() for f in lease_files)

    long_ago = time.time() - 10 * LEASE_STALE_AFTER
    for path in [beat, *lease_files]:
        os.utime(path, (long_ago, long_ago))
    assert await other.member_alive("m7") is False  # the heartbeat stopped: gone
    await holder.renew_leases()
    assert await other.member_alive("m7") is True
    assert beat.stat().st_mtime > long_ago
    assert all(f.stat().st_mtime == long_ago for f in lease_files)  # not one touched

    for lease in leases:
        await lease.release()
    await holder.close()
    assert not beat.exists()  # a store that closes removes its heartbeat file
    await other.close()


async def test_a_lease_file_without_a_heartbeat_line_beats_by_its_own_time(tmp_path: Path) -> None:
    """The older format: a holder that names no heartbeat file refreshes the lease file."""
    team = tmp_path / "t"
    store = FileStore(team)
    await store.open(["w"])
    (team / "agents").mkdir(exist_ok=True)
    path = team / "agents" / "w.lease"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"pid 1, an older teamrt\n")
        assert await store.member_alive("w") is True
        long_ago = time.time() - 10 * LEASE_STALE_AFTER
        os.utime(path, (long_ago, long_ago))
        assert await store.member_alive("w") is False
    finally:
        os.close(fd)
    await store.close()


async def test_old_heartbeat_files_of_gone_processes_are_removed(tmp_path: Path) -> None:
    team = tmp_path / "t"
    store = FileStore(team)
    await store.open(["w"])
    (team / "agents").mkdir(exist_ok=True)
    stale = team / "agents" / f"{HEARTBEAT_PREFIX}1-deadbeef"
    recent = team / "agents" / f"{HEARTBEAT_PREFIX}2-feedface"
    for path, age in ((stale, 2 * 86400), (recent, 60)):
        path.touch()
        os.utime(path, (time.time() - age, time.time() - age))
    lease = await store.acquire_lease("w", "me")
    assert not stale.exists()
    assert recent.exists()  # another process may still be running
    await lease.release()
    await store.close()

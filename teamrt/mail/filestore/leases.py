"""Member lease files on disk, read and written without a store object: who holds a member's
lease, its holder line and heartbeat.

`FileStore` takes and renews leases with these; `FileView` and tools (which hold no lease) ask
them who runs a member. A lease is `agents/<name>.lease`, flocked by its holder for as long as it
runs; its first line names the holder, its second the holder's heartbeat file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from teamrt.mail.filestore.fileio import O_READ

#: A process that holds leases keeps one heartbeat file in agents/ (`.heartbeat-<pid>-<tag>`)
#: whose modification time it refreshes every second, whatever the number of leases; each lease
#: file names it on its second line. Files of processes long gone are removed after a day.
HEARTBEAT_PREFIX = ".heartbeat-"


def read_lease(fd: int) -> tuple[str, str | None]:
    """A lease file's holder line and the name of the heartbeat file it names (None in the
    older format, where the lease file's own modification time is the heartbeat)."""
    text = os.pread(fd, 512, 0).decode(errors="replace")
    holder, _, rest = text.partition("\n")
    beat = rest.strip().removeprefix("heartbeat ")
    valid = beat.startswith(HEARTBEAT_PREFIX) and "/" not in beat and beat != rest.strip()
    return holder.strip() or "unknown holder", beat if valid else None


def probe_lease(path: Path) -> tuple[str, float] | None:
    """The holder's line and its heartbeat (the modification time of the heartbeat file the
    lease names, or of the lease file in the older format) if a process holds the lease at
    `path`, else None (the file missing, or its lock free). Takes the lock for an instant only
    when it is free; never blocks."""
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, beat = read_lease(fd)
            if beat is None:
                return holder, os.fstat(fd).st_mtime
            try:
                return holder, os.stat(path.parent / beat, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                return holder, 0.0  # its heartbeat is gone: a holder that stopped beating
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def lease_holder(team_dir: Path, name: str) -> str | None:
    """Who runs member `name` now ("pid N, incarnation ID"), or None if nobody holds its lease."""
    held = probe_lease(Path(team_dir) / "agents" / f"{name}.lease")
    return held[0] if held is not None else None


def lock_exclusive(fd: int) -> None:
    """An exclusive flock without blocking; a few short retries ride over a liveness probe,
    which holds a shared lock on the lease file for microseconds."""
    for _ in range(20):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.001)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def describe(fd: int, holder: str, heartbeat: str | None = None) -> None:
    """Write who holds a lease into its file (for the error the next claimant sees), and the
    holder's heartbeat file."""
    text = f"{holder}\n" + (f"heartbeat {heartbeat}\n" if heartbeat is not None else "")
    with contextlib.suppress(OSError):  # only a description: a full disk must not stop us
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)

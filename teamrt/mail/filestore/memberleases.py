"""`MemberLeases`: the lease files a `FileStore` holds flocked, and its one heartbeat file.

The lease files themselves (who holds one, its holder line and heartbeat) are leases.py's; this
owner takes and drops the flocks of the members this store object runs and keeps their
heartbeat fresh.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio.lowlevel

from teamrt.errors import MemberBusy
from teamrt.mail.filestore.descriptors import BUDGET, open_file
from teamrt.mail.filestore.fileio import check_directory, translate
from teamrt.mail.filestore.leases import (
    HEARTBEAT_PREFIX,
    describe,
    lock_exclusive,
    probe_lease,
    read_lease,
)
from teamrt.mail.store import LEASE_STALE_AFTER, LeaseRecord
from teamrt.names import validate_name

#: Lease heartbeats renewed between two turns of the event loop.
_RENEW_BATCH = 256
_HEARTBEAT_FILES_KEPT = 24 * 3600.0


class MemberLeases:
    """The leases of one store object under `agents/` (see the module docstring).

    `make_directory` makes `agents/` with the team's mode when the first lease is taken."""

    def __init__(
        self,
        agents: Path,
        *,
        team: str,
        file_mode: int,
        shared_group: bool,
        make_directory: Callable[[Path], None],
    ) -> None:
        self.agents = agents
        self.team = team
        self.file_mode = file_mode
        self.shared_group = shared_group
        self._make_directory = make_directory
        self._heartbeat_fd = -1  # this store object's heartbeat file (see HEARTBEAT_PREFIX)
        self.heartbeat_name: str | None = None

    def lock(self, name: str, holder: str) -> int:
        """An flock on `agents/<name>.lease`, held for as long as the member runs; the file
        names the holder (pid and incarnation) for the error the next claimant sees. Returns
        the lease file's descriptor."""
        try:
            self._make_directory(self.agents)
            check_directory(self.agents, shared_group=self.shared_group)
            fd = open_file(
                self.agents / f"{validate_name(name)}.lease",
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                self.file_mode,
            )
            if self.shared_group:
                os.fchmod(fd, self.file_mode)
        except OSError as exc:
            raise translate(exc, f"take {name}'s lease") from None
        try:
            lock_exclusive(fd)
        except BlockingIOError:
            current = read_lease(fd)[0]
            os.close(fd)
            raise MemberBusy(
                f"member {name!r} of team {self.team!r} is already running ({current})"
            ) from None
        describe(fd, holder, self.heartbeat())
        BUDGET.pin(1)  # held while the member runs: the budget leaves room for it
        return fd

    def heartbeat(self) -> str | None:
        """This store object's heartbeat file (made with its first lease), by name; None if it
        cannot be made (the lease file's own time is the heartbeat then)."""
        if self.heartbeat_name is not None:
            return self.heartbeat_name
        name = f"{HEARTBEAT_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        try:
            fd = os.open(
                self.agents / name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                self.file_mode,
            )
        except OSError:
            return None
        self._heartbeat_fd, self.heartbeat_name = fd, name
        self._remove_old_heartbeats()
        return name

    def _remove_old_heartbeats(self) -> None:
        """Heartbeat files of processes gone for a day (a killed process leaves its file)."""
        cutoff = time.time() - _HEARTBEAT_FILES_KEPT
        with contextlib.suppress(OSError), os.scandir(self.agents) as entries:
            for entry in entries:
                if entry.name.startswith(HEARTBEAT_PREFIX) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(entry.path)

    def describe(self, fd: int, holder: str) -> None:
        """Name a new holder in the lease file `fd`, with this store object's heartbeat."""
        describe(fd, holder, self.heartbeat_name)

    def unlock(self, fd: int) -> None:
        """Drop the lease whose file is `fd` (the file stays, empty)."""
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing drops the flock
        BUDGET.pin(-1)

    def alive(self, name: str) -> bool | None:
        """Whether another holder of `name`'s lease runs: see `Store.member_alive`."""
        path = self.agents / f"{validate_name(name)}.lease"
        try:
            held = probe_lease(path)
        except OSError:
            return None
        if held is None:
            return False if path.exists() else None
        return time.time() - held[1] < LEASE_STALE_AFTER

    async def renew(self, table: dict[str, LeaseRecord]) -> None:
        """Refresh the heartbeat of the leases in `table` (this store object's): one file
        whatever their number, else the lease files of leases taken without one, their own
        modification time, `_RENEW_BATCH` at a time between which other tasks run."""
        if not table:
            return
        if self._heartbeat_fd >= 0:
            with contextlib.suppress(OSError):  # a heartbeat must never fail a process
                os.utime(self._heartbeat_fd)
            return
        for count, record in enumerate(list(table.values()), 1):
            if table.get(record.name) is not record:
                continue  # released meanwhile: its descriptor is closed, maybe reused
            token = record.token
            if isinstance(token, int):
                try:  # noqa: SIM105 -- per lease held: suppress() would cost a third more
                    os.utime(token)
                except OSError:  # a heartbeat must never fail a process
                    pass
            if count % _RENEW_BATCH == 0:
                await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        """Remove the heartbeat file (when no lease is held any more)."""
        if self._heartbeat_fd >= 0:
            os.close(self._heartbeat_fd)
            with contextlib.suppress(OSError):
                os.unlink(self.agents / str(self.heartbeat_name))
            self._heartbeat_fd, self.heartbeat_name = -1, None

"""`FileStore`: the team directory, its roster, member leases, and the watch for other writers.

The roster (`team.json`, see roster.py) is changed under an flock on `team.lock` and replaced by
rename. The team directory and its subdirectories are checked before anything is read or written
in them. The cold concerns have owners of their own: the watch (inboxwatch.py), the leases held
and their heartbeat (memberleases.py), the budget ledger (ledger.py), task records (tasks.py).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskStatus

from teamrt.errors import (
    MemberBusy,
    StoreError,
    UnknownRecipient,
    UsageError,
)
from teamrt.mail import inotify
from teamrt.mail.filestore.appender import Appender
from teamrt.mail.filestore.blobs import BLOBS, read_blob, write_blob
from teamrt.mail.filestore.descriptors import InFlight
from teamrt.mail.filestore.fileio import (
    DIR_MODE,
    FILE_MODE,
    SHARED_DIR_MODE,
    SHARED_FILE_MODE,
    check_directory,
    fsync_dir,
    replace_file,
    touch,
    translate,
)
from teamrt.mail.filestore.inboxwatch import InboxWatch
from teamrt.mail.filestore.leases import (
    probe_lease,
)
from teamrt.mail.filestore.ledger import read_ledger, update_ledger
from teamrt.mail.filestore.memberleases import MemberLeases
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.reader import FileReader
from teamrt.mail.filestore.roster import (  # the two constants' old import path, kept
    DEFAULT_SEGMENT_BYTES as DEFAULT_SEGMENT_BYTES,
)
from teamrt.mail.filestore.roster import (
    ROSTER_FORMAT as ROSTER_FORMAT,
)
from teamrt.mail.filestore.roster import (
    Roster,
    check_not_renamed,
    new_roster,
    parse_roster,
    read_roster,
)
from teamrt.mail.filestore.tasks import TaskRecords
from teamrt.mail.log import DEFAULT_MAX_LINE, Cursor
from teamrt.mail.signing import check_key
from teamrt.mail.store import (
    DEFAULT_MAX_BLOB,
    DEFAULT_MAX_ENVELOPE,
    Capabilities,
    Durability,
    LeaseRecord,
    Store,
    TeamView,
)
from teamrt.names import validate_name
from teamrt.private_files import make_dirs


def _shared_from_env() -> bool:
    return os.environ.get("TEAMRT_SHARED_GROUP", "") not in ("", "0")


class FileStore(Store):
    """Inboxes as JSON Lines files under one team directory (see mailboxes/README.md).

    `path` is the team directory; its last component is the team name. Local file systems only:
    on NFS neither O_APPEND nor flock is reliable. The directory must belong to this user and be
    writable by nobody else; `shared_group=True` (or `TEAMRT_SHARED_GROUP=1`) accepts a team
    directory shared by one group instead (group-writable, never world-writable).
    """

    capabilities = Capabilities(shared=True, opens_locally=True, leases_die_with_process=True)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "none",
        segment_bytes: int | None = None,
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        max_blob: int = DEFAULT_MAX_BLOB,
        create: bool = True,
        shared_group: bool | None = None,
    ) -> None:
        if durability not in ("none", "fsync"):
            raise UsageError(f"durability must be 'none' or 'fsync', not {durability!r}")
        self.path = Path(path)
        self.team = validate_name(self.path.name, what="team name")
        self.team_bytes = self.team.encode()
        self.inboxes = self.path / "inboxes"
        self.agents = self.path / "agents"
        self.durability: Durability = durability
        # fixed for the team when it is created (team.json), so every process agrees on them
        self.segment_bytes = segment_bytes or DEFAULT_SEGMENT_BYTES
        self.max_envelope = max_envelope
        self.max_line = max(DEFAULT_MAX_LINE, max_envelope + 256)
        self.max_blob = max_blob  # this process's limit as a sender (receivers take any size)
        self.create = create
        self.shared_group = _shared_from_env() if shared_group is None else shared_group
        self.dir_mode = SHARED_DIR_MODE if self.shared_group else DIR_MODE
        self.file_mode = SHARED_FILE_MODE if self.shared_group else FILE_MODE
        self.needs_polling = not inotify.available()
        self._roster: tuple[str, ...] = ()
        self._roster_mtime = -1
        self._appenders: dict[str, Appender] = {}
        self._sealed_by_dropped: dict[str, int] = {}  # torn tails sealed by dropped appenders
        self.in_flight = InFlight()  # sends and commits holding descriptors in a thread
        self.watcher = InboxWatch(self, self.inboxes)
        self.leases = MemberLeases(
            self.agents,
            team=self.team,
            file_mode=self.file_mode,
            shared_group=self.shared_group,
            make_directory=self.make_directory,
        )

    def inbox_paths(self, name: str) -> InboxPaths:
        return InboxPaths(self.inboxes, validate_name(name))

    # -- the directory and the roster --

    @property
    def roster_path(self) -> Path:
        return self.path / "team.json"

    def check_directories(self) -> None:
        """Refuse a team directory another user could have prepared or can write."""
        try:
            check_directory(self.path, shared_group=self.shared_group, follow=True)
            for directory in (self.inboxes, self.agents, self.path / BLOBS):
                check_directory(directory, shared_group=self.shared_group)
        except OSError as exc:
            raise translate(exc, f"check team directory {self.path}") from None

    def make_directory(self, path: Path) -> None:
        """Make the directory `path` of this team (if missing) with the team's mode."""
        try:
            path.mkdir(mode=self.dir_mode)
        except FileExistsError:
            return
        if self.shared_group:
            os.chmod(path, self.dir_mode)  # the umask may have taken the group bits

    async def open(self, members: Sequence[str], *, signing: str | None = None) -> None:
        for name in members:
            validate_name(name)
        try:
            if not os.path.lexists(self.roster_path):  # noqa: ASYNC240 -- one stat, cold path
                if not self.create:
                    raise StoreError(f"no team directory at {self.path}", errno=errno.ENOENT)
                make_dirs(self.path.parent)  # 0700 each, whatever the umask
                self.make_directory(self.path)
            self.check_directories()
            self.make_directory(self.inboxes)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise translate(exc, f"open team directory {self.path}") from None
        self._update_roster(members, signing=signing)

    async def members_now(self) -> tuple[str, ...]:
        return self.members(refresh=True)

    def members(self, *, refresh: bool = False) -> tuple[str, ...]:
        if refresh:
            try:
                mtime = self.roster_path.stat().st_mtime_ns
            except FileNotFoundError:
                return self._roster
            except OSError as exc:
                raise translate(exc, f"read {self.roster_path}") from None
            if mtime != self._roster_mtime:
                self._load_roster()
        return self._roster

    async def add_member(self, name: str) -> None:
        validate_name(name)
        if name not in self.members(refresh=True):
            self._update_roster([name])

    def _load_roster(self) -> Roster | None:
        read = read_roster(self.roster_path)
        if read is None:
            return None
        self._roster_mtime, raw = read
        roster = parse_roster(self.roster_path, raw, max_envelope=self.max_envelope)
        self._roster = roster.members
        self.segment_bytes = roster.segment_bytes
        # the team's limit, for every sender and the owner
        self.max_envelope = roster.max_envelope
        self.max_line = max(DEFAULT_MAX_LINE, roster.max_envelope + 256)
        self.signing = roster.signing
        return roster

    def _update_roster(self, add: Sequence[str], *, signing: str | None = None) -> None:
        try:
            self._update_roster_locked(add, signing)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise translate(exc, f"register members of team {self.team!r}") from None

    def _update_roster_locked(self, add: Sequence[str], signing: str | None) -> None:
        """Add members under the roster lock (a cold path: a blocking flock is fine), after
        checking the opener's key against the team's (`signing`, see `Store.open`)."""
        lock_fd = os.open(
            self.path / "team.lock",
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            self.file_mode,
        )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            roster = self._load_roster()
            if roster is None:
                data = new_roster(
                    self.team,
                    segment_bytes=self.segment_bytes,
                    max_envelope=self.max_envelope,
                    signing=signing,
                )
            else:
                data = roster.data
                if signing is not None:
                    check_not_renamed(self.path, roster, signing)
                    check_key(self.team, self.signing, signing)
            members = list(self._roster)
            new = [m for m in dict.fromkeys(add) if m not in members]
            for name in new:  # a missing log of an existing member is damage, not recreated
                paths = InboxPaths(self.inboxes, name)
                for path in (paths.log, paths.lock):
                    touch(path, self.file_mode)
            if not new and os.path.lexists(self.roster_path):
                return
            data["members"] = [*members, *new]
            durable = self.durability == "fsync"
            if durable:
                fsync_dir(self.inboxes)
            replace_file(
                self.roster_path,
                (json.dumps(data, indent=2) + "\n").encode(),
                durable=durable,
                mode=self.file_mode,
            )
            self._load_roster()
        finally:
            os.close(lock_fd)  # drops the flock; the lock file stays

    # -- appending --

    def _appender(self, recipient: str) -> Appender:
        appender = self._appenders.get(recipient)
        if appender is None:
            validate_name(recipient, what="recipient")
            if recipient not in self._roster and recipient not in self.members(refresh=True):
                raise UnknownRecipient(
                    f"no member {recipient!r} in team {self.team!r} "
                    f"(members: {', '.join(self._roster) or 'none'})"
                )
            appender = self._appenders[recipient] = Appender(self, self.inbox_paths(recipient))
        return appender

    def drop_appender(self, appender: Appender) -> None:
        """Forget an appender the descriptor budget closes (the next send opens another)."""
        name = appender.paths.name
        if self._appenders.get(name) is appender:
            del self._appenders[name]
        if appender.sealed:
            self._sealed_by_dropped[name] = self._sealed_by_dropped.get(name, 0) + appender.sealed

    async def append(self, recipient: str, encoded: bytes) -> int:
        appender = self._appenders.get(recipient) or self._appender(recipient)
        if not appender.busy and self.durability == "none":
            # the usual send, in one step: no other task of this process is appending here and
            # no other process holds the lock (append_many's path, without its layers)
            try:
                fcntl.flock(appender.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # held by another process: append_many spins for it, or waits
            else:
                appender.busy = True  # nothing gives its descriptors back under it
                try:
                    return appender.append_locked((encoded,))
                finally:
                    fcntl.flock(appender.lock_fd, fcntl.LOCK_UN)
                    appender.busy = False
        return await self.append_many(recipient, (encoded,))

    async def append_many(self, recipient: str, encoded: Sequence[bytes]) -> int:
        if not encoded:
            return -1
        # its appender may keep its descriptors in a worker thread (waiting for another
        # process's lock, or for the fsync): a turn first (the one-step path never comes here)
        await self.in_flight.enter(recipient)
        try:
            return await self._append_many(recipient, encoded)
        finally:
            self.in_flight.leave(recipient)

    async def _append_many(self, recipient: str, encoded: Sequence[bytes]) -> int:
        appender = self._appender(recipient)
        if appender.busy:
            await appender.take_turn()
        else:
            appender.busy = True
        try:
            if appender.try_lock():
                try:
                    seq = appender.append_locked(encoded)
                finally:
                    appender.unlock()
            else:
                seq = await appender.append_contended(encoded)
            ticket = appender.syncs.ticket() if self.durability == "fsync" else 0
        finally:
            appender.pass_turn()
        if self.durability == "fsync":
            await appender.syncs.wait(ticket)
        return seq

    # -- reading and watching --

    def reader(self, name: str) -> FileReader:
        paths = self.inbox_paths(name)  # validates the name first
        if name not in self._roster and name not in self.members(refresh=True):
            raise UnknownRecipient(f"no member {name!r} in team {self.team!r}")
        try:
            return FileReader(self, paths)
        except OSError as exc:
            raise translate(exc, f"open {name}'s inbox") from None

    def view(self) -> TeamView:
        from teamrt.mail.filestore.view import FileView

        return FileView(self.path)

    async def destroy(self) -> None:
        if not (self.path / "team.json").exists():
            return
        self.check_directories()  # never delete a directory that is not a team's
        for name in self.members(refresh=True):
            if probe_lease(self.agents / f"{name}.lease") is not None:
                raise MemberBusy(f"member {name!r} of team {self.team!r} is running")
        shutil.rmtree(self.path)

    async def tail_reader(self, name: str) -> FileReader:
        reader = self.reader(name)
        paths = reader.paths
        try:
            reader.seek(Cursor(paths.active_index(), os.stat(paths.log).st_size))
        except OSError as exc:
            reader.close()
            if isinstance(exc, StoreError):
                raise
            raise translate(exc, f"read {name}'s inbox") from None
        return reader

    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        await self.watcher.watch(notify, task_status=task_status)

    def watch_inbox(self, name: str) -> None:
        self.watcher.watch_inbox(name)

    def changed_inboxes(self) -> set[str] | None:
        """See `Store.changed_inboxes` and `InboxWatch.changed_inboxes`."""
        return self.watcher.changed_inboxes()

    def watch_count(self) -> int:
        """Inotify watches this store holds (one per inbox it reads, plus the directory)."""
        return self.watcher.count()

    # -- leases --

    async def _lock_member(self, name: str, holder: str) -> tuple[object, int]:
        """See `MemberLeases.lock`. The flock is its own fence (it dies with its process), so
        the fencing token is 0."""
        validate_name(name)
        if name not in self._roster and name not in self.members(refresh=True):
            raise UnknownRecipient(f"no member {name!r} in team {self.team!r}")
        return self.leases.lock(name, holder), 0

    async def _describe_holder(self, record: LeaseRecord, holder: str) -> None:
        assert isinstance(record.token, int)
        self.leases.describe(record.token, holder)

    async def _unlock_member(self, record: LeaseRecord) -> None:
        assert isinstance(record.token, int)
        self.leases.unlock(record.token)

    # -- blobs: the bodies of claim checks, blobs/<sha256> (see blobs.py) --

    async def blob_put(self, digest: str, data: bytes) -> None:
        self.make_directory(self.path / BLOBS)
        durable = self.durability == "fsync"
        await anyio.to_thread.run_sync(
            lambda: write_blob(self.path, digest, data, durable=durable, mode=self.file_mode)
        )

    def blob_get_nowait(self, digest: str) -> bytes | None:
        return read_blob(self.path, digest)

    # -- the budget ledger: budget.json, read-modified-written under budget.lock --

    async def ledger_update(
        self, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        return update_ledger(self.path, change, mode=self.file_mode)

    async def ledger_read(self) -> dict[str, Any] | None:
        return read_ledger(self.path)

    # -- task records: tasks/, see tasks.py --

    async def task_record_create(self, id_: str, record: dict[str, Any]) -> dict[str, Any]:
        return self._tasks().create(id_, record)

    async def task_record_settle(self, id_: str, outcome: dict[str, Any]) -> dict[str, Any] | None:
        return self._tasks().settle(id_, outcome)

    def _tasks(self) -> TaskRecords:
        durable = self.durability == "fsync"
        return TaskRecords(
            self.path / "tasks", durable=durable, mode=self.file_mode, dir_mode=self.dir_mode
        )

    async def member_alive(self, name: str) -> bool | None:
        """See `Store.member_alive`: the lease file's flock says whether a process holds it,
        its modification time is the holder's heartbeat, and a missing file means the member
        never ran here."""
        if self.lease_held(name):
            return True
        return self.leases.alive(name)

    async def renew_leases(self) -> None:
        """Refresh this store object's heartbeat (see `MemberLeases.renew`)."""
        await self.leases.renew(self._lease_table())

    async def close(self) -> None:
        for appender in self._appenders.values():
            appender.close()
        self._appenders.clear()
        if not self._lease_table():
            self.leases.close()
        self.watcher.close()

    def statistics(self) -> dict[str, int]:
        """Torn tails this process sealed, per inbox it wrote to."""
        sealed = dict(self._sealed_by_dropped)
        for name, appender in self._appenders.items():
            sealed[name] = sealed.get(name, 0) + appender.sealed
        return sealed

    def descriptors(self) -> int:
        """Descriptors this store's writers hold (for tests and `teamrt bench`)."""
        return sum(a.held_descriptors for a in self._appenders.values())

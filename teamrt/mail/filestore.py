"""The file store: the only code that touches inbox files and their locks.

Theory of operation. Each inbox is `inboxes/<agent>.jsonl`, appended to under an exclusive flock on
`inboxes/<agent>.lock` (a file that is never deleted). A process keeps the lock and log descriptors
open. Under the lock an append: fstats the log; if the size is not what this process last left
(another process wrote, or a writer died mid-line), reads the tail to seal a torn fragment with a
newline and to recover the next `seq`; rotates the log into a numbered segment past the size limit;
then writes one stamped line, looping over short writes and truncating back to the old size on
any error. The common case is four syscalls (flock, fstat, write, unlock) run inline on the event
loop; only a contended lock goes to a worker thread. In `fsync` mode, senders then share
fdatasync calls (group commit) outside the lock.

Readers take no lock: they pread from their cursor, decode complete lines only, quarantine what
cannot be decoded, and commit the cursor by overwriting the older of its two checksummed slots
(see FileReader.commit). This module must never delete a lock file, truncate below a line
another writer completed, or create an inbox for an unknown name.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import filelock
from anyio.abc import TaskStatus

from teamrt.errors import (
    DiskFull,
    DurabilityError,
    MemberBusy,
    StoreError,
    UnknownRecipient,
    UsageError,
)
from teamrt.mail import inotify
from teamrt.mail.group import GroupCommit
from teamrt.mail.log import (
    DEFAULT_MAX_LINE,
    Corrupt,
    Cursor,
    Frame,
    LineSplitter,
    stamp,
    stamp_many,
)
from teamrt.mail.store import DEFAULT_MAX_ENVELOPE, Durability, InboxReader, Lease, Store
from teamrt.names import validate_name

ROSTER_FORMAT = 1
DEFAULT_SEGMENT_BYTES = 64 << 20
READ_CHUNK = 256 << 10  # small reads keep few decoded envelopes alive (GC cost)
_TAIL_WINDOW = 64 << 10
CURSOR_SLOT = 4096  # one page: a process killed mid-pwrite cannot tear it

_DIR_MODE = 0o700
_FILE_MODE = 0o600
_O_WRITE = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
_O_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_SEQ_AT_LINE_START = re.compile(rb'\{"seq":(\d+),')
_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def _translate(exc: OSError, what: str) -> StoreError:
    """The one place OSErrors become teamrt errors."""
    if exc.errno in _FULL_ERRNOS:
        return DiskFull(exc.errno, f"{what}: {os.strerror(exc.errno)}; nothing was written")
    return StoreError(exc.errno or 0, f"{what}: {exc.strerror or exc}")


def _torn_append_fault() -> tuple[int, int] | None:
    """Crash-test hook: TEAMRT_FAULT=torn-append:<bytes>:<nth> makes the nth append of this
    process write only its first <bytes> bytes and then SIGKILL itself (tests/test_crash.py)."""
    name, _, arg = os.environ.get("TEAMRT_FAULT", "").partition(":")
    if name != "torn-append":
        return None
    nbytes, _, nth = arg.partition(":")
    return int(nbytes), int(nth or 1)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, size: int, what: str, torn_after: int | None = None) -> None:
    """Append `data` whole, or truncate back to `size` and raise: never leave a partial line."""
    view = memoryview(data)
    try:
        if torn_after is not None:  # crash test: write a fragment, then die as if killed
            os.write(fd, view[:torn_after])
            os.kill(os.getpid(), signal.SIGKILL)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        with contextlib.suppress(OSError):  # if this fails, the next writer seals the tail
            os.ftruncate(fd, size)
        raise _translate(exc, what) from None


def _last_seq(fd: int, size: int, window: int = _TAIL_WINDOW) -> int | None:
    """The seq of the last complete, well-formed line, reading backwards from the end.

    `window` is how much to read first: just what other writers added since our last append,
    in the common case, so the locked section stays short under contention.
    """
    while True:
        start = max(0, size - window)
        chunk = os.pread(fd, size - start, start)
        lines = chunk.split(b"\n")
        if start > 0:
            lines = lines[1:]  # may be a partial line: widen the window instead
        for line in reversed(lines):
            m = _SEQ_AT_LINE_START.match(line)
            if m is not None and line.rstrip().endswith(b"}"):
                return int(m.group(1))
        if start == 0:
            return None
        window *= 4


async def _dispatch_forever(watcher: inotify.Inotify, on_overflow: Callable[[], None]) -> None:
    """Dispatch inotify events until cancelled.

    On asyncio the events are read in a reader callback registered once, so a wake-up costs no
    task switch and no epoll registration; other event loops use anyio.wait_readable.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio
        while True:
            await anyio.wait_readable(watcher.fd)
            watcher.read_events(on_overflow)
    loop.add_reader(watcher.fd, watcher.read_events, on_overflow)
    try:
        await anyio.sleep_forever()
    finally:
        loop.remove_reader(watcher.fd)


def read_cursor(path: Path) -> tuple[Cursor, int, int]:
    """The committed cursor in `path`, its generation and its slot size."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Cursor(), 0, CURSOR_SLOT
    found = Cursor.decode_slots(data)
    if found is None:
        raise StoreError(0, f"unreadable cursor {path}: neither slot is valid")
    return found[0], found[1], max(CURSOR_SLOT, len(data) // 2)


@dataclass(frozen=True)
class InboxPaths:
    """Where one agent's files are."""

    dir: Path
    name: str

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.jsonl"

    @property
    def lock(self) -> Path:
        return self.dir / f"{self.name}.lock"

    @property
    def cursor(self) -> Path:
        return self.dir / f"{self.name}.cursor.json"

    @property
    def quarantine(self) -> Path:
        return self.dir / f"{self.name}.quarantine.jsonl"

    def segment(self, index: int) -> Path:
        return self.dir / f"{self.name}.{index:06d}.jsonl"

    def rotated_segments(self) -> list[int]:
        """Indexes of the rotated (closed) segments, oldest first.

        Segments are numbered from 0 without gaps (nothing is ever deleted), so this probes
        names in order instead of listing a directory that holds every member's files.
        """
        count = 0
        while self.segment(count).exists():
            count += 1
        return list(range(count))

    def segments(self) -> list[Path]:
        """Every segment of the log in order, the active file last (for replay and inspect)."""
        return [self.segment(i) for i in self.rotated_segments()] + [self.log]

    def frames(
        self, positions: dict[str, tuple[int, int]] | None = None
    ) -> Iterator[tuple[int, Frame]]:
        """Every complete line of every segment, in file order, as (segment index, frame),
        streamed (for tools that read whole logs). When it ends, the segment and offset after
        the last complete line are left in `positions[name]`."""
        for index, segment in enumerate(self.segments()):
            splitter = LineSplitter()
            try:
                f = segment.open("rb")
            except FileNotFoundError:
                continue
            with f:
                while chunk := f.read(READ_CHUNK):
                    for frame in splitter.feed(chunk):
                        yield index, frame
            if positions is not None:
                positions[self.name] = (index, splitter.position)

    def active_index(self) -> int:
        rotated = self.rotated_segments()
        return rotated[-1] + 1 if rotated else 0


class _Appender:
    """This process's writer for one inbox: held descriptors, the next seq, a turn queue."""

    def __init__(self, store: FileStore, paths: InboxPaths) -> None:
        self.store = store
        self.paths = paths
        self.what = f"append to {paths.name}'s inbox"
        try:
            self.lock_fd = os.open(paths.lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            self.fd = os.open(paths.log, _O_WRITE)
        except FileNotFoundError:
            raise UnknownRecipient(f"{paths.name!r} has no inbox in team {store.team!r}") from None
        except OSError as exc:
            raise _translate(exc, f"open {paths.name}'s inbox") from None
        self.segment = paths.active_index()
        self.known_size = -1  # forces tail recovery on first use
        self.next_seq = 0
        self.sealed = 0  # torn tails this process sealed
        self.busy = False
        self.waiters: deque[anyio.Event] = deque()
        self.retired_fds: list[int] = []
        self.syncs = GroupCommit(self._fdatasync)

    async def _fdatasync(self) -> None:
        """One shared sync (group commit); a failure is reported to every sender it covered."""
        try:
            await anyio.to_thread.run_sync(os.fdatasync, self.fd)
        except OSError as exc:
            raise DurabilityError(
                exc.errno or 0,
                f"{self.what}: fsync failed: {exc.strerror}; the send is not acknowledged",
            ) from None

    # -- turn-taking within this process (the flock does not exclude our own descriptor) --

    async def take_turn(self) -> None:
        turn = anyio.Event()
        self.waiters.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():
                self.pass_turn()
            else:
                self.waiters.remove(turn)
            raise

    def pass_turn(self) -> None:
        if self.waiters:
            self.waiters.popleft().set()  # stays busy: the turn is handed over
        else:
            self.busy = False

    # -- the locked section --

    def try_lock(self) -> bool:
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def append_blocking(self, encoded: Sequence[bytes]) -> int:
        """Wait for the lock, append, unlock (runs in a worker thread under contention)."""
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            return self.append_locked(encoded)
        finally:
            self.unlock()

    def append_locked(self, encoded: Sequence[bytes]) -> int:
        """Append stamped lines for `encoded` in one write; return the first seq (lock held)."""
        store = self.store
        try:
            size = os.fstat(self.fd).st_size
            if size >= store.segment_bytes and self._stale():
                self._reopen()
                size = os.fstat(self.fd).st_size
            if size != self.known_size:
                size = self._recover(size)
            if size >= store.segment_bytes:
                self._rotate()
                size = 0
        except OSError as exc:
            self.known_size = -1
            raise _translate(exc, self.what) from None
        first = self.next_seq
        team = store.team_bytes
        if len(encoded) == 1:
            line = stamp(encoded[0], first, team)
        else:
            line = stamp_many(encoded, first, team)
        torn = None
        if store.fault is not None:
            store.fault_countdown -= 1
            torn = store.fault[0] if store.fault_countdown == 0 else None
        try:
            _write_all(self.fd, line, size, self.what, torn)
        except StoreError:
            self.known_size = -1
            raise
        self.known_size = size + len(line)
        self.next_seq = first + len(encoded)
        return first

    def _recover(self, size: int) -> int:
        """Seal a torn tail left by a dead writer and find the next seq. Returns the new size."""
        if size > 0 and os.pread(self.fd, 1, size - 1) != b"\n":
            _write_all(self.fd, b"\n", size, f"seal torn tail of {self.paths.name}'s inbox")
            size += 1
            self.sealed += 1
        known = self.known_size
        # what others appended since our last append, plus the newline that ended ours
        window = size - known + 1 if 0 < known < size else _TAIL_WINDOW
        last = _last_seq(self.fd, size, window) if size > 0 else None
        if last is None:
            last = self._last_seq_before(self.segment)
        self.next_seq = last + 1
        self.known_size = size
        return size

    def _last_seq_before(self, segment: int) -> int:
        for index in reversed([i for i in self.paths.rotated_segments() if i < segment]):
            fd = os.open(self.paths.segment(index), _O_READ)
            try:
                last = _last_seq(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            if last is not None:
                return last
        return -1

    def _stale(self) -> bool:
        """True if another process rotated the log away from under our descriptor."""
        return os.stat(self.paths.log).st_ino != os.fstat(self.fd).st_ino

    def _reopen(self) -> None:
        self.retired_fds.append(self.fd)
        self.fd = os.open(self.paths.log, _O_WRITE)
        self.segment = self.paths.active_index()
        self.known_size = -1

    def _rotate(self) -> None:
        """Close the full active file as segment N and start a new one (lock held)."""
        if self.store.durability == "fsync":
            os.fdatasync(self.fd)
        os.rename(self.paths.log, self.paths.segment(self.segment))
        fd = os.open(self.paths.log, _O_WRITE | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        if self.store.durability == "fsync":
            _fsync_dir(self.paths.dir)
        self.retired_fds.append(self.fd)
        self.fd = fd
        self.segment += 1
        self.known_size = 0

    def close(self) -> None:
        for fd in [self.fd, self.lock_fd, *self.retired_fds]:
            os.close(fd)
        self.retired_fds.clear()


class FileReader(InboxReader):
    """The owner's reader over one inbox's segments."""

    def __init__(self, store: FileStore, paths: InboxPaths) -> None:
        self.store = store
        self.paths = paths
        self.segment = 0
        self.fd = -1
        self.ino = 0
        self.decoder = LineSplitter(max_line=store.max_line)
        self._quarantined_upto = self._last_quarantined()
        self._cursor_gen = 0
        self._slot_size = CURSOR_SLOT
        self._cursor_fd = -1
        self._log_path = str(paths.log)
        tmp = paths.cursor.with_suffix(".json.tmp")
        if tmp.exists():
            tmp.unlink()  # a commit that died before its rename: the old cursor stands

    def load_cursor(self) -> Cursor:
        cursor, self._cursor_gen, self._slot_size = read_cursor(self.paths.cursor)
        if self._cursor_gen > 0 and self._cursor_fd < 0:
            try:
                self._cursor_fd = os.open(
                    self.paths.cursor, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
                )
            except OSError as exc:
                raise _translate(exc, f"open {self.paths.name}'s cursor") from None
        return cursor

    def seek(self, cursor: Cursor) -> None:
        self._open_segment(cursor.segment)
        self.decoder = LineSplitter(cursor.offset, max_line=self.store.max_line)

    def _open_segment(self, index: int) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        while True:
            rotated = self.paths.segment(index)
            path = rotated if rotated.exists() else self.paths.log
            try:
                fd = os.open(path, _O_READ)
            except FileNotFoundError:
                if path == rotated:
                    continue
                raise UnknownRecipient(f"{self.paths.name!r} has no inbox") from None
            # a rotation between the exists() check and the open: try again
            if path == self.paths.log and self.paths.active_index() != index:
                os.close(fd)
                if self.paths.active_index() < index:
                    raise StoreError(
                        0, f"{self.paths.name}'s cursor names segment {index}, which does not exist"
                    )
                continue
            break
        self.fd, self.segment = fd, index
        self.ino = os.fstat(fd).st_ino
        self.decoder = LineSplitter(max_line=self.store.max_line)

    def _rotated(self, size: int) -> bool:
        """True if our segment was rotated away. Rotation happens only to a file that reached
        the team's segment size, so below that size no stat of the path is needed."""
        if size < self.store.segment_bytes:
            return False
        try:
            return os.stat(self._log_path).st_ino != self.ino
        except FileNotFoundError:
            return True  # mid-rotation: the new file is about to appear

    def read(self) -> tuple[int, list[Frame]]:
        offset = self.decoder.offset
        size = os.fstat(self.fd).st_size
        if size > offset:
            data = os.pread(self.fd, min(size - offset, READ_CHUNK), offset)
            return self.segment, self.decoder.feed(data)
        if not self._rotated(size) or not self.paths.segment(self.segment).exists():
            return self.segment, []
        # rotated: no writer touches this segment any more; read what is left, then move on
        size = os.fstat(self.fd).st_size
        if size > offset:
            return self.segment, self.decoder.feed(os.pread(self.fd, size - offset, offset))
        leftover = self.decoder.flush()
        segment = self.segment
        self._open_segment(segment + 1)
        if leftover is not None:  # rotation seals torn tails: only hand-edited files get here
            return segment, [leftover]
        return self.read()

    def has_new(self) -> bool:
        size = os.fstat(self.fd).st_size
        return size > self.decoder.offset or self._rotated(size)

    def commit(self, cursor: Cursor) -> None:
        """Overwrite the older of the cursor file's two slots (one pwrite of one page).

        No rename: on ext4 a rename over an existing file forces a flush that stalls every
        writer of the file system for ~0.5 ms. A slot torn by a crash fails its CRC and the
        other slot, one commit older, is used.
        """
        gen = self._cursor_gen + 1
        durable = self.store.durability == "fsync"
        what = f"commit {self.paths.name}'s cursor"
        try:
            slot = cursor.encode_slot(gen, self._slot_size)
            if slot is None or self._cursor_fd < 0:
                self._recreate_cursor_file(cursor, gen)
            else:
                written = os.pwrite(self._cursor_fd, slot, (gen % 2) * self._slot_size)
                if written != len(slot):
                    raise OSError(errno.EIO, f"short write of a cursor slot ({written} bytes)")
                if durable:
                    os.fdatasync(self._cursor_fd)
        except OSError as exc:
            raise _translate(exc, what) from None
        self._cursor_gen = gen

    def _recreate_cursor_file(self, cursor: Cursor, gen: int) -> None:
        """First commit, or a cursor that outgrew its slots: write a new file, rename it in."""
        size = self._slot_size
        while (slot := cursor.encode_slot(gen, size)) is None:
            size *= 2
        tmp = self.paths.cursor.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
        try:
            _write_all(fd, slot + slot, 0, f"commit {self.paths.name}'s cursor")
            if self.store.durability == "fsync":
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.paths.cursor)
        if self.store.durability == "fsync":
            _fsync_dir(self.paths.dir)
        if self._cursor_fd >= 0:
            os.close(self._cursor_fd)
        self._cursor_fd = os.open(self.paths.cursor, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        self._slot_size = size

    def quarantine(self, segment: int, item: Corrupt) -> None:
        if (segment, item.offset) <= self._quarantined_upto:
            return
        entry = {
            "segment": segment,
            "offset": item.offset,
            "end": item.end,
            "reason": item.reason,
            "ts": time.time(),
            "raw": item.raw.decode("utf-8", "backslashreplace"),
        }
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        try:
            fd = os.open(self.paths.quarantine, _O_WRITE | os.O_CREAT, _FILE_MODE)
            try:
                _write_all(fd, line, os.fstat(fd).st_size, "quarantine a line")
            finally:
                os.close(fd)
        except OSError as exc:
            raise _translate(exc, f"quarantine a line of {self.paths.name}'s inbox") from None
        self._quarantined_upto = (segment, item.offset)

    def _last_quarantined(self) -> tuple[int, int]:
        try:
            fd = os.open(self.paths.quarantine, _O_READ)
        except FileNotFoundError:
            return (-1, -1)
        try:
            size = os.fstat(fd).st_size
            tail = os.pread(fd, min(size, _TAIL_WINDOW), max(0, size - _TAIL_WINDOW))
        finally:
            os.close(fd)
        for line in reversed(tail.split(b"\n")):
            try:
                entry = json.loads(line)
                return (int(entry["segment"]), int(entry["offset"]))
            except (ValueError, KeyError, TypeError):
                continue
        return (-1, -1)

    def close(self) -> None:
        for fd in (self.fd, self._cursor_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self._cursor_fd = -1


def lease_holder(team_dir: Path, name: str) -> str | None:
    """Who runs member `name` now ("pid N, incarnation ID"), or None if nobody holds its lease.
    Takes the lock for an instant only when it is free; never blocks."""
    try:
        fd = os.open(team_dir / "agents" / f"{name}.lease", _O_READ)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown holder"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class _FileLease(Lease):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock; the file stays
            self._fd = -1


class FileStore(Store):
    """Inboxes as JSON Lines files under one team directory (see mailboxes/README.md).

    `path` is the team directory; its last component is the team name. Local file systems only:
    on NFS neither O_APPEND nor flock is reliable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "none",
        segment_bytes: int | None = None,
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        create: bool = True,
    ) -> None:
        if durability not in ("none", "fsync"):
            raise UsageError(f"durability must be 'none' or 'fsync', not {durability!r}")
        self.path = Path(path)
        self.team = validate_name(self.path.name, what="team name")
        self.team_bytes = self.team.encode()
        self.inboxes = self.path / "inboxes"
        self.durability: Durability = durability
        # fixed for the team when it is created (team.json), so every process agrees on it
        self.segment_bytes = segment_bytes or DEFAULT_SEGMENT_BYTES
        self.max_envelope = max_envelope
        self.max_line = max(DEFAULT_MAX_LINE, max_envelope + 256)
        self.create = create
        self.needs_polling = not inotify.available()
        self.blocking_commits = durability == "fsync"  # a plain commit is one pwrite
        self.fault = _torn_append_fault()
        self.fault_countdown = self.fault[1] if self.fault else 0
        self._roster: tuple[str, ...] = ()
        self._roster_mtime = -1
        self._appenders: dict[str, _Appender] = {}
        self._watched: dict[str, int] = {}
        self._inotify: inotify.Inotify | None = None
        self._notify: Callable[[str], None] | None = None

    def inbox_paths(self, name: str) -> InboxPaths:
        return InboxPaths(self.inboxes, validate_name(name))

    # -- roster --

    @property
    def roster_path(self) -> Path:
        return self.path / "team.json"

    async def open(self, members: Sequence[str]) -> None:
        for name in members:
            validate_name(name)
        if not self.roster_path.exists():
            if not self.create:
                raise StoreError(errno.ENOENT, f"no team directory at {self.path}")
            self.path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            for directory in (self.path, self.inboxes):
                directory.mkdir(mode=_DIR_MODE, exist_ok=True)
        self._update_roster(members)

    def members(self, *, refresh: bool = False) -> tuple[str, ...]:
        if refresh:
            try:
                mtime = self.roster_path.stat().st_mtime_ns
            except FileNotFoundError:
                return self._roster
            if mtime != self._roster_mtime:
                self._load_roster()
        return self._roster

    async def add_member(self, name: str) -> None:
        validate_name(name)
        if name not in self.members(refresh=True):
            self._update_roster([name])

    def _load_roster(self) -> dict[str, object]:
        try:
            raw = self.roster_path.read_bytes()
            self._roster_mtime = self.roster_path.stat().st_mtime_ns
            data = json.loads(raw)
            members = tuple(validate_name(m) for m in data["members"])
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(0, f"unreadable roster {self.roster_path}: {exc}") from None
        self._roster = members
        self.segment_bytes = int(data.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
        return dict(data)

    def _update_roster(self, add: Sequence[str]) -> None:
        try:
            self._update_roster_locked(add)
        except OSError as exc:
            raise _translate(exc, f"register members of team {self.team!r}") from None

    def _update_roster_locked(self, add: Sequence[str]) -> None:
        """Add members under the roster lock (a cold path, so filelock's cost does not matter)."""
        self.inboxes.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        lock = filelock.FileLock(
            self.path / "team.lock",
            mode=_FILE_MODE,
            preserve_lock_file=True,
            fallback_to_soft=False,
        )
        with lock:
            data = self._load_roster() or {
                "format": ROSTER_FORMAT,
                "team": self.team,
                "created_at": time.time(),
                "segment_bytes": self.segment_bytes,
                "members": [],
            }
            members = list(self._roster)
            new = [m for m in dict.fromkeys(add) if m not in members]
            for name in dict.fromkeys([*members, *new]):
                paths = InboxPaths(self.inboxes, name)
                for path in (paths.log, paths.lock):
                    os.close(
                        os.open(
                            path,
                            os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                            _FILE_MODE,
                        )
                    )
            if not new and self.roster_path.exists():
                return
            data["members"] = [*members, *new]
            tmp = self.roster_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            tmp.chmod(_FILE_MODE)
            os.replace(tmp, self.roster_path)
            if self.durability == "fsync":
                _fsync_dir(self.inboxes)
                _fsync_dir(self.path)
            self._load_roster()

    # -- appending --

    def _appender(self, recipient: str) -> _Appender:
        appender = self._appenders.get(recipient)
        if appender is None:
            validate_name(recipient, what="recipient")
            if recipient not in self._roster and recipient not in self.members(refresh=True):
                raise UnknownRecipient(
                    f"no member {recipient!r} in team {self.team!r} "
                    f"(members: {', '.join(self._roster) or 'none'})"
                )
            appender = self._appenders[recipient] = _Appender(self, self.inbox_paths(recipient))
        return appender

    async def append(self, recipient: str, encoded: bytes) -> int:
        return await self.append_many(recipient, (encoded,))

    async def append_many(self, recipient: str, encoded: Sequence[bytes]) -> int:
        if not encoded:
            return -1
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
                seq = await anyio.to_thread.run_sync(appender.append_blocking, encoded)
            ticket = appender.syncs.ticket() if self.durability == "fsync" else 0
        finally:
            appender.pass_turn()
        if self.durability == "fsync":
            await appender.syncs.wait(ticket)
        return seq

    # -- reading and watching --

    def reader(self, name: str) -> FileReader:
        paths = self.inbox_paths(name)
        if not paths.log.exists():
            raise UnknownRecipient(f"no member {name!r} in team {self.team!r}")
        return FileReader(self, paths)

    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        if not inotify.available():
            task_status.started()
            return
        self._notify = notify
        self._inotify = watcher = inotify.Inotify()
        try:
            watcher.add_watch(
                str(self.inboxes), inotify.IN_CREATE | inotify.IN_MOVED_TO, "", self._on_dir_event
            )
            for name in list(self._watched):
                self._watch_file(name)
            task_status.started()
            await _dispatch_forever(watcher, self._on_overflow)
        finally:
            self._inotify = None
            watcher.close()

    def watch_inbox(self, name: str) -> None:
        self._watched.setdefault(name, -1)
        if self._inotify is not None:
            self._watch_file(name)

    def _watch_file(self, name: str) -> None:
        assert self._inotify is not None
        assert self._notify is not None
        paths = self.inbox_paths(name)
        self._watched[name] = self._inotify.add_watch(
            str(paths.log), inotify.IN_MODIFY, name, self._notify
        )

    def _on_dir_event(self, filename: str) -> None:
        name, _, rest = filename.partition(".")
        if rest == "jsonl" and name in self._watched and self._notify is not None:
            self._watch_file(name)  # a new active file after rotation
            self._notify(name)

    def _on_overflow(self) -> None:
        if self._notify is not None:
            for name in self._watched:
                self._notify(name)

    def acquire_lease(self, name: str, holder: str) -> Lease:
        """An flock on `agents/<name>.lease`, held for as long as the member runs; the file
        names the holder (pid and incarnation) for the error the next claimant sees."""
        paths = self.inbox_paths(name)
        if not paths.log.exists():
            raise UnknownRecipient(f"no member {name!r} in team {self.team!r}")
        directory = self.path / "agents"
        directory.mkdir(mode=_DIR_MODE, exist_ok=True)
        path = directory / f"{name}.lease"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            current = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown holder"
            os.close(fd)
            raise MemberBusy(
                f"member {name!r} of team {self.team!r} is already running ({current})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder}\n".encode(), 0)
        return _FileLease(fd)

    async def close(self) -> None:
        for appender in self._appenders.values():
            appender.close()
        self._appenders.clear()

    def statistics(self) -> dict[str, int]:
        """Torn tails this process sealed, per inbox it wrote to."""
        return {name: a.sealed for name, a in self._appenders.items()}

"""The owner's reader over one inbox: segments in order, cursor checks, cursor commits, quarantine.

Theory of operation. A reader takes no lock. It preads from its position in the current segment,
frames complete lines only, and moves to the next segment once its file was rotated away and read
to the end. The cursor file holds two CRC-checked slots; a commit overwrites the older one with a
single pwrite (see `commit`). A cursor is checked against the log when it is loaded and on every
read: a segment shorter than the position, a file that lost its name, or a file that is not the
one the cursor was written for (`not_the_file`: its first bytes and those before the position, its
birth time at its inode number, as the cursor recorded them) raise `StoreCorrupt`,
naming the file and `teamrt repair`; the reader never silently skips or re-reads a log that
changed under it. A cursor file with no valid slot is set aside and the inbox is read again from
the start (at-least-once), never left unopenable.

Under the process's descriptor budget (descriptors.py) an idle reader parks: it closes its
descriptors and keeps its position, its file's identity (device, inode, birth time) and the CRCs
of the first and the last 256 bytes before its position. Its next read reopens the file (the
active name, else the segment's name if it was rotated meanwhile) and refuses one that is not the
same file (another inode, or the same number given to a file created later: another birth time
or inode generation), shorter, or
different in those bytes, as a read through the old descriptor would have (identity.py says why
the inode number is not enough). While parked, `has_new` asks the active file's name (a stat), so
the rescan never reopens an idle inbox.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from teamrt.errors import StoreCorrupt
from teamrt.mail.filestore.descriptors import BUDGET, open_file
from teamrt.mail.filestore.fileio import (
    O_READ,
    replace_file,
    translate,
)
from teamrt.mail.filestore.framing import LineSplitter, decode_slots, encode_slot
from teamrt.mail.filestore.identity import (
    CHECK,
    identify,
    on_overlayfs,
    read_marks,
    reopened_differs,
)
from teamrt.mail.filestore.paths import FIRST_READ, READ_CHUNK, InboxPaths
from teamrt.mail.filestore.quarantine import Quarantine
from teamrt.mail.log import Corrupt, Cursor, Entry
from teamrt.mail.store import InboxReader

if TYPE_CHECKING:
    from teamrt.mail.filestore.store import FileStore

CURSOR_SLOT = 4096  # one page: a process killed mid-pwrite cannot tear it
TAIL_CHECK = 256  # bytes before the cursor's offset whose CRC the cursor records

log = logging.getLogger("teamrt.mail")


def read_cursor(path: Path) -> tuple[Cursor, int, int]:
    """The committed cursor in `path`, its generation and its slot size.

    A file with no valid slot (both torn, emptied, edited) reads as generation -1 and the start
    of the log: the inbox is then read again from the beginning.
    """
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return Cursor(), 0, CURSOR_SLOT
    except OSError as exc:
        raise translate(exc, f"read cursor {path}") from None
    try:
        data = os.read(fd, max(os.fstat(fd).st_size, 1))
    finally:
        os.close(fd)
    found = decode_slots(data)
    if found is None:
        return Cursor(), -1, CURSOR_SLOT
    return found[0], found[1], max(CURSOR_SLOT, len(data) // 2)


def tail_crc(fd: int, offset: int) -> str:
    """The CRC the cursor records of the bytes before `offset`."""
    start = max(0, offset - TAIL_CHECK)
    return f"{zlib.crc32(os.pread(fd, offset - start, start)):08x}"


def file_marks(cursor: Cursor, fd: int) -> Cursor:
    """`cursor` with the marks of `fd`'s file, the one its position is in: the CRCs of the first
    and of the last `TAIL_CHECK` bytes before its offset, its inode number, birth time and inode
    generation (identity.py)."""
    head, tail = read_marks(fd, cursor.offset)
    _, ino, _, born, generation = identify(fd)
    return Cursor(
        *(cursor.segment, cursor.offset, cursor.seq, cursor.acked, cursor.recent, cursor.ahead),
        *(f"{tail:08x}", f"{head:08x}", ino, born, generation),
    )


def not_the_file(cursor: Cursor, fd: int) -> str | None:
    """How `fd`'s file (at least `cursor.offset` bytes long) is not the one `cursor` was written
    for, or None where its marks agree. A mark the cursor lacks (written by older code) is not
    checked. The birth is compared only at the same inode number: a copy of the team has other
    numbers and births and the same bytes, and is the same log; so is a file of overlayfs's lower
    layer copied up (the same number, another birth: see `on_overlayfs`)."""
    head, tail = read_marks(fd, cursor.offset)
    differ = "is not the file the cursor was written for"
    if cursor.tail is not None and f"{tail:08x}" != cursor.tail:
        return (
            f"{differ}: the bytes before offset {cursor.offset} differ (the log was replaced "
            "or rewritten)"
        )
    if cursor.head is not None and f"{head:08x}" != cursor.head:
        return f"{differ}: its first bytes differ (the log was replaced or rewritten)"
    if cursor.ino:
        _, ino, _, born, generation = identify(fd)
        if (
            ino == cursor.ino
            and (
                (born and cursor.born and born != cursor.born)  # 0: not known
                or (generation and cursor.igen and generation != cursor.igen)
            )
            and not on_overlayfs(fd)
        ):
            return (
                f"{differ}: it was created again (a new file got the old one's inode number, "
                "but it was created later)"
            )
    return None


def repair_hint(store_path: Path, name: str) -> str:
    return f"run `teamrt repair {store_path} --inbox {name}`"


class FileReader(InboxReader):
    """The owner's reader over one inbox's segments."""

    def __init__(self, store: FileStore, paths: InboxPaths) -> None:
        self.store = store
        self.paths = paths
        self.segment = 0
        self.fd = -1
        self.ino = 0
        self.dev = 0
        self.busy = False  # a commit in a worker thread uses the descriptors: never parked then
        self.born = 0  # its birth time (identity.py), 0 where the file system keeps none
        self.generation = 0  # its inode generation (identity.py), 0 where none is known
        self._parked_marks = (0, 0)  # while parked: CRCs of the bytes before the position
        self._head = (-1, "")  # (segment, the cursor's CRC of its first CHECK bytes), once known
        self._sealed = False  # its segment was opened by its rotated name: nothing is added
        self._parked = False
        self.decoder = LineSplitter(max_line=store.max_line)
        self.quarantined = Quarantine(paths.quarantine, paths.name, mode=store.file_mode)
        self._cursor_gen = 0
        self._slot_size = CURSOR_SLOT
        self._cursor_fd = -1
        self._tail_fd = (-1, -1)  # (segment, fd) of an older segment the cursor still sits in
        self._log_path = str(paths.log)
        tmp = paths.cursor.with_name(paths.cursor.name + ".tmp")
        if os.path.lexists(tmp):
            os.unlink(tmp)  # a commit that died before its rename: the old cursor stands

    def _corrupt(self, path: Path | str, found: str) -> StoreCorrupt:
        return StoreCorrupt(
            f"{self.paths.name}'s inbox is damaged: {path} {found}; nothing more is read from "
            f"it until it is repaired: {repair_hint(self.store.path, self.paths.name)}"
        )

    async def start(self) -> Cursor:
        cursor = self.load_cursor()
        self.seek(cursor)
        return cursor

    def load_cursor(self) -> Cursor:
        try:
            return self._load_cursor()
        except OSError as exc:
            raise translate(exc, f"read {self.paths.cursor}") from None

    def _load_cursor(self) -> Cursor:
        cursor, gen, self._slot_size = read_cursor(self.paths.cursor)
        if gen < 0:  # neither slot is valid: set it aside, read the log again from the start
            damaged = self.paths.cursor.with_name(self.paths.cursor.name + ".damaged")
            os.replace(self.paths.cursor, damaged)
            log.warning(
                "%s has no valid slot; kept as %s; %s's inbox is read again from the start",
                self.paths.cursor,
                damaged,
                self.paths.name,
            )
            gen = 0
        self._cursor_gen = gen
        if gen > 0 and self._cursor_fd < 0:
            try:
                self._cursor_fd = open_file(
                    self.paths.cursor, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
                )
            except OSError as exc:
                raise translate(exc, f"open {self.paths.name}'s cursor") from None
        return cursor

    def seek(self, cursor: Cursor) -> None:
        try:
            self._seek(cursor)
        except OSError as exc:
            raise translate(exc, f"read {self.paths.name}'s inbox") from None

    def _seek(self, cursor: Cursor) -> None:
        self._open_segment(cursor.segment)
        path = self.paths.segment(cursor.segment)
        size = os.fstat(self.fd).st_size
        if size < cursor.offset:
            raise self._corrupt(
                path if path.exists() else self.paths.log,
                f"is {size} bytes, but the cursor says {cursor.offset} bytes of it were handled "
                "(the log was truncated, or deleted and created again)",
            )
        differs = not_the_file(cursor, self.fd)
        if differs is not None:
            raise self._corrupt(path if path.exists() else self.paths.log, differs)
        self.decoder = LineSplitter(
            cursor.offset, max_line=self.store.max_line, segment=cursor.segment
        )
        self.caught_up = False

    def _open_segment(self, index: int) -> None:
        """Open segment `index` (a rotated segment, or the active file), then close the old
        descriptor: a failure leaves the reader where it was."""
        while True:
            rotated = self.paths.segment(index)
            path = rotated if rotated.exists() else self.paths.log
            try:
                fd = open_file(path, O_READ)
            except FileNotFoundError:
                if path == rotated:
                    continue
                raise self._corrupt(self.paths.log, "is missing") from None
            except OSError as exc:
                raise translate(exc, f"open {path}") from None
            if path == self.paths.log and self.paths.active_index() != index:
                os.close(fd)
                active = self.paths.active_index()
                if active < index:
                    raise self._corrupt(
                        self.paths.cursor,
                        f"names segment {index}, but the log has only segments 0 to {active}",
                    )
                continue  # rotated between the exists() check and the open: try again
            break
        if self.fd >= 0:
            os.close(self.fd)
        was_open = self.fd >= 0
        self.fd, self.segment = fd, index
        self.dev, self.ino, _, self.born, self.generation = identify(fd)
        self._sealed = path == rotated and not self._active()
        self.decoder = LineSplitter(max_line=self.store.max_line, segment=index)
        self.caught_up = False
        self._parked = False
        if not was_open:
            BUDGET.opened(self, 2)  # its log, and its cursor once it commits

    @property
    def parked(self) -> bool:
        """True while this reader has given its descriptors back (see the module)."""
        return self._parked

    def release_descriptors(self) -> bool:
        """Park, if no commit in a worker thread is using the descriptors (the budget asks)."""
        if self.busy:
            return False
        if self.fd >= 0:
            try:
                self._parked_marks = read_marks(self.fd, self.decoder.offset)
            except OSError:
                return False  # keep it: its next read reports the trouble
            self._parked = True
        self._close_descriptors()
        return True

    def _unpark(self) -> None:
        """Reopen the file this reader was reading when it parked, checked to be that file."""
        try:
            self._reopen_parked()
        except OSError as exc:
            raise translate(exc, f"read {self.paths.name}'s inbox") from None

    def _reopen_parked(self) -> None:
        offset, found = self.decoder.offset, -1
        for path in (self._log_path, str(self.paths.segment(self.segment))):
            try:
                fd = open_file(path, O_READ)
            except FileNotFoundError:
                continue
            dev, ino, size, born, generation = identify(fd)
            if ino == self.ino and dev == self.dev:
                found = fd
                break
            os.close(fd)
        if found < 0:
            raise self._corrupt(self.paths.log, "was deleted or replaced while it was read")
        try:
            differs = reopened_differs(
                found,
                size,
                offset,
                left=(self.born, self.generation),
                now=(born, generation),
                marks=self._parked_marks,
            )
        except BaseException:
            os.close(found)
            raise
        if differs is not None:
            os.close(found)
            raise self._corrupt(self.paths.log, differs)
        self.fd, self._parked = found, False
        self.born, self.generation = born, generation  # another file if it was copied up
        BUDGET.opened(self, 2)

    def _active(self) -> bool:
        """True if our file is the active log (a rotation that stopped before its rename leaves
        the segment's name on the active file: it is not sealed yet)."""
        try:
            st = os.stat(self._log_path)
        except FileNotFoundError:
            return False
        return st.st_ino == self.ino and st.st_dev == self.dev

    def _rotated(self, size: int) -> bool:
        """True if our segment was rotated away. Rotation happens only to a file that reached
        the team's segment size, so below that size no stat of the path is needed."""
        if size < self.store.segment_bytes:
            return False
        try:
            return os.stat(self._log_path).st_ino != self.ino
        except FileNotFoundError:
            return False  # the log was deleted: the next read reports it

    def read_nowait(self) -> list[Entry]:
        try:
            # one read without asking the size first: a read that returns less than it asked
            # for reached the end (the usual wake-up; a seek for the size would be one more
            # system call each time). It asks for less than READ_CHUNK: malloc maps a buffer of
            # 128 KiB or more afresh at every read (about 8 us)
            self.caught_up = False
            decoder = self.decoder
            chunk = os.pread(self.fd, FIRST_READ, decoder.offset)
            if chunk and len(chunk) < FIRST_READ:  # the usual case: `_read`'s first step
                entries = decoder.feed(chunk)
                # all there was, and the segment is not full (a full one may have been rotated)
                self.caught_up = decoder.offset < self.store.segment_bytes and not self._sealed
                return entries
            return self._read(chunk)
        except OSError as exc:
            if self._parked:  # its descriptor is -1: the read failed with EBADF
                self._unpark()
                return self.read_nowait()
            raise translate(exc, f"read {self.paths.name}'s inbox") from None

    def _read(self, chunk: bytes | None = None) -> list[Entry]:
        """Read what is new (`chunk`: what a first read at the position returned already)."""
        self.caught_up = False
        decoder = self.decoder
        if chunk is None:
            chunk = os.pread(self.fd, FIRST_READ, decoder.offset)
        if chunk:
            entries = decoder.feed(chunk)
            if len(chunk) < FIRST_READ:
                size = decoder.offset
            else:  # more may be there
                size = os.lseek(self.fd, 0, os.SEEK_END)
                while not entries and decoder.offset < size:  # a record longer than one read
                    offset = decoder.offset
                    chunk = os.pread(self.fd, min(size - offset, READ_CHUNK), offset)
                    if not chunk:
                        break
                    entries = decoder.feed(chunk)
            # all there was, and the segment is not full (a full one may have been rotated)
            self.caught_up = decoder.offset >= size < self.store.segment_bytes and not self._sealed
            return entries
        offset = decoder.offset
        st = os.fstat(self.fd)  # nothing new: truncated, deleted or rotated?
        size = st.st_size
        if size > offset:
            return self._read()  # written since that read
        if size < offset:
            raise self._corrupt(
                self.paths.segment(self.segment)
                if self.paths.segment(self.segment).exists()
                else self.paths.log,
                f"shrank to {size} bytes below the read position {offset} (truncated)",
            )
        if st.st_nlink == 0:
            raise self._corrupt(self.paths.log, "was deleted or replaced while it was read")
        if not self._sealed and (
            not self._rotated(size) or not self.paths.segment(self.segment).exists()
        ):
            # nothing new: caught up (a wake-up that found nothing must not leave the next
            # receive reading again, nor reopen a parked reader), unless the segment is full
            self.caught_up = size < self.store.segment_bytes
            return []
        # rotated: no writer touches this segment any more; read what is left, then move on
        size = os.fstat(self.fd).st_size
        if size > offset:
            return self.decoder.feed(os.pread(self.fd, size - offset, offset))
        if size < self.store.segment_bytes:
            log.warning(
                "%s ends at %d bytes, short of the segment size %d: it was cut after it was "
                "rotated, and whatever it held past its end is gone; reading on in segment %d",
                self.paths.segment(self.segment),
                size,
                self.store.segment_bytes,
                self.segment + 1,
            )
        leftover = self.decoder.flush()
        self._open_segment(self.segment + 1)
        if leftover is not None:  # rotation seals torn tails: only hand-edited files get here
            return [leftover]
        return self._read()

    def has_new(self) -> bool:
        """Never raises (it runs in the background rescan): trouble is reported by `read`."""
        if self._parked:  # without reopening: the active file's name and size
            try:
                st = os.stat(self._log_path)
            except OSError:
                return True
            return st.st_ino != self.ino or st.st_size != self.decoder.offset
        try:
            size = os.lseek(self.fd, 0, os.SEEK_END)
            if size != self.decoder.offset or self._rotated(size):
                return True
            # deleted: only a read reports it, and a reader that caught up waits without one
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    async def commit(self, cursor: Cursor) -> None:
        """See `_commit`; in `fsync` mode the commit runs in a worker thread."""
        if self.store.durability == "fsync":
            await self.store.in_flight.enter(self)  # a turn first: busy, it gives nothing back
            try:
                if self._parked:
                    self._unpark()
                self.busy = True  # the budget does not park it under the thread
                await anyio.to_thread.run_sync(self._commit, cursor)
            finally:
                self.busy = False
                self.store.in_flight.leave(self)
        else:
            self._commit(cursor)
            if self._parked:  # it committed behind its segment: no holder keeps what it opened
                self._close_descriptors()

    def _commit(self, cursor: Cursor) -> None:
        """Overwrite the older of the cursor file's two slots (one pwrite of one page).

        No rename: on ext4 a rename over an existing file forces a flush that stalls every
        writer of the file system for ~0.5 ms. A slot torn by a crash fails its CRC and the
        other slot, one commit older, is used.
        """
        gen = self._cursor_gen + 1
        durable = self.store.durability == "fsync"
        what = f"commit {self.paths.name}'s cursor"
        try:
            cursor = self._marked(cursor)
            slot = encode_slot(cursor, gen, self._slot_size)
            if self._cursor_fd < 0 and self._cursor_gen > 0 and slot is not None:
                self._reopen_cursor()  # given back under the descriptor budget
            if slot is None or self._cursor_fd < 0:
                self._recreate_cursor_file(cursor, gen)
            else:
                written = os.pwrite(self._cursor_fd, slot, (gen % 2) * self._slot_size)
                if written != len(slot):
                    raise OSError(errno.EIO, f"short write of a cursor slot ({written} bytes)")
                if durable:
                    os.fdatasync(self._cursor_fd)
        except OSError as exc:
            raise translate(exc, what) from None
        self._cursor_gen = gen

    def _marked(self, cursor: Cursor) -> Cursor:
        """`file_marks(cursor, ...)` at a commit's cost: the identity of the reader's own segment
        is known since it opened it, and its first bytes never change once there are `CHECK`."""
        segment, offset = cursor.segment, cursor.offset
        fd = self._fd_of(segment)
        if segment != self.segment:
            return file_marks(cursor, fd)
        head_segment, head = self._head
        if head_segment != segment or offset < CHECK:
            head = f"{zlib.crc32(os.pread(fd, min(offset, CHECK), 0)):08x}"
            self._head = (segment, head) if offset >= CHECK else (-1, "")
        return Cursor(
            *(segment, offset, cursor.seq, cursor.acked, cursor.recent, cursor.ahead),
            *(tail_crc(fd, offset), head, self.ino, self.born, self.generation),
        )

    async def changed_elsewhere(self) -> bool:
        try:
            return read_cursor(self.paths.cursor)[1] != self._cursor_gen
        except OSError:
            return True

    def _fd_of(self, segment: int) -> int:
        """A descriptor of `segment` for the tail check (the reader's own, usually)."""
        if segment == self.segment:
            if self._parked:
                self._unpark()
            return self.fd
        cached_segment, fd = self._tail_fd
        if cached_segment != segment:
            if fd >= 0:
                os.close(fd)
            fd = os.open(self.paths.segment(segment), O_READ)
            self._tail_fd = (segment, fd)
        return fd

    def _recreate_cursor_file(self, cursor: Cursor, gen: int) -> None:
        """First commit, or a cursor that outgrew its slots: write a new file, rename it in."""
        size = self._slot_size
        while (slot := encode_slot(cursor, gen, size)) is None:
            size *= 2
        replace_file(
            self.paths.cursor,
            slot + slot,
            durable=self.store.durability == "fsync",
            mode=self.store.file_mode,
        )
        if self._cursor_fd >= 0:
            os.close(self._cursor_fd)
        self._cursor_fd = os.open(self.paths.cursor, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        self._slot_size = size

    async def quarantine(self, item: Corrupt) -> None:
        self.quarantined.add(item)

    def _reopen_cursor(self) -> None:
        """The cursor file's descriptor again, after parking (a file gone: it is made anew)."""
        with contextlib.suppress(FileNotFoundError):
            self._cursor_fd = open_file(self.paths.cursor, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)

    def _close_descriptors(self) -> None:
        for fd in (self.fd, self._cursor_fd, self._tail_fd[1]):
            if fd >= 0:
                os.close(fd)
        self.fd = self._cursor_fd = -1
        self._tail_fd = (-1, -1)

    def close(self) -> None:
        self._close_descriptors()
        self._parked = False
        BUDGET.closed(self)

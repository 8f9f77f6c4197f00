"""One process's writer for one inbox: the locked append, seq numbering and rotation.

Theory of operation. Under the inbox's flock an append fstats the log. If the file lost its last
name (deleted, or replaced by a rename) or another process rotated it away, the writer reopens the
active file. If the size is not what this process last left, it seals a torn tail left by a dead
writer and reads the next `seq` from the inbox's high-water mark: the highest seq handed out and
where the log ended after its line, a fixed-width record at the start of the lock file
(framing.py) that every writer overwrites under the lock just after its line. The mark, not the
log's tail, numbers envelopes, so `seq` never goes backwards: not when the tail is cut (below its
owner's cursor, say), nor when something that is not teamrt appends a line with a seq of its
own. Lines after the mark's offset count only where they continue its seq one by one (a writer
killed between its line and its mark). An inbox without a mark (a team written before it
existed, or a mark that is not one) numbers on from the last line of the log that decodes as
an envelope of this inbox. Past the segment size it rotates:

    link(<agent>.jsonl, <agent>.NNNNNN.jsonl)       the full file gets its segment name
    create <agent>.jsonl.next (O_EXCL|O_NOFOLLOW)   a fresh, empty file
    rename(<agent>.jsonl.next, <agent>.jsonl)       atomically replaces the active name

so the active name always exists; a writer killed (or failing with EMFILE/ENOSPC) between two
steps leaves segment N and the active file as one inode, which the next writer's rotation simply
finishes. Then it appends one stamped line, looping over short writes and truncating back on any
error, and marks it. Descriptors of rotated files are closed at once (or after an fdatasync in
flight on them).

The lock is taken without blocking. When another process holds it, the appender spins on the
non-blocking lock for a budget of microseconds that adapts to whether spinning wins the lock
here (see `Appender.spin`), and past it waits for the lock in a worker thread.

An appender holds the inbox's lock file and log open between sends. Under the process's
descriptor budget (descriptors.py) an idle one (no send of this process in it, no fdatasync
pending) is dropped: the next send opens a new appender, which reads the mark as any writer does
when the log's size is not the one it left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from teamrt.envelopes import Envelope
from teamrt.errors import DurabilityError, StoreCorrupt, UnknownRecipient
from teamrt.mail.filestore.descriptors import BUDGET, open_file
from teamrt.mail.filestore.fileio import (
    O_READ,
    O_WRITE,
    create_exclusive,
    fsync_dir,
    translate,
    write_all,
)
from teamrt.mail.filestore.framing import (
    HIGH_WATER_SIZE,
    HighWater,
    decode_high_water,
    encode_high_water,
)
from teamrt.mail.filestore.paths import InboxPaths, same_file
from teamrt.mail.group import GroupCommit
from teamrt.mail.log import decode_line, stamp, stamp_many

if TYPE_CHECKING:
    from teamrt.mail.filestore.store import FileStore

TAIL_WINDOW = 64 << 10
#: The spin on a contended lock (microseconds): where it starts, its bounds, and how often an
#: appender whose spins kept failing (budget 0) tries one short spin again.
SPIN_START_US = 100
SPIN_MAX_US = 400
SPIN_MIN_US = 10
SPIN_PROBE_EVERY = 16
_SEQ_AT_LINE_START = re.compile(rb'\{"seq":(\d+),')


def last_seq(
    fd: int,
    size: int,
    team: str,
    name: str,
    window: int = TAIL_WINDOW,
) -> int | None:
    """The seq of the last complete line that decodes as an envelope of inbox `name` of `team`,
    reading backwards from the end, `window` bytes first (for an inbox without a mark)."""
    while True:
        start = max(0, size - window)
        chunk = os.pread(fd, size - start, start)
        lines = chunk.split(b"\n")
        if start > 0:
            lines = lines[1:]  # may be a partial line: widen the window instead
        for line in reversed(lines):
            m = _SEQ_AT_LINE_START.match(line)
            if m is None:
                continue
            envelope = decode_line(line)
            if (
                isinstance(envelope, Envelope)
                and envelope.team == team
                and envelope.recipient in (name, "*")
            ):
                return int(m.group(1))
        if start == 0:
            return None
        window *= 4


def _read_from(path: os.PathLike[str] | str, start: int) -> bytes | None:
    """The bytes of `path` from `start` to its end (None if it is shorter, or gone)."""
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, size - start, start) if size >= start else None
    finally:
        os.close(fd)


class Appender:
    """This process's writer for one inbox: held descriptors, the next seq, a turn queue."""

    def __init__(self, store: FileStore, paths: InboxPaths) -> None:
        self.store = store
        self.paths = paths
        self.what = f"append to {paths.name}'s inbox"
        try:
            self.lock_fd = open_file(paths.lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise UnknownRecipient(f"{paths.name!r} has no inbox in team {store.team!r}") from None
        except OSError as exc:
            raise translate(exc, f"open {paths.name}'s inbox") from None
        self.fd = -1
        self.segment = 0
        self.known_size = -1  # forces tail recovery on first use
        self.next_seq = 0
        self.sealed = 0  # torn tails this process sealed
        self.rotations = 0  # rotations this process made
        self.busy = False
        self.spin_budget = SPIN_START_US  # how long the next contended append spins (us)
        self._probe = SPIN_PROBE_EVERY
        self.spins_won = 0  # contended appends that got the lock by spinning
        self.spins_lost = 0  # contended appends that spun, then waited in a thread
        self.spins_skipped = 0  # contended appends that waited in a thread without spinning
        self.waiters: deque[anyio.Event] = deque()
        self._retired: list[int] = []
        self._syncing = -1  # the descriptor a group-commit fdatasync is using
        self.syncs = GroupCommit(self._fdatasync)
        try:
            self._reopen()  # here, on the event loop's thread (a first append may be in a worker)
        except BaseException as exc:
            os.close(self.lock_fd)
            if isinstance(exc, OSError):
                raise translate(exc, self.what) from None
            raise
        BUDGET.opened(self, 2)

    @property
    def held_descriptors(self) -> int:
        """The descriptors this appender holds: its inbox and lock files, and the retired
        segments whose last fdatasync has not returned."""
        return 2 + len(self._retired)

    def release_descriptors(self) -> bool:
        """Close, if idle (the budget asks): the store opens a new appender for the next send."""
        if self.busy or self.waiters or self.syncs.pending or self._syncing >= 0 or self._retired:
            return False
        self.store.drop_appender(self)
        self._close()
        return True

    async def _fdatasync(self) -> None:
        """One shared sync (group commit); a failure is reported to every sender it covered."""
        fd = self._syncing = self.fd
        try:
            await anyio.to_thread.run_sync(os.fdatasync, fd)
        except OSError as exc:
            raise DurabilityError(
                f"{self.what}: fsync failed: {exc.strerror}; the send is not acknowledged",
                errno=exc.errno or 0,
            ) from None
        finally:
            self._syncing = -1
            for old in self._retired:
                os.close(old)
            self._retired.clear()

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

    async def append_contended(self, encoded: Sequence[bytes]) -> int:
        """Append when another process holds the lock: spin for it briefly, else wait for it
        in a worker thread, so that the event loop never waits behind a stopped holder."""
        if self.spin():
            try:
                return self.append_locked(encoded)
            finally:
                self.unlock()
        return await anyio.to_thread.run_sync(self.append_blocking, encoded)

    def spin(self) -> bool:
        """Retry the non-blocking lock for up to `spin_budget` microseconds; True if taken.

        A holder that is running releases the lock within microseconds, and a spin that takes
        it keeps this process on its CPU, where waiting in a thread costs two wake-ups, each a
        trip through a run queue that is long when writers outnumber cores (milliseconds). A
        holder that was descheduled holds the lock for as long: spinning then only burns CPU
        the holder could use. So the budget adapts to what spins achieve here: it doubles
        (up to `SPIN_MAX_US`) when a spin wins and halves when one runs out; below
        `SPIN_MIN_US` it is 0 (no spinning), with one short spin every `SPIN_PROBE_EVERY`
        contended appends to find out whether spinning pays again.
        """
        budget = self.spin_budget
        if budget == 0:
            self._probe -= 1
            if self._probe > 0:
                self.spins_skipped += 1
                return False
            self._probe = SPIN_PROBE_EVERY
            budget = SPIN_MIN_US
        clock = time.perf_counter_ns
        until = clock() + budget * 1000
        while True:
            if self.try_lock():
                self.spin_budget = min(SPIN_MAX_US, max(SPIN_MIN_US, self.spin_budget * 2))
                self.spins_won += 1
                return True
            if clock() >= until:
                break
        self.spin_budget //= 2
        if self.spin_budget < SPIN_MIN_US:
            self.spin_budget = 0
        self.spins_lost += 1
        return False

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
            if self.fd < 0:
                self._reopen()
            # the size from a seek, a third of an fstat's cost: whether the log lost its name
            # (deleted, or replaced by a rename) is asked after the write, off the way to the
            # reader that the write wakes
            size = os.lseek(self.fd, 0, os.SEEK_END)
            if size >= store.segment_bytes and self._stale():
                self._reopen()  # rotated by another process
                size = os.lseek(self.fd, 0, os.SEEK_END)
            if size != self.known_size:
                size = self._recover(size)
            if size >= store.segment_bytes:
                self.rotate()
                size = 0
        except OSError as exc:
            self.known_size = -1
            raise translate(exc, self.what) from None
        first = self.next_seq
        team = store.team_bytes
        if len(encoded) == 1:
            line = stamp(encoded[0], first, team)
        else:
            line = stamp_many(encoded, first, team)
        try:
            write_all(self.fd, line, size, self.what)
            orphaned = os.fstat(self.fd).st_nlink == 0
        except OSError as exc:  # a StoreError from write_all, or the fstat's
            self.known_size = -1
            raise translate(exc, self.what) from None
        if orphaned:
            # the log was deleted or replaced under this descriptor: the line went where no
            # reader looks; it goes to the file now named as the log (none: StoreCorrupt)
            self.known_size = -1
            try:
                self._reopen()
            except OSError as exc:
                raise translate(exc, self.what) from None
            return self.append_locked(encoded)
        end = size + len(line)
        last = first + len(encoded) - 1
        # the line is sent whatever happens to its mark: a writer that finds the mark behind
        # the log counts the lines after it that continue its seq (`_past_mark`)
        with contextlib.suppress(OSError):
            os.pwrite(self.lock_fd, encode_high_water(HighWater(last, self.segment, end)), 0)
        self.known_size = end
        self.next_seq = last + 1
        return first

    def _recover(self, size: int) -> int:
        """Seal a torn tail left by a dead writer and find the next seq. Returns the new size."""
        mark = decode_high_water(os.pread(self.lock_fd, HIGH_WATER_SIZE, 0))
        if mark is not None and mark.offset == size and mark.segment == self.segment:
            # the usual case under contention, in one read: another writer appended and
            # marked, and nothing came after its line (so there is no torn tail either)
            self.next_seq = max(self.next_seq, mark.seq + 1)
            self.known_size = size
            return size
        if size > 0 and os.pread(self.fd, 1, size - 1) != b"\n":
            write_all(self.fd, b"\n", size, f"seal torn tail of {self.paths.name}'s inbox")
            size += 1
            self.sealed += 1
        if mark is not None:
            last = self._past_mark(mark, size)
        else:  # no mark yet: the log's last envelope of this inbox decides
            team, name = self.store.team, self.paths.name
            found = last_seq(self.fd, size, team, name) if size > 0 else None
            last = self._last_seq_before(self.segment) if found is None else found
        # never below what this process handed out (a mark made smaller by hand, say)
        self.next_seq = max(self.next_seq, last + 1)
        self.known_size = size
        return size

    def _past_mark(self, mark: HighWater, size: int) -> int:
        """The highest seq handed out: the mark's, or that of the last line a writer killed
        before it could mark it wrote just after it (in the mark's segment or the next ones).

        Only lines that continue the mark's seq one by one count, so a line that is not
        teamrt's cannot move `seq`; a log that ends before the mark's offset lost its tail,
        and then nothing after the mark is trusted.
        """
        expected = mark.seq + 1
        for index in range(mark.segment, self.segment + 1):
            start = mark.offset if index == mark.segment else 0
            chunk: bytes | None
            if index == self.segment:
                chunk = os.pread(self.fd, size - start, start) if size > start else b""
            else:
                chunk = _read_from(self.paths.segment(index), start)
            if chunk is None or (index == self.segment and size < start):
                break
            for line in chunk.split(b"\n")[:-1]:
                m = _SEQ_AT_LINE_START.match(line)
                if m is not None and int(m.group(1)) == expected and line.endswith(b"}"):
                    expected += 1
        return expected - 1

    def _last_seq_before(self, segment: int) -> int:
        for index in reversed(range(segment)):
            fd = os.open(self.paths.segment(index), O_READ)
            try:
                last = last_seq(fd, os.fstat(fd).st_size, self.store.team, self.paths.name)
            finally:
                os.close(fd)
            if last is not None:
                return last
        return -1

    def _stale(self) -> bool:
        """True if another process rotated the log away from under our descriptor."""
        return os.stat(self.paths.log).st_ino != os.fstat(self.fd).st_ino

    def _reopen(self) -> None:
        try:
            fd = open_file(self.paths.log, O_WRITE)  # gives nothing back on a worker thread
        except FileNotFoundError:
            raise StoreCorrupt(
                f"{self.paths.log} is missing: {self.paths.name}'s inbox log was deleted; "
                f"run `teamrt repair {self.store.path} --inbox {self.paths.name}`"
            ) from None
        if self.fd >= 0:
            if self.store.durability == "fsync":
                os.fdatasync(self.fd)  # senders waiting on a sync wrote to the old file
            self._retire(self.fd)
        self.fd = fd
        self.segment = self.paths.active_index()
        self.known_size = -1

    def _retire(self, fd: int) -> None:
        if fd == self._syncing:
            self._retired.append(fd)  # closed when that fdatasync returns
        else:
            os.close(fd)

    def rotate(self) -> None:
        """Close the full active file as segment N and start a new one (lock held)."""
        paths, durable = self.paths, self.store.durability == "fsync"
        if durable:
            os.fdatasync(self.fd)
        target = paths.segment(self.segment)
        try:
            os.link(paths.log, target, follow_symlinks=False)
        except FileExistsError:
            if not same_file(target, paths.log):  # not our unfinished rotation
                raise StoreCorrupt(
                    f"{target} exists but is not {paths.log}: the segments of {paths.name}'s "
                    f"inbox are out of order; run `teamrt repair {self.store.path} "
                    f"--inbox {paths.name}`"
                ) from None
        fd = create_exclusive(paths.next_log, self.store.file_mode, append=True)
        try:
            os.rename(paths.next_log, paths.log)
        except OSError:
            os.close(fd)
            raise
        if durable:
            fsync_dir(paths.dir)
        self._retire(self.fd)
        self.fd = fd
        self.segment += 1
        self.known_size = 0
        self.rotations += 1

    def close(self) -> None:
        self._close()
        BUDGET.closed(self)

    def _close(self) -> None:
        for fd in [self.fd, self.lock_fd, *self._retired]:
            if fd >= 0:
                os.close(fd)
        self._retired.clear()
        self.fd = self.lock_fd = -1

"""`teamrt repair`: bring a damaged inbox back to its last good position, and say what was lost.

Theory of operation. Repair holds the member's lease (so no owner reads while it works) and the
inbox lock (so no writer appends). It finishes a rotation that was interrupted, recreates a
missing active log, seals a torn tail, and then checks the committed cursor against the log the
way a reader does on open. When they disagree it moves the cursor back to the last position it
can prove was handled, never past one it cannot:

- the log is shorter than the cursor (truncated), or it is not the file the cursor was written for
  (its first bytes or those before the cursor differ, or it was created again at the same inode
  number: truncated and written again, replaced, rewritten, recreated): just before the first
  envelope of this inbox whose seq is above the last one the owner handled, else after the last
  whole line. `seq` never goes backwards (the writers number from the inbox's high-water mark,
  not from the log), so every envelope written after the damage is above it and is delivered;
- the cursor names a segment that does not exist, or its file has no valid slot: the start of
  the oldest segment that exists (everything is delivered again, at-least-once).

Everything after the new position is delivered again (duplicates are dropped by id where the
cursor remembers them). What was in bytes that are gone cannot be delivered; the report names
those seqs exactly (`Gone`): the handled ones between what is left and the cursor, and the ones
written after the cursor and before the damage, up to the first seq written since (or the mark,
if nothing was). It also names the claim checks whose blob (`blobs/<sha256>`) is missing or
fails its digest check.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from teamrt.codec import CLAIM, decode_fields
from teamrt.envelopes import Envelope
from teamrt.errors import StoreError, UnknownRecipient
from teamrt.mail.claims import claim_of
from teamrt.mail.filestore.appender import last_seq
from teamrt.mail.filestore.blobs import read_blob
from teamrt.mail.filestore.fileio import (
    O_READ,
    O_WRITE,
    create_exclusive,
    replace_file,
    translate,
    write_all,
)
from teamrt.mail.filestore.framing import (
    HIGH_WATER_SIZE,
    HighWater,
    LineSplitter,
    decode_high_water,
    encode_high_water,
    encode_slot,
)
from teamrt.mail.filestore.paths import InboxPaths, same_file
from teamrt.mail.filestore.reader import CURSOR_SLOT, file_marks, not_the_file, read_cursor
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.log import Cursor, decode_line
from teamrt.mail.signing import check_key, key_fingerprint
from teamrt.mail.store import run_local

_CLAIM = b'"%s":' % CLAIM.encode()  # in a record that may be a claim check


@dataclass(frozen=True)
class Gone:
    """Envelopes `first_seq` to `last_seq` of one inbox that are no longer in its log: they
    began at byte `start` of segment `segment` and ended at `end` (None: the files do not tell).
    `handled`: the owner had handled them all (nothing is missing for it); otherwise they were
    written after its cursor, and were never delivered or delivered and not acknowledged.
    `last_seq` is None when nothing tells where they ended."""

    segment: int
    first_seq: int
    last_seq: int | None
    start: int
    end: int | None
    handled: bool

    def describe(self, path: Path) -> str:
        if self.last_seq is None:
            return (
                f"any envelope from seq {self.first_seq} on that was written after byte "
                f"{self.start} of {path} before the damage is gone (the files do not tell "
                "how many there were)"
            )
        seqs = f"seq {self.first_seq} to {self.last_seq}"
        if self.handled:
            return (
                f"bytes {self.start} to {self.end} of {path} are gone: envelopes {seqs}, "
                "all handled by the owner (nothing is missing for it)"
            )
        return (
            f"envelopes {seqs}, written after byte {self.start} of {path} and not handled by "
            "the owner, are gone (never delivered, or delivered and not acknowledged)"
        )


@dataclass
class InboxRepair:
    """What `repair_inbox` found and did for one inbox."""

    name: str
    fixed: list[str] = field(default_factory=list)  # what was repaired, and how
    lost: list[str] = field(default_factory=list)  # what cannot be delivered
    handled_gone: list[str] = field(default_factory=list)  # handled, and gone from the log
    gone: list[Gone] = field(default_factory=list)  # the seqs of both, exactly
    cursor_before: tuple[int, int] | None = None
    cursor_after: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        """True if nothing needed repair."""
        return not self.fixed and not self.lost and not self.handled_gone

    def lines(self) -> list[str]:
        if self.ok:
            return [f"{self.name}: nothing to repair"]
        out = [f"{self.name}: repaired: {item}" for item in self.fixed]
        out += [f"{self.name}: handled before the damage: {item}" for item in self.handled_gone]
        out += [f"{self.name}: cannot be delivered: {item}" for item in self.lost]
        return out

    def to_json_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ok": self.ok,
            "fixed": self.fixed,
            "lost": self.lost,
            "handled_gone": self.handled_gone,
            "gone": [asdict(gone) for gone in self.gone],
            "cursor_before": self.cursor_before,
            "cursor_after": self.cursor_after,
        }


def _lines(path: Path) -> list[tuple[int, int, bytes]]:
    """(offset, end, raw) of every complete line of one segment."""
    splitter = LineSplitter()
    out = []
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            out += [(e.at[1], e.end[1], e.raw) for e in splitter.feed(chunk)]
    return out


def _envelope_seq(raw: bytes, team: str, name: str) -> int | None:
    """The seq of a line that is an envelope of inbox `name` of `team` (None for any other)."""
    envelope = decode_line(raw)
    if (
        isinstance(envelope, Envelope)
        and envelope.team == team
        and envelope.recipient
        in (
            name,
            "*",
        )
    ):
        return envelope.seq
    return None


def _segment_path(paths: InboxPaths, index: int) -> Path:
    rotated = paths.segment(index)
    return rotated if rotated.exists() else paths.log


def repair_inbox(store: FileStore, name: str) -> InboxRepair:
    """Repair one inbox of an opened `store` (see the module docstring)."""
    if name not in store.members(refresh=True):
        raise UnknownRecipient(f"no member {name!r} in team {store.team!r}")
    report = InboxRepair(name)
    paths = store.inbox_paths(name)
    lease = run_local(
        store.acquire_lease(name, f"pid {os.getpid()}, teamrt repair"), "a file lease"
    )
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        lock_fd = os.open(paths.lock, flags, store.file_mode)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            _repair_files(store, paths, report)
            mark = decode_high_water(os.pread(lock_fd, HIGH_WATER_SIZE, 0))
            _repair_cursor(store, paths, report, mark)
            if mark is None:
                _write_mark(store, paths, lock_fd)
            _check_blobs(store, paths, report)
        finally:
            os.close(lock_fd)
    except OSError as exc:
        raise translate(exc, f"repair {name}'s inbox") from None
    finally:
        run_local(lease.release(), "a file lease")
    return report


def _check_blobs(store: FileStore, paths: InboxPaths, report: InboxRepair) -> None:
    """Report the claim checks whose blob is missing or corrupt (their records are quarantined
    when received: the payload is not in the team directory any more)."""
    for entry in paths.entries(max_line=store.max_line):
        if _CLAIM not in entry.raw:
            continue
        fields = decode_fields(entry.raw)
        claim = None if isinstance(fields, str) else claim_of(fields.body)
        if claim is None or isinstance(fields, str):
            continue
        problem = claim.problem(read_blob(store.path, claim.sha256))
        if problem is not None:
            report.lost.append(
                f"envelope {fields.id} (seq {fields.seq}, from {fields.sender}): {problem}"
            )


def _repair_files(store: FileStore, paths: InboxPaths, report: InboxRepair) -> None:
    count = paths.rotated_count()
    if not os.path.lexists(paths.log):
        os.close(create_exclusive(paths.log, store.file_mode, append=True))
        report.fixed.append(f"{paths.log} was missing: created an empty active log")
    elif count and same_file(paths.segment(count - 1), paths.log):
        fd = create_exclusive(paths.next_log, store.file_mode, append=True)
        os.close(fd)
        os.rename(paths.next_log, paths.log)
        report.fixed.append(f"finished the rotation of {paths.log} into segment {count - 1}")
    fd = os.open(paths.log, O_WRITE)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            write_all(fd, b"\n", size, f"seal {paths.log}")
            report.fixed.append(f"sealed a torn last line of {paths.log} at byte {size}")
    finally:
        os.close(fd)


def _repair_cursor(
    store: FileStore, paths: InboxPaths, report: InboxRepair, mark: HighWater | None
) -> None:
    cursor, gen, _ = read_cursor(paths.cursor)
    active = paths.active_index()
    report.cursor_before = (cursor.segment, cursor.offset)
    new: Cursor | None = None
    if gen < 0:
        new = Cursor(0, 0, -1, (), ())
        report.fixed.append(
            f"{paths.cursor} had no valid slot: reading again from the start of the log "
            "(every envelope in it is delivered again)"
        )
    elif cursor.segment > active:
        new = Cursor(active, 0, cursor.seq, (), cursor.recent)
        report.fixed.append(
            f"the cursor named segment {cursor.segment}, but the log has segments 0 to {active}: "
            f"moved to the start of segment {active}"
        )
        report.lost.append(
            f"whatever was in segments {active} to {cursor.segment} after what remains "
            f"(the last handled envelope had seq {cursor.seq})"
        )
    else:
        new = _check_position(store, paths, cursor, report, mark)
    if new is None:
        return
    path = _segment_path(paths, new.segment)
    fd = os.open(path, O_READ)
    try:
        new = file_marks(Cursor(new.segment, new.offset, new.seq, (), new.recent), fd)
    finally:
        os.close(fd)
    slot_size = CURSOR_SLOT
    while (slot := encode_slot(new, max(gen, 0) + 1, slot_size)) is None:
        slot_size *= 2
    replace_file(paths.cursor, slot + slot, durable=True, mode=store.file_mode)
    report.cursor_after = (new.segment, new.offset)


def _check_position(
    store: FileStore,
    paths: InboxPaths,
    cursor: Cursor,
    report: InboxRepair,
    mark: HighWater | None,
) -> Cursor | None:
    path = _segment_path(paths, cursor.segment)
    size = path.stat().st_size
    truncated, differs = size < cursor.offset, None
    if not truncated:
        fd = os.open(path, O_READ)
        try:
            differs = not_the_file(cursor, fd)
        finally:
            os.close(fd)
        if differs is None:
            return None
    lines = _lines(path)
    # what is left before the damage (envelopes at or below the cursor's seq), and the first
    # envelope written after it: seq never goes backwards, so it is above the cursor's seq
    boundary, left, after = 0, _seq_before(store, paths, cursor.segment), None
    for start, end, raw in lines:
        seq = _envelope_seq(raw, store.team, paths.name)
        if seq is None:
            continue
        if seq > cursor.seq:
            after = (start, seq)
            break
        boundary, left = end, max(left, seq)
    position = after[0] if after else max((end for _, end, _ in lines), default=0)
    where = (
        f"before the first envelope written since (seq {after[1]})"
        if after
        else "the end of the last whole line left"
    )
    if truncated:
        report.fixed.append(
            f"{path} is {size} bytes but the cursor was at {cursor.offset}: moved the cursor "
            f"back to {position}, {where}"
        )
    else:
        report.fixed.append(f"{path} {differs}: moved the cursor to {position}, {where}")
    if after:
        report.fixed.append(f"the envelopes from seq {after[1]} on are delivered")
    _report_gone(store, paths, cursor, report, (boundary, left), after, mark)
    if after is None and cursor.segment < paths.active_index():
        # nothing left to read in a rotated segment: on to the next one (a reader takes a
        # segment shorter than the segment size for one still written, and would wait there)
        report.fixed.append(f"the cursor goes on to the start of segment {cursor.segment + 1}")
        return Cursor(cursor.segment + 1, 0, cursor.seq, (), cursor.recent)
    return Cursor(cursor.segment, position, cursor.seq, (), cursor.recent)


def _report_gone(
    store: FileStore,
    paths: InboxPaths,
    cursor: Cursor,
    report: InboxRepair,
    left: tuple[int, int],
    after: tuple[int, int] | None,
    mark: HighWater | None,
) -> None:
    """Name the seqs no longer in the log: handled ones between what is left (`left`: the end
    of its last envelope and that envelope's seq) and the cursor, then unhandled ones between
    the cursor and the first envelope written since (`after`), or the mark if none was."""
    path = _segment_path(paths, cursor.segment)
    boundary, left_seq = left
    gone = []
    if left_seq < cursor.seq:
        gone.append(Gone(cursor.segment, left_seq + 1, cursor.seq, boundary, cursor.offset, True))
    if after is None:
        after = _first_after(store, paths, cursor.segment + 1)
    last = after[1] - 1 if after is not None else mark.seq if mark is not None else None
    if last is None or last > cursor.seq:
        gone.append(Gone(cursor.segment, cursor.seq + 1, last, cursor.offset, None, False))
    for item in gone:
        report.gone.append(item)
        (report.handled_gone if item.handled else report.lost).append(item.describe(path))


def _seq_before(store: FileStore, paths: InboxPaths, segment: int) -> int:
    """The seq of the last envelope of this inbox in the segments before `segment` (or -1)."""
    for index in reversed(range(segment)):
        fd = os.open(paths.segment(index), O_READ)
        try:
            last = last_seq(fd, os.fstat(fd).st_size, store.team, paths.name)
        finally:
            os.close(fd)
        if last is not None:
            return last
    return -1


def _first_after(store: FileStore, paths: InboxPaths, segment: int) -> tuple[int, int] | None:
    """(0, seq) of the first envelope of this inbox in segment `segment` or a later one."""
    for index in range(segment, paths.active_index() + 1):
        for _, _, raw in _lines(_segment_path(paths, index)):
            seq = _envelope_seq(raw, store.team, paths.name)
            if seq is not None:
                return 0, seq
    return None


def _write_mark(store: FileStore, paths: InboxPaths, lock_fd: int) -> None:
    """Give an inbox without a high-water mark (a team written before it existed) the one its
    log implies, so that no later damage to the log's tail can move its seq back."""
    active = paths.active_index()
    for index in reversed(range(active + 1)):
        fd = os.open(_segment_path(paths, index), O_READ)
        try:
            last = last_seq(fd, os.fstat(fd).st_size, store.team, paths.name)
        finally:
            os.close(fd)
        if last is not None:
            mark = HighWater(last, active, os.stat(paths.log).st_size)
            os.pwrite(lock_fd, encode_high_water(mark), 0)
            return


def repair_team(
    path: str | os.PathLike[str], inbox: str | None = None, *, key: str | bytes | None = None
) -> list[InboxRepair]:
    """Repair one inbox (`inbox`) or every member's inbox of the team at `path`. `key` (else
    `TEAMRT_TEAM_KEY`): a signed team's key (`TeamKeyMismatch` without it)."""
    store = FileStore(path, create=False)
    if not os.path.lexists(store.roster_path):
        raise StoreError(f"no team at {store.path} (team.json is missing)", errno=2)
    store.check_directories()
    members = store.members(refresh=True)
    check_key(store.team, store.signing, key_fingerprint(key, store.team))
    names = [inbox] if inbox is not None else list(members)
    try:
        return [repair_inbox(store, name) for name in names]
    finally:
        run_local(store.close(), "closing a team directory")  # and its heartbeat file

"""`teamrt repair`: bring a damaged inbox back to its last good position, and say what was lost.

Theory of operation. Repair holds the member's lease (so no owner reads while it works) and the
inbox lock (so no writer appends). It finishes a rotation that was interrupted, recreates a
missing active log, seals a torn tail, and then checks the committed cursor against the log the
way a reader does on open. When they disagree it moves the cursor back to the last position it
can prove was handled, never past one it cannot:

- the log is shorter than the cursor (truncated): the last line boundary within what is left;
- the bytes before the cursor are not the ones it was written after (replaced or rewritten):
  just after the last line whose id the cursor lists as recently handled, else the segment start;
- the cursor names a segment that does not exist, or its file has no valid slot: the start of
  the oldest segment that exists (everything is delivered again, at-least-once).

Everything after the new position is delivered again (duplicates are dropped by id where the
cursor remembers them). What was in bytes that are gone cannot be delivered; the report says
which bytes and seqs those were, as far as the files still tell, and names the claim checks
whose blob (`blobs/<sha256>`) is missing or fails its digest check.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from teamrt.codec import CLAIM, decode_fields
from teamrt.errors import StoreError, UnknownRecipient
from teamrt.mail.claims import claim_of
from teamrt.mail.filestore.blobs import read_blob
from teamrt.mail.filestore.fileio import (
    O_READ,
    O_WRITE,
    create_exclusive,
    replace_file,
    translate,
    write_all,
)
from teamrt.mail.filestore.framing import LineSplitter, encode_slot
from teamrt.mail.filestore.paths import InboxPaths, same_file
from teamrt.mail.filestore.reader import CURSOR_SLOT, read_cursor, tail_crc
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.log import Cursor
from teamrt.mail.signing import check_key, key_fingerprint
from teamrt.mail.store import run_local

_CLAIM = b'"%s":' % CLAIM.encode()  # in a record that may be a claim check


@dataclass
class InboxRepair:
    """What `repair_inbox` found and did for one inbox."""

    name: str
    fixed: list[str] = field(default_factory=list)  # what was repaired, and how
    lost: list[str] = field(default_factory=list)  # what cannot be delivered
    cursor_before: tuple[int, int] | None = None
    cursor_after: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        """True if nothing needed repair."""
        return not self.fixed and not self.lost

    def lines(self) -> list[str]:
        if self.ok:
            return [f"{self.name}: nothing to repair"]
        out = [f"{self.name}: repaired: {item}" for item in self.fixed]
        out += [f"{self.name}: cannot be delivered: {item}" for item in self.lost]
        return out

    def to_json_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ok": self.ok,
            "fixed": self.fixed,
            "lost": self.lost,
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


def _id_and_seq(raw: bytes) -> tuple[str | None, int | None]:
    try:
        data = json.loads(raw)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    seq = data.get("seq")
    return data.get("id"), seq if isinstance(seq, int) else None


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
            _repair_cursor(store, paths, report)
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


def _repair_cursor(store: FileStore, paths: InboxPaths, report: InboxRepair) -> None:
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
        new = _check_position(paths, cursor, report)
    if new is None:
        return
    path = _segment_path(paths, new.segment)
    fd = os.open(path, O_READ)
    try:
        new = Cursor(new.segment, new.offset, new.seq, (), new.recent, (), tail_crc(fd, new.offset))
    finally:
        os.close(fd)
    slot_size = CURSOR_SLOT
    while (slot := encode_slot(new, max(gen, 0) + 1, slot_size)) is None:
        slot_size *= 2
    replace_file(paths.cursor, slot + slot, durable=True, mode=store.file_mode)
    report.cursor_after = (new.segment, new.offset)


def _check_position(paths: InboxPaths, cursor: Cursor, report: InboxRepair) -> Cursor | None:
    path = _segment_path(paths, cursor.segment)
    size = path.stat().st_size
    lines = _lines(path)
    if size < cursor.offset:
        boundary = max((end for _, end, _ in lines if end <= size), default=0)
        seqs = [s for _, end, raw in lines if end <= boundary for s in [_id_and_seq(raw)[1]]]
        last_seq = max((s for s in seqs if s is not None), default=-1)
        report.fixed.append(
            f"{path} is {size} bytes but the cursor was at {cursor.offset}: moved the cursor "
            f"back to {boundary}, the end of the last whole line left"
        )
        report.lost.append(
            f"bytes {size} to {cursor.offset} of {path} are gone (handled envelopes, seq "
            f"{last_seq + 1} to {cursor.seq}), and with them any envelope written after byte "
            f"{cursor.offset} before the truncation; envelopes sent since are delivered"
        )
        return Cursor(cursor.segment, boundary, last_seq, (), cursor.recent)
    if cursor.tail is None:
        return None
    fd = os.open(path, O_READ)
    try:
        same = tail_crc(fd, cursor.offset) == cursor.tail
    finally:
        os.close(fd)
    if same:
        return None
    recent = set(cursor.recent)
    position, last_seq = 0, -1
    for _, end, raw in lines:
        id_, seq = _id_and_seq(raw)
        if id_ in recent:
            position, last_seq = end, seq if seq is not None else last_seq
    report.fixed.append(
        f"{path} is not the file the cursor was written for (the bytes before offset "
        f"{cursor.offset} differ): moved the cursor to {position}, "
        + (
            "after the last envelope it lists as handled"
            if position
            else "the start of the file, as it holds no envelope the cursor lists as handled"
        )
    )
    report.lost.append(
        f"the envelopes the replaced {path.name} held after the cursor (handled up to seq "
        f"{cursor.seq}) are not in the new file"
    )
    return Cursor(cursor.segment, position, last_seq, (), cursor.recent)


def repair_team(
    path: str | os.PathLike[str], inbox: str | None = None, *, key: str | bytes | None = None
) -> list[InboxRepair]:
    """Repair one inbox (`inbox`) or every member's inbox of the team at `path`. `key` (else
    `TEAMRT_TEAM_KEY`): a signed team's key (`TeamKeyMismatch` without it)."""
    store = FileStore(path, create=False)
    if not os.path.lexists(store.roster_path):
        raise StoreError(2, f"no team at {store.path} (team.json is missing)")
    store.check_directories()
    members = store.members(refresh=True)
    check_key(store.team, store.signing, key_fingerprint(key, store.team))
    names = [inbox] if inbox is not None else list(members)
    try:
        return [repair_inbox(store, name) for name in names]
    finally:
        run_local(store.close(), "closing a team directory")  # and its heartbeat file

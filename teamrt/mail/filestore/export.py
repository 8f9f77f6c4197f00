"""Write any team (a Redis team, say) as an ordinary team directory, through its read-only view.

Every inbox becomes one active log holding the same stamped lines; the owner's committed cursor
and its runs acked ahead are translated into byte offsets of the new log (a position maps to the
offset just after the last record that ends at or before it), with the recently handled ids kept,
so that a `FileStore` opened on the copy delivers exactly what the source's owner had not handled.
Quarantine records are translated the same way. The team may be running meanwhile: each inbox is
copied up to where its scan ended (every record before that point, none skipped: see the view's
scan), its cursor is read before the scan, and `export.json` names the point per inbox (`to`:
the source position after the last record copied, `last_seq`, `records`). The blobs of the claim
checks among the copied records are copied too (`blobs/<sha256>`), each verified first.

A copy may also be cut (`InboxCut`, what `teamrt fork` writes): each inbox then keeps only its
first records, and its cursor says which of them its owner had handled, as given rather than as
the source's cursor has it. A copy under another team name (the new directory's) has every
line's `team` field rewritten; a signed team's lines cannot be (the signature covers the name).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teamrt.codec import CLAIM, decode_fields
from teamrt.errors import StoreCorrupt, UsageError
from teamrt.mail.claims import claim_of
from teamrt.mail.filestore.blobs import BLOBS, write_blob
from teamrt.mail.filestore.fileio import replace_file, translate, write_all
from teamrt.mail.filestore.framing import encode_slot
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.reader import CURSOR_SLOT, tail_crc
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.log import RECENT_IDS_PERSISTED, Cursor, Position
from teamrt.mail.store import TeamView, run_local

_BATCH = 1 << 20  # bytes written at a time
_SIGNED = re.compile(rb',"sig":"[0-9a-f]{64}"\}$')
_CLAIM = b'"%s":' % CLAIM.encode()  # in a record that may be a claim check


@dataclass(frozen=True, slots=True)
class InboxCut:
    """What a cut copy keeps of one inbox: its first `len(handled)` records, and for each
    whether its owner had handled it (the copy's cursor); `recent` are the ids of the most
    recently handled envelopes, for the copy's duplicate check."""

    handled: Sequence[bool]
    recent: Sequence[str] = ()
    #: indexes of records whose `deadline` the copy clears (requests left open by the cut,
    #: whose deadline would pass before the copy runs); refused for a signed record
    undated: frozenset[int] = frozenset()


def export_team(
    view: TeamView,
    dest: Path,
    *,
    cuts: Mapping[str, InboxCut] | None = None,
    rename: bool = False,
    origin: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """Copy the team `view` shows into the new team directory `dest`; returns the number of
    records copied per inbox.

    With `cuts`, each inbox named there keeps only the records and cursor its `InboxCut`
    gives. With `rename`, the copy's team is `dest`'s name even if the source's differs (the
    lines are restamped; refused for a signed team). `origin` is recorded in `export.json`
    beside where the copy came from."""
    if os.path.lexists(dest):
        raise UsageError(f"{dest} exists: export writes a new team directory")
    if view.team != dest.name and not rename:
        raise UsageError(
            f"the team is called {view.team!r}: name the new directory after it "
            f"(e.g. {dest.parent / view.team}), since a team directory's name is its team"
        )
    if view.team != dest.name and view.signing():
        raise UsageError(_renamed_signed(view))
    members = view.members()
    store = FileStore(dest)
    # the copy is signed with the source's key, or not at all, as the source is
    run_local(store.open(members, signing=view.signing()), "creating a team directory")
    counts = {}
    upto: dict[str, dict[str, Any]] = {}  # per inbox: the point its copy goes up to
    restamp = (
        (b',"team":"%s",' % view.team.encode(), b',"team":"%s",' % store.team_bytes)
        if store.team != view.team
        else None
    )
    blobs: set[str] = set()  # the claim checks the copied records name
    try:
        for name in members:
            cut = cuts.get(name) if cuts is not None else None
            upto[name] = _export_inbox(view, store, name, cut, restamp, blobs)
            counts[name] = upto[name]["records"]
        _copy_blobs(view, store, blobs)
        _note_origin(dest, view, {**(origin or {}), "inboxes": upto})
    except OSError as exc:
        raise translate(exc, f"export into {dest}") from None
    finally:
        run_local(store.close(), "closing a team directory")
    return counts


def _renamed_signed(view: TeamView) -> str:
    return (
        f"team {view.team!r} is signed, and a signature covers the team's name: copy it "
        f"into a directory named {view.team!r}"
    )


def _restamped(raw: bytes, restamp: tuple[bytes, bytes] | None, view: TeamView) -> bytes:
    if restamp is None:
        return raw
    if _SIGNED.search(raw):
        raise UsageError(_renamed_signed(view))
    head = raw[:128]
    at = head.find(restamp[0])
    return raw if at < 0 else raw[:at] + restamp[1] + raw[at + len(restamp[0]) :]


_DEADLINE = re.compile(rb',"deadline":[-+0-9.eE]+,')


def _undated(raw: bytes, view: TeamView) -> bytes:
    """The record with its deadline cleared (the first `deadline` field is the envelope's:
    it comes before the body)."""
    if _SIGNED.search(raw):
        return raw  # a signature covers the deadline: it stays
    return _DEADLINE.sub(b',"deadline":null,', raw, count=1)


def _export_inbox(
    view: TeamView,
    store: FileStore,
    name: str,
    cut: InboxCut | None,
    restamp: tuple[bytes, bytes] | None,
    blobs: set[str],
) -> dict[str, Any]:
    """Copy one inbox; returns the point the copy goes up to (see the module)."""
    paths = store.inbox_paths(name)
    cursor = view.committed(name)
    ends: list[Position] = []  # each record's end in the source, in order
    offsets: list[int] = []  # and in the new log
    seqs: list[int] = []  # and its seq (-1 for a record that has none)
    limit = len(cut.handled) if cut is not None else None
    last_seq = -1
    fd = os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        buffer: list[bytes] = []
        size = written = 0
        for entry in view.scan(name):
            if limit is not None and len(ends) >= limit:
                break
            raw = _restamped(entry.raw, restamp, view)
            if cut is not None and len(ends) in cut.undated:
                raw = _undated(raw, view)
            seq = _seq(raw)
            last_seq = max(last_seq, seq)
            if cut is not None:
                seqs.append(seq)
            if _CLAIM in raw:
                blobs.update(_claimed(raw))
            line = raw + b"\n"
            buffer.append(line)
            size += len(line)
            ends.append(entry.end)
            offsets.append(size)
            if size - written >= _BATCH:
                chunk = b"".join(buffer)
                write_all(fd, chunk, written, f"write {paths.log}")
                written += len(chunk)
                buffer.clear()
        if buffer:
            write_all(fd, b"".join(buffer), written, f"write {paths.log}")
    finally:
        os.close(fd)
    if limit is not None and len(ends) < limit:  # the cut was chosen from a longer read
        raise StoreCorrupt(
            f"{name}'s inbox in team {view.team!r} has {len(ends)} records now, but {limit} a "
            "moment ago: it was truncated or replaced while it was copied, and a copy of it "
            "would not be whole (see `teamrt inspect`)"
        )

    def offset_of(position: Position) -> int:
        """The new log's offset just after the last record ending at or before `position`."""
        index = bisect.bisect_right(ends, position)
        return offsets[index - 1] if index else 0

    point = {"records": len(ends), "last_seq": last_seq, "to": list(ends[-1]) if ends else None}
    if cut is not None:
        _write_cursor(store, paths, _cut_cursor(cut, offsets, seqs), lambda p: p[1])
        kept = ends[-1] if ends else (0, 0)
        _write_quarantine(view, store, paths, name, offset_of, until=kept)
        return point
    if cursor != Cursor():
        _write_cursor(store, paths, cursor, offset_of)
    _write_quarantine(view, store, paths, name, offset_of)
    return point


def _claimed(raw: bytes) -> list[str]:
    """The digest of the claim check `raw` carries, if it is one."""
    fields = decode_fields(raw)
    claim = None if isinstance(fields, str) else claim_of(fields.body)
    return [] if claim is None else [claim.sha256]


def _copy_blobs(view: TeamView, store: FileStore, digests: set[str]) -> None:
    """Copy the blobs the copied records name, each verified; one missing or corrupt in the
    source stays so in the copy (its record is quarantined there as it would be here)."""
    if digests:
        store.make_directory(store.path / BLOBS)
    for digest in sorted(digests):
        data = view.blob(digest)
        if data is not None and hashlib.sha256(data).hexdigest() == digest:
            write_blob(store.path, digest, data, durable=False, mode=store.file_mode)


def _seq(raw: bytes) -> int:
    """The seq stamped at the start of a record, or -1."""
    if not raw.startswith(b'{"seq":'):
        return -1
    end = raw.find(b",", 7)
    try:
        return int(raw[7:end])
    except ValueError:
        return -1


def _cut_cursor(cut: InboxCut, offsets: list[int], seqs: list[int]) -> Cursor:
    """The cursor of a cut inbox, in offsets of the new log: past the leading handled records,
    with the later handled ones as runs ahead."""
    handled = list(cut.handled[: len(offsets)])
    first = next((i for i, done in enumerate(handled) if not done), len(handled))
    ahead: list[tuple[int, int, int, int]] = []
    i = first
    while i < len(handled):
        if not handled[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(handled) and handled[j + 1]:
            j += 1
        ahead.append((0, offsets[i - 1] if i else 0, 0, offsets[j]))
        i = j + 1
    offset = offsets[first - 1] if first else 0
    seq = max(seqs[:first], default=-1)
    recent = tuple(cut.recent)[-RECENT_IDS_PERSISTED:]
    return Cursor(0, offset, seq, (), recent, tuple(ahead), None)


def _write_cursor(
    store: FileStore, paths: InboxPaths, cursor: Cursor, offset_of: Callable[[Position], int]
) -> None:
    ahead = tuple(
        (0, offset_of((a, b)), 0, offset_of((c, d)))
        for a, b, c, d in cursor.ahead
        if offset_of((a, b)) < offset_of((c, d))
    )
    offset = offset_of(cursor.position)
    fd = os.open(paths.log, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        check = tail_crc(fd, offset)
    finally:
        os.close(fd)
    copied = Cursor(0, offset, cursor.seq, cursor.acked, cursor.recent, ahead, check)
    size = CURSOR_SLOT
    while (slot := encode_slot(copied, 1, size)) is None:
        size *= 2
    replace_file(paths.cursor, slot + slot, durable=False, mode=store.file_mode)


def _write_quarantine(
    view: TeamView,
    store: FileStore,
    paths: InboxPaths,
    name: str,
    offset_of: Callable[[Position], int],
    until: Position | None = None,
) -> None:
    lines = []
    for record in view.quarantined(name):
        at, end = record.get("at"), record.get("end")
        if until is not None and not (
            isinstance(end, list) and len(end) == 2 and (int(end[0]), int(end[1])) <= until
        ):
            continue
        start = end_offset = 0
        if isinstance(end, list) and len(end) == 2:
            end_offset = offset_of((int(end[0]), int(end[1])))
        if isinstance(at, list) and len(at) == 2:
            start = offset_of((int(at[0]), int(at[1])))
        entry = {
            "segment": 0,
            "offset": start,
            "end": end_offset,
            "reason": record.get("reason", ""),
            "ts": record.get("ts", time.time()),
            "raw": record.get("raw", ""),
        }
        lines.append(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
    if lines:
        replace_file(paths.quarantine, b"".join(lines), durable=False, mode=store.file_mode)


def _note_origin(dest: Path, view: TeamView, origin: Mapping[str, Any] | None) -> None:
    """Record where the copy came from, and when, beside team.json."""
    note = {"exported_from": view.locator, "exported_at": time.time(), **(origin or {})}
    replace_file(dest / "export.json", (json.dumps(note, indent=2) + "\n").encode(), durable=False)

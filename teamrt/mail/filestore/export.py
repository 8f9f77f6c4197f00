"""Write any team (a Redis team, say) as an ordinary team directory, through its read-only view.

Every inbox becomes one active log holding the same stamped lines; the owner's committed cursor
and its runs acked ahead are translated into byte offsets of the new log (a position maps to the
offset just after the last record that ends at or before it), with the recently handled ids kept,
so that a `FileStore` opened on the copy delivers exactly what the source's owner had not handled.
Quarantine records are translated the same way. The team may be running meanwhile: each inbox is
copied up to where its scan ended, and its cursor is read before the scan.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from teamrt.errors import UsageError
from teamrt.mail.filestore.fileio import replace_file, translate, write_all
from teamrt.mail.filestore.framing import encode_slot
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.reader import CURSOR_SLOT, tail_crc
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.log import Cursor, Position
from teamrt.mail.store import TeamView, run_local

_BATCH = 1 << 20  # bytes written at a time


def export_team(view: TeamView, dest: Path) -> dict[str, int]:
    """Copy the team `view` shows into the new team directory `dest`; returns the number of
    records copied per inbox."""
    if os.path.lexists(dest):
        raise UsageError(f"{dest} exists: export writes a new team directory")
    if view.team != dest.name:
        raise UsageError(
            f"the team is called {view.team!r}: name the new directory after it "
            f"(e.g. {dest.parent / view.team}), since a team directory's name is its team"
        )
    members = view.members()
    store = FileStore(dest)
    run_local(store.open(members), "creating a team directory")
    counts = {}
    try:
        for name in members:
            counts[name] = _export_inbox(view, store, name)
        _note_origin(dest, view)
    except OSError as exc:
        raise translate(exc, f"export into {dest}") from None
    finally:
        run_local(store.close(), "closing a team directory")
    return counts


def _export_inbox(view: TeamView, store: FileStore, name: str) -> int:
    paths = store.inbox_paths(name)
    cursor = view.committed(name)
    ends: list[Position] = []  # each record's end in the source, in order
    offsets: list[int] = []  # and in the new log
    fd = os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        buffer: list[bytes] = []
        size = written = 0
        for entry in view.scan(name):
            line = entry.raw + b"\n"
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

    def offset_of(position: Position) -> int:
        """The new log's offset just after the last record ending at or before `position`."""
        index = bisect.bisect_right(ends, position)
        return offsets[index - 1] if index else 0

    if cursor != Cursor():
        _write_cursor(store, paths, cursor, offset_of)
    _write_quarantine(view, store, paths, name, offset_of)
    return len(ends)


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
) -> None:
    lines = []
    for record in view.quarantined(name):
        at, end = record.get("at"), record.get("end")
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


def _note_origin(dest: Path, view: TeamView) -> None:
    """Record where the copy came from, and when, beside team.json."""
    note = {"exported_from": view.locator, "exported_at": time.time()}
    replace_file(dest / "export.json", (json.dumps(note, indent=2) + "\n").encode(), durable=False)

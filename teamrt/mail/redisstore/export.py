"""A Redis team written out as an ordinary team directory, so every file tool works on a snapshot.

The inbox streams hold the very lines the file store writes, so each inbox file is the stream's
records joined by newlines. The roster (`team.json`), the cursors (the file store's two-slot
cursor files, with their tail checks) and the quarantine files are written by the file store's own
code: a `FileStore` creates the directory and its roster, and one `FileReader` per inbox commits
the converted cursor and records the quarantined records. Positions are converted on the way: a
Redis position `(0, n)` (n records before it) becomes the byte offset after those records in the
inbox file. Memory stays bounded: inboxes are read in pages and only the positions the cursor and
the quarantine name are remembered.

Leases and the watcher's state are not exported (they belong to running processes); the budget
ledger is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from teamrt.errors import StoreError, UsageError
from teamrt.mail.filestore import FileStore
from teamrt.mail.filestore.fileio import O_WRITE, replace_file, translate, write_all
from teamrt.mail.log import Corrupt, Cursor
from teamrt.mail.redisstore.view import RedisView

_BUFFER = 1 << 20


@dataclass
class ExportReport:
    """What `export_team` wrote."""

    team: str
    directory: Path
    records: dict[str, int] = field(default_factory=dict)  # per inbox
    bytes: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    ledger: bool = False


async def export_team(source: str | RedisView, directory: str | os.PathLike[str]) -> ExportReport:
    """Write the Redis team at `source` (a `redis://...?team=NAME` locator, or a view) as a team
    directory at `directory`, whose name must be the team's (a team directory is named after its
    team) and which must not hold a team yet. The team may keep running meanwhile: the export
    is a snapshot, each inbox as it was when it was read."""
    view = RedisView(source) if isinstance(source, str) else source
    try:
        return await _export(view, Path(directory))
    finally:
        if isinstance(source, str):
            view.close()


async def _export(view: RedisView, target: Path) -> ExportReport:
    if target.name != view.team:
        raise UsageError(
            f"a team directory is named after its team: export team {view.team!r} to "
            f"{target.parent / view.team}, not {target}"
        )
    if (target / "team.json").exists():
        raise UsageError(f"{target} already holds a team; export into a new directory")
    meta = view.meta()
    members = view.members()
    files = FileStore(target, max_envelope=int(meta.get("max_envelope", 0)) or 1 << 20)
    report = ExportReport(view.team, target)
    await files.open(members)
    try:
        _keep_created_at(files, meta.get("created_at"))
        for name in members:
            await _export_inbox(view, files, name, report)
        ledger = view.ledger()
        if ledger is not None:
            await files.ledger_update(lambda _: ledger)
            report.ledger = True
    finally:
        await files.close()
    return report


def _keep_created_at(files: FileStore, created_at: str | None) -> None:
    """Give team.json the Redis team's creation time instead of the export's."""
    if created_at is None:
        return
    path = files.roster_path
    data = json.loads(path.read_bytes())
    data["created_at"] = float(created_at)
    replace_file(path, (json.dumps(data, indent=2) + "\n").encode(), durable=False)


async def _export_inbox(view: RedisView, files: FileStore, name: str, report: ExportReport) -> None:
    committed = view.committed(name)
    quarantined = list(view.quarantined(name))  # small: one record per bad record
    wanted = {committed.offset}
    for run in committed.ahead:
        wanted.update((run[1], run[3]))
    for record in quarantined:
        for position in (record.get("at"), record.get("end")):
            if isinstance(position, list) and len(position) == 2:
                wanted.add(int(position[1]))
    offsets, records, size = _write_log(view, files.inbox_paths(name).log, name, wanted)
    report.records[name] = records
    report.bytes[name] = size

    def to_file(position: int) -> int:
        return offsets.get(position, size)

    reader = files.reader(name)
    try:
        await reader.start()
        count = 0
        for record in quarantined:
            at, end = record.get("at"), record.get("end")
            if not (isinstance(at, list) and isinstance(end, list)):
                continue
            item = Corrupt(
                (0, to_file(int(at[1]))),
                (0, to_file(int(end[1]))),
                str(record.get("reason", "")),
                str(record.get("raw", "")).encode("utf-8", "backslashreplace"),
            )
            await reader.quarantine(item)
            count += 1
        report.quarantined[name] = count
        if committed != Cursor():
            ahead = tuple((0, to_file(r[1]), 0, to_file(r[3])) for r in committed.ahead)
            await reader.commit(
                Cursor(
                    0,
                    to_file(committed.offset),
                    committed.seq,
                    committed.acked,
                    committed.recent,
                    ahead,
                )
            )
    finally:
        reader.close()


def _write_log(
    view: RedisView, path: Path, name: str, wanted: set[int]
) -> tuple[dict[int, int], int, int]:
    """Append `name`'s records to `path`; return the byte offset of each wanted position, the
    number of records and the file's size."""
    offsets: dict[int, int] = {}
    pending = sorted(wanted)
    written = records = 0
    chunk: list[bytes] = []
    chunk_bytes = 0
    try:
        fd = os.open(path, O_WRITE)
    except OSError as exc:
        raise translate(exc, f"open {path}") from None
    try:
        if os.fstat(fd).st_size:
            raise StoreError(f"{path} is not empty; export into a new directory")
        flushed = 0
        for entry in view.scan_whole(name):
            seq = entry.at[1]
            # a position n is the offset after every record with seq < n
            while pending and pending[0] <= seq:
                offsets[pending.pop(0)] = written
            line = entry.raw.replace(b"\n", b" ") + b"\n"  # one record, one line
            chunk.append(line)
            chunk_bytes += len(line)
            written += len(line)
            records += 1
            if chunk_bytes >= _BUFFER:
                write_all(fd, b"".join(chunk), flushed, f"write {path}")
                chunk, chunk_bytes, flushed = [], 0, written
        write_all(fd, b"".join(chunk), flushed, f"write {path}")
    finally:
        os.close(fd)
    for position in pending:
        offsets[position] = written
    return offsets, records, written


__all__ = ["ExportReport", "export_team"]

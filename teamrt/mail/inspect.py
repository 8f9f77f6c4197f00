"""A team directory at a glance, read straight from the files (no lock taken, nothing written).

Used by `teamrt inspect`. It streams every segment of every inbox once, so memory stays bounded by
the number of open requests, not by the size of the logs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from teamrt.errors import StoreError
from teamrt.mail.filestore import InboxPaths, read_cursor
from teamrt.mail.log import Corrupt, Record, decode_frame


@dataclass
class InboxReport:
    name: str
    depth: int = 0  # envelopes in the log, every segment
    last_seq: int = -1
    segments: int = 1
    bytes: int = 0
    lag: int = 0  # envelopes the owner has not handled yet
    corrupt_lines: int = 0  # undecodable lines in the log
    quarantined: int = 0  # entries in the quarantine file
    pending_requests: list[str] = field(default_factory=list)  # ids with no response anywhere


@dataclass
class TeamReport:
    team: str
    path: str
    members: list[str]
    created_at: float | None
    inboxes: list[InboxReport]

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def _records(paths: InboxPaths) -> Iterator[tuple[int, Record | Corrupt]]:
    for index, frame in paths.frames():
        yield index, decode_frame(frame)


def inspect_team(path: str | Path) -> TeamReport:
    """Read a team directory and summarise every inbox."""
    try:
        return _inspect_team(path)
    except OSError as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(exc.errno or 0, f"inspect {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise StoreError(0, f"inspect {path}: unreadable team.json: {exc}") from None


def _inspect_team(path: str | Path) -> TeamReport:
    root = Path(path)
    try:
        roster = json.loads((root / "team.json").read_text())
    except FileNotFoundError:
        raise StoreError(2, f"no team at {root} (team.json is missing)") from None
    members = list(roster.get("members", []))
    inbox_dir = root / "inboxes"
    reports = []
    requests: dict[str, tuple[str, str]] = {}  # request id -> (recipient, id)
    answered: set[str] = set()
    for name in members:
        paths = InboxPaths(inbox_dir, name)
        cursor = read_cursor(paths.cursor)[0]
        acked = set(cursor.acked)
        ahead = cursor.ahead
        report = InboxReport(name, segments=len(paths.segments()))
        report.bytes = sum(p.stat().st_size for p in paths.segments() if p.exists())
        for segment, item in _records(paths):
            if isinstance(item, Corrupt):
                report.corrupt_lines += 1
                continue
            assert isinstance(item, Record)
            envelope = item.envelope
            report.depth += 1
            report.last_seq = max(report.last_seq, envelope.seq or 0)
            position = (segment, item.end)
            if (
                position > (cursor.segment, cursor.offset)
                and envelope.id not in acked
                and not any(r[:2] < position <= r[2:] for r in ahead)
            ):
                report.lag += 1
            if envelope.kind == "request":
                requests[envelope.id] = (name, envelope.id)
            elif envelope.kind == "response" and envelope.in_reply_to:
                answered.add(envelope.in_reply_to)
        if paths.quarantine.exists():
            with paths.quarantine.open("rb") as f:
                report.quarantined = sum(1 for _ in f)
        reports.append(report)
    by_name = {r.name: r for r in reports}
    for request_id, (recipient, _) in requests.items():
        if request_id not in answered:
            by_name[recipient].pending_requests.append(request_id)
    return TeamReport(
        roster.get("team", root.name), str(root), members, roster.get("created_at"), reports
    )


def format_report(report: TeamReport) -> str:
    """A plain table for the terminal."""
    lines = [f"team {report.team} at {report.path}: {len(report.members)} members"]
    header = (
        "inbox",
        "depth",
        "last seq",
        "lag",
        "corrupt",
        "quarantined",
        "pending req",
        "segments",
        "bytes",
    )
    rows = [header] + [
        (
            r.name,
            str(r.depth),
            str(r.last_seq),
            str(r.lag),
            str(r.corrupt_lines),
            str(r.quarantined),
            str(len(r.pending_requests)),
            str(r.segments),
            str(r.bytes),
        )
        for r in report.inboxes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    for r in report.inboxes:
        for request_id in r.pending_requests[:5]:
            lines.append(f"  unanswered request {request_id} in {r.name}'s inbox")
    return "\n".join(lines)

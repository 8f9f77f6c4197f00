"""A team at a glance, read through its store's read-only view (no lease taken, nothing written).

Used by `teamrt inspect`, for a team directory or a store URL. It streams every record of every
inbox once, so memory stays bounded by the number of open requests, not by the size of the logs.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from teamrt.codec import decode_fields
from teamrt.errors import StoreError
from teamrt.mail.locator import open_view
from teamrt.mail.store import TeamView


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
    #: the team's key fingerprint if it is signed, "" if not, None if it does not record it
    signing: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def inspect_team(team: TeamView | str | os.PathLike[str]) -> TeamReport:
    """Summarise every inbox of a team (a view, a team directory or a store URL)."""
    view = team if isinstance(team, TeamView) else open_view(team)
    try:
        return _inspect_team(view)
    except OSError as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(
            f"inspect {view.locator}: {exc.strerror or exc}", errno=exc.errno or 0
        ) from None


def _inspect_team(view: TeamView) -> TeamReport:
    members = list(view.members())
    reports = []
    requests: dict[str, tuple[str, str]] = {}  # request id -> (recipient, id)
    answered: set[str] = set()
    for name in members:
        cursor = view.committed(name)
        acked = set(cursor.acked)
        ahead = cursor.ahead
        committed = cursor.position
        sizes = view.sizes(name)
        report = InboxReport(name, segments=sizes.get("segments", 1), bytes=sizes.get("bytes", 0))
        for entry in view.scan(name):
            # validated as the owner would, without building a model per envelope
            envelope = decode_fields(entry.raw) if not entry.too_long else None
            if envelope is None or isinstance(envelope, str):
                report.corrupt_lines += 1
                continue
            report.depth += 1
            report.last_seq = max(report.last_seq, envelope.seq or 0)
            position = entry.end
            if (
                position > committed
                and envelope.id not in acked
                and not any(r[:2] < position <= r[2:] for r in ahead)
            ):
                report.lag += 1
            if envelope.kind == "request":
                requests[envelope.id] = (name, envelope.id)
            elif envelope.kind == "response" and envelope.in_reply_to:
                answered.add(envelope.in_reply_to)
        report.quarantined = sum(1 for _ in view.quarantined(name))
        reports.append(report)
    by_name = {r.name: r for r in reports}
    for request_id, (recipient, _) in requests.items():
        if request_id not in answered:
            by_name[recipient].pending_requests.append(request_id)
    return TeamReport(
        view.team, view.locator, members, view.created_at(), reports, signing=view.signing()
    )


def format_report(report: TeamReport) -> str:
    """A plain table for the terminal."""
    signing = {None: "", "": ", unsigned"}.get(
        report.signing, f", signed (key fingerprint {report.signing})"
    )
    lines = [f"team {report.team} at {report.path}: {len(report.members)} members{signing}"]
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

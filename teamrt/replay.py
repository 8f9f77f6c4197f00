"""Replay: a team directory read back as one timeline, with requests joined to their answers.

Theory of operation. Each inbox (every segment, in file order) is read as a stream of lines,
framed by the mail codec's splitter and parsed as plain JSON (no model validation: a replay must
show whatever is in the files, and be fast). The per-inbox streams are merged by send time. One
pass over the merged stream joins each response to its request (latency, late answers, second
answers) and flags duplicates and undecodable lines; requests still open at the end are reported
as unanswered (or timed out, when their deadline has passed). Memory stays flat: only open
requests and bounded windows of recent ids are kept, never the timeline itself.

This module only reads: it takes no lock and writes nothing.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic_core

from teamrt.errors import StoreError
from teamrt.mail.filestore import InboxPaths

_WINDOW = 10_000  # recent ids remembered per check (bounded: flat memory on huge logs)


@dataclass(slots=True)
class Event:
    """One line of one inbox, as the timeline shows it."""

    ts: float
    inbox: str
    segment: int
    offset: int
    seq: int | None
    id: str
    kind: str
    type: str
    sender: str
    recipient: str
    in_reply_to: str | None
    trace_id: str | None
    deadline: float | None
    body: Any
    raw: bytes
    flags: list[str] = field(default_factory=list)
    latency: float | None = None  # for a response: seconds since its request was sent
    reason: str | None = None  # for an undecodable line: why

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "inbox": self.inbox,
            "segment": self.segment,
            "offset": self.offset,
            "seq": self.seq,
            "id": self.id,
            "kind": self.kind,
            "type": self.type,
            "sender": self.sender,
            "recipient": self.recipient,
            "in_reply_to": self.in_reply_to,
            "trace_id": self.trace_id,
            "deadline": self.deadline,
            "body": self.body,
            "flags": self.flags,
            "latency": self.latency,
            "reason": self.reason,
        }


@dataclass
class Summary:
    """What the whole pass found."""

    events: int = 0
    requests: int = 0
    answered: int = 0
    unanswered: list[Event] = field(default_factory=list)
    late: int = 0
    duplicates: int = 0
    answered_twice: int = 0
    corrupt: int = 0
    latencies: list[float] = field(default_factory=list)  # a sample, for percentiles

    def latency_percentile(self, p: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


class _Recent:
    """A bounded set of recently seen keys."""

    def __init__(self, size: int = _WINDOW) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, key: str) -> bool:
        """Remember `key`; False if it was already there."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._size:
            self._keys.popitem(last=False)
        return True


def _finite(value: Any) -> float:
    """A timestamp to sort by: any number is taken (as shown), a missing or non-finite one is 0."""
    ts = float(value or 0.0)
    return ts if math.isfinite(ts) else 0.0


def _event(inbox: str, segment: int, offset: int, line: bytes) -> Event:
    try:
        data = pydantic_core.from_json(line)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return Event(
            ts=_finite(data.get("ts")),
            inbox=inbox,
            segment=segment,
            offset=offset,
            seq=data.get("seq"),
            id=str(data["id"]),
            kind=str(data["kind"]),
            type=str(data.get("type", "text")),
            sender=str(data["sender"]),
            recipient=str(data["recipient"]),
            in_reply_to=data.get("in_reply_to"),
            trace_id=data.get("trace_id"),
            deadline=data.get("deadline"),
            body=data.get("body"),
            raw=line,
        )
    except (ValueError, KeyError, TypeError) as exc:
        return Event(
            ts=0.0,
            inbox=inbox,
            segment=segment,
            offset=offset,
            seq=None,
            id="",
            kind="corrupt",
            type="",
            sender="?",
            recipient=inbox,
            in_reply_to=None,
            trace_id=None,
            deadline=None,
            body=None,
            raw=line,
            flags=["corrupt"],
            reason=f"{type(exc).__name__}: {exc}",
        )


def read_inbox(
    paths: InboxPaths, positions: dict[str, tuple[int, int]] | None = None
) -> Iterator[Event]:
    """Every line of one inbox, every segment, in file order. Streams. When it ends, the
    segment and offset after its last complete line are left in `positions[name]`."""
    for index, (offset, _end, raw, _too_long) in paths.frames(positions):
        yield _event(paths.name, index, offset, raw)


def members(team_dir: Path) -> list[str]:
    try:
        roster = json.loads((team_dir / "team.json").read_text())
        return [str(m) for m in roster.get("members", [])]
    except FileNotFoundError:
        raise StoreError(2, f"no team at {team_dir} (team.json is missing)") from None
    except OSError as exc:
        raise StoreError(exc.errno or 0, f"read {team_dir / 'team.json'}: {exc.strerror}") from None
    except (ValueError, AttributeError, TypeError) as exc:
        raise StoreError(0, f"unreadable roster {team_dir / 'team.json'}: {exc}") from None


def _inbox_stream(
    paths: InboxPaths, positions: dict[str, tuple[int, int]] | None
) -> Iterator[Event]:
    """One inbox's events with a timestamp for merging: a corrupt line borrows the time of the
    line before it, so it appears where it sits in the file."""
    last_ts = 0.0
    for event in read_inbox(paths, positions):
        if event.kind == "corrupt":
            event.ts = last_ts
        else:
            last_ts = event.ts
        yield event


def timeline(
    team_dir: str | os.PathLike[str],
    *,
    now: float | None = None,
    summary: Summary | None = None,
    positions: dict[str, tuple[int, int]] | None = None,
) -> Iterator[Event]:
    """Every inbox merged into one timeline (by send time), each event flagged as it passes.

    Requests still open when the stream ends are flagged `unanswered` (and `timed out` when
    their deadline has passed) and listed in `summary.unanswered`. `positions` receives where
    each inbox's reading stopped (for following the files afterwards).
    """
    root = Path(team_dir)
    summary = summary if summary is not None else Summary()
    streams = [
        _inbox_stream(InboxPaths(root / "inboxes", name), positions) for name in members(root)
    ]
    merged = heapq.merge(*streams, key=lambda e: e.ts)
    open_requests: dict[str, Event] = {}
    answered = _Recent()
    seen_per_inbox: dict[str, _Recent] = {}
    for event in merged:
        summary.events += 1
        if event.kind == "corrupt":
            summary.corrupt += 1
            yield event
            continue
        seen = seen_per_inbox.setdefault(event.inbox, _Recent())
        if not seen.add(event.id):
            event.flags.append("duplicate")
            summary.duplicates += 1
            yield event
            continue
        if event.kind == "request":
            summary.requests += 1
            open_requests[event.id] = event
        elif event.kind == "response" and event.in_reply_to:
            request = open_requests.pop(event.in_reply_to, None)
            if request is not None:
                summary.answered += 1
                answered.add(event.in_reply_to)
                event.latency = event.ts - request.ts
                if len(summary.latencies) < _WINDOW:
                    summary.latencies.append(event.latency)
                if request.deadline is not None and event.ts > request.deadline:
                    event.flags.append("late")
                    summary.late += 1
            elif not answered.add(event.in_reply_to):
                event.flags.append("answered twice")
                summary.answered_twice += 1
            else:
                event.flags.append("no request")
            if event.type == "error":
                event.flags.append("error")
        yield event
    moment = time.time() if now is None else now
    for request in open_requests.values():
        request.flags.append("unanswered")
        if request.deadline is not None and request.deadline < moment:
            request.flags.append("timed out")
        summary.unanswered.append(request)


@dataclass(frozen=True)
class Filter:
    """Which events to show (pairing and flags always use the whole timeline)."""

    agents: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    trace: str | None = None
    since: float | None = None
    until: float | None = None
    grep: str | None = None

    def __call__(self, e: Event) -> bool:
        if (
            self.agents
            and e.sender not in self.agents
            and e.recipient not in self.agents
            and e.inbox not in self.agents
        ):
            return False
        if self.kinds and e.kind not in self.kinds:
            return False
        if self.types and e.type not in self.types:
            return False
        if self.trace is not None and e.trace_id != self.trace:
            return False
        if self.since is not None and e.ts < self.since:
            return False
        if self.until is not None and e.ts > self.until:
            return False
        return self.grep is None or self.grep.encode() in e.raw


def select(events: Iterable[Event], keep: Filter) -> Iterator[Event]:
    return (e for e in events if keep(e))

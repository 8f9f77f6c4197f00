"""The inboxes read back and merged into one timeline; requests joined to their answers."""

from __future__ import annotations

import heapq
import math
import operator
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pydantic_core

from teamrt.codec import CLAIM, shallow
from teamrt.mail import TeamView, open_view
from teamrt.mail.claims import claim_of
from teamrt.replay.agents import read_journal, with_decisions
from teamrt.replay.events import ENVELOPE_KINDS, WINDOW, Event
from teamrt.replay.summary import Summary
from teamrt.teamdir import TeamDir


class _Recent:
    """A bounded set of recently seen keys."""

    __slots__ = ("_keys", "_order", "_size")

    def __init__(self, size: int = WINDOW) -> None:
        self._keys: set[Any] = set()  # ids, and whatever hand-made lines answer
        self._order: deque[Any] = deque()  # oldest first
        self._size = size

    def add(self, key: Any) -> bool:
        """Remember `key`; False if it was already there."""
        keys = self._keys
        if key in keys:
            return False
        keys.add(key)
        order = self._order
        order.append(key)
        if len(order) > self._size:
            keys.discard(order.popleft())
        return True


class Joiner:
    """Pairs responses with requests and flags events, one at a time, in timeline order; the
    same joiner goes on over envelopes read later (`replay --follow`)."""

    def __init__(self) -> None:
        self.open: dict[str, Event] = {}
        self._answered = _Recent()
        self._seen: dict[str, _Recent] = {}

    def feed(self, event: Event) -> Event:
        kind = event.kind
        if kind not in ENVELOPE_KINDS:
            return event
        seen = self._seen.get(event.inbox)
        if seen is None:
            seen = self._seen[event.inbox] = _Recent()
        if not seen.add(event.id):
            event.flags.append("duplicate")
            return event
        if kind == "request":
            self.open[event.id] = event
        elif kind == "response" and event.in_reply_to:
            asked: Any = event.in_reply_to
            if type(asked) is list or type(asked) is dict:  # a hand-made line's: no id's
                asked = ("unhashable", repr(asked))
            request = self.open.pop(asked, None)
            if request is not None:
                self._answered.add(asked)
                event.latency = event.ts - request.ts
                deadline = _deadline(request)
                if deadline is not None and event.ts > deadline:
                    event.flags.append("late")
            elif not self._answered.add(asked):
                event.flags.append("answered twice")
            else:
                event.flags.append("no request")
            if event.type == "error":
                event.flags.append("error")
        return event

    def finish(self, now: float | None = None) -> list[tuple[Event, bool]]:
        """The requests still open, flagged `unanswered` (and `timed out` when their deadline
        has passed by `now`), each with whether it had a flag before."""
        moment = time.time() if now is None else now
        still = [(request, bool(request.flags)) for request in self.open.values()]
        self.open.clear()
        for request, _had in still:
            request.flags.append("unanswered")
            deadline = _deadline(request)
            if deadline is not None and deadline < moment:
                request.flags.append("timed out")
        return still


def _deadline(request: Event) -> float | None:
    """A request's deadline, if it is a number (a hand-made line may hold anything there; it
    is shown as it is, and only a number can make an answer late)."""
    deadline: Any = request.deadline
    return deadline if type(deadline) is float or type(deadline) is int else None


def _finite(value: Any) -> float:
    """A timestamp to sort by: any number is taken (as shown), a missing or non-finite one is 0."""
    try:
        ts = float(value or 0.0)
    except (TypeError, ValueError, OverflowError):  # an int beyond a float's range too
        return 0.0
    return ts if math.isfinite(ts) else 0.0


class _Line(msgspec.Struct, kw_only=True, gc=False, forbid_unknown_fields=True):
    """What a timeline reads of an inbox line, typed as `_event_checked` reads it, so that
    msgspec can parse a line into it in one pass; any line it does not take as it stands (an
    unknown field among them: msgspec would skip it unchecked) goes the checked way, which
    gives the same event."""

    ts: float = 0.0
    seq: Any = None
    team: Any = None
    v: Any = None
    traceparent: Any = None
    id: str
    kind: str
    type: str = "text"
    sender: str
    recipient: str
    in_reply_to: Any = None
    trace_id: Any = None
    deadline: Any = None
    body: Any = None


_parse_line = msgspec.json.Decoder(_Line).decode


def _event(inbox: str, segment: int, offset: int, line: bytes) -> Event:
    """The event of one inbox line: an envelope as it was sent, or a `corrupt` event saying why
    the line cannot be read."""
    if not shallow(line):  # it may nest deeper than the checked way reads: `corrupt` there
        return _event_checked(inbox, segment, offset, line)
    try:
        d = _parse_line(line)
    except (msgspec.DecodeError, RecursionError):
        return _event_checked(inbox, segment, offset, line)
    return Event(
        d.ts or 0.0,  # as _finite(): -0.0 is shown as 0.0
        inbox,
        segment,
        offset,
        d.seq,
        d.id,
        d.kind,
        d.type,
        d.sender,
        d.recipient,
        d.in_reply_to,
        d.trace_id,
        d.deadline,
        d.body,
        line,
    )


def _event_checked(inbox: str, segment: int, offset: int, line: bytes) -> Event:
    """`_event` for any line: parsed leniently (odd timestamps, any field types are shown)."""
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
    view: TeamView, name: str, positions: dict[str, tuple[int, int]] | None = None
) -> Iterator[Event]:
    """Every record of one inbox, in order. Streams. When it ends, the position after its last
    complete record is left in `positions[name]` (for following it afterwards)."""
    for entry in view.scan(name):
        if positions is not None:
            positions[name] = entry.end
        event = _event(name, entry.segment, entry.start, entry.raw)
        if type(event.body) is dict and CLAIM in event.body:
            _check_claim(view, event)
        yield event


def _check_claim(view: TeamView, event: Event) -> None:
    """Flag a claim check (its body, the reference, shows the payload's size and digest), and
    its blob if that is missing or corrupt (the receiver quarantines such a record)."""
    claim = claim_of(event.body)
    if claim is None:
        return
    event.flags.append("claim_check")
    problem = claim.problem(view.blob(claim.sha256))
    if problem is not None:
        event.flags.append("blob_missing" if problem.endswith("is missing") else "blob_corrupt")
        event.reason = problem


_by_time = operator.attrgetter("ts")


def members(team: TeamView | str | os.PathLike[str]) -> list[str]:
    """The team's roster."""
    return list((team if isinstance(team, TeamView) else open_view(team)).members())


def _inbox_stream(
    view: TeamView, name: str, positions: dict[str, tuple[int, int]] | None
) -> Iterator[Event]:
    """One inbox's events with a timestamp for merging (`read_inbox`, with a corrupt line
    borrowing the time of the line before it, so it appears where it sits in the file)."""
    last_ts = 0.0
    for entry in view.scan(name):
        if positions is not None:
            positions[name] = entry.end
        event = _event(name, entry.segment, entry.start, entry.raw)
        if type(event.body) is dict and CLAIM in event.body:
            _check_claim(view, event)
        if event.kind == "corrupt":
            event.ts = last_ts
        else:
            last_ts = event.ts
        yield event


def timeline(
    team: TeamView | str | os.PathLike[str],
    *,
    now: float | None = None,
    summary: Summary | None = None,
    positions: dict[str, tuple[int, int]] | None = None,
    keep: Filter | None = None,
    joiner: Joiner | None = None,
    agent_files: bool = False,
    watch: Callable[[Iterator[Event]], Iterator[Event]] | None = None,
) -> Iterator[Event]:
    """Every inbox merged into one timeline (by send time), each event flagged as it passes;
    with `agent_files`, the agents' stop, crash and cancel lines and the conductor's decisions
    in it too.

    Only the events `keep` accepts are yielded and counted in `summary` (pairing and flags
    always use the whole timeline). Requests still open when the stream ends are flagged
    `unanswered` (and `timed out` when their deadline has passed) and listed in
    `summary.unanswered`, unless a `joiner` is given: then they stay open in it, for the
    caller to go on and `finish` (see `finish`). `positions` receives where each inbox's
    reading stopped (for following the inboxes afterwards). `team` is a team directory, a
    store URL, or a view; agents' files are read from the team's directory (a team in a network
    store has none here). `watch`, if given, wraps the stream of every event read, before
    `keep` chooses (`teamrt replay` counts what it has read with it, to show its progress);
    without one nothing is added per event.
    """
    view = team if isinstance(team, TeamView) else open_view(team)
    summary = summary if summary is not None else Summary()
    names = view.members()
    streams: list[Iterator[Event]] = [_inbox_stream(view, name, positions) for name in names]
    root = view.directory if agent_files else None
    if root is not None:
        agents = TeamDir(root).agents
        streams += [read_journal(agents.journal(n), n) for n in names]
    merged: Iterator[Event] = heapq.merge(*streams, key=_by_time)
    if root is not None:
        merged = with_decisions(merged, root)
    if watch is not None:
        merged = watch(merged)
    join = joiner if joiner is not None else Joiner()
    for event in merged:
        join.feed(event)
        if keep is None or keep(event):
            summary.count(event)
            yield event
    if joiner is None:
        finish(join, summary, keep, now)


def finish(
    joiner: Joiner, summary: Summary, keep: Filter | None = None, now: float | None = None
) -> list[Event]:
    """Close the timeline: flag the requests still open and count those `keep` accepts."""
    kept = []
    for request, had_flags in joiner.finish(now):
        if keep is None or keep(request):
            summary.count_unanswered(request, was_flagged=had_flags)
            kept.append(request)
    return kept


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

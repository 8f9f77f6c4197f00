"""Replay: a team directory read back as one timeline, with requests joined to their answers.

Theory of operation. Each inbox (every segment, in file order) is read as a stream of lines,
framed by the mail codec's splitter and parsed as plain JSON (no model validation: a replay must
show whatever is in the files, and be fast). The per-inbox streams, and the stop, crash and cancel
lines of the agents' journals, are merged by time; the conductor's decisions (which carry no
time) are placed at the envelopes that carried them out. A `Joiner` pairs each response with its
request (latency, late answers, second answers) and flags duplicates and undecodable lines as
they pass; requests still open at the end are reported as unanswered (or timed out, when their
deadline has passed). A `Summary` counts only the events a `Filter` keeps. Memory stays flat:
only open requests and bounded windows of recent ids are kept, never the timeline itself.

This module only reads: it takes no lock and writes nothing.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
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
_AGENTS = 256  # agents counted one by one in a summary; any more are counted together
OTHERS = "(others)"
ENVELOPE_KINDS = frozenset({"message", "request", "response", "broadcast"})
AGENT_KINDS = frozenset({"stop", "crash", "cancel"})  # lines of an agent's journal
UNTIMED = math.inf  # the time of a journal line that recorded none (older journals)


@dataclass(slots=True)
class Event:
    """One line of one inbox (or of an agent's journal, or one conductor decision), as the
    timeline shows it. Journal lines have kind `stop`, `crash` or `cancel`, decisions kind
    `decision`; for both, `sender` is who acted, `type` what happened, `body` the details."""

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
            "ts": self.ts if math.isfinite(self.ts) else None,
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
class AgentCounts:
    sent: int = 0
    received: int = 0
    unanswered: int = 0  # requests sent to it that nobody answered
    errors: int = 0  # error responses it sent
    crashes: int = 0
    cancels: int = 0
    stops: int = 0
    flagged: int = 0


@dataclass
class Summary:
    """What the events a filter kept add up to (all of them, without a filter)."""

    events: int = 0
    envelopes: int = 0
    requests: int = 0
    answered: int = 0
    unanswered: list[Event] = field(default_factory=list)
    timed_out: int = 0
    late: int = 0
    errors: int = 0
    duplicates: int = 0
    answered_twice: int = 0
    corrupt: int = 0  # undecodable lines: the ones the inbox's owner quarantines
    crashes: int = 0
    cancels: int = 0
    stops: int = 0
    decisions: int = 0
    escalations: int = 0
    flagged: int = 0
    agents: dict[str, AgentCounts] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # a sample, for percentiles

    def latency_percentile(self, p: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]

    def agent(self, name: str) -> AgentCounts:
        counts = self.agents.get(name)
        if counts is None:
            name = name if len(self.agents) < _AGENTS else OTHERS
            counts = self.agents.setdefault(name, AgentCounts())
        return counts

    def count(self, e: Event) -> None:
        """Add one event (with the flags it has so far; `unanswered` comes at the end)."""
        self.events += 1
        flags = e.flags
        if flags:
            self.flagged += 1
            self.agent(e.sender if e.kind != "corrupt" else e.inbox).flagged += 1
        if e.kind == "corrupt":
            self.corrupt += 1
            return
        if e.kind in AGENT_KINDS:
            who = self.agent(e.sender)
            if e.kind == "crash":
                self.crashes += 1
                who.crashes += 1
            elif e.kind == "cancel":
                self.cancels += 1
                who.cancels += 1
            else:
                self.stops += 1
                who.stops += 1
            return
        if e.kind == "decision":
            self.decisions += 1
            self.escalations += "escalation" in flags
            return
        self.envelopes += 1
        self.agent(e.sender).sent += 1
        self.agent(e.inbox).received += 1
        if "duplicate" in flags:
            self.duplicates += 1
            return
        if e.kind == "request":
            self.requests += 1
        if e.latency is not None:
            self.answered += 1
            if len(self.latencies) < _WINDOW:
                self.latencies.append(e.latency)
        self.late += "late" in flags
        self.answered_twice += "answered twice" in flags
        if "error" in flags:
            self.errors += 1
            self.agent(e.sender).errors += 1

    def count_unanswered(self, request: Event, was_flagged: bool) -> None:
        self.unanswered.append(request)
        self.timed_out += "timed out" in request.flags
        self.agent(request.inbox).unanswered += 1
        if not was_flagged:
            self.flagged += 1
            self.agent(request.sender).flagged += 1


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


class Joiner:
    """Pairs responses with requests and flags events, one at a time, in timeline order; the
    same joiner goes on over envelopes read later (`replay --follow`)."""

    def __init__(self) -> None:
        self.open: dict[str, Event] = {}
        self._answered = _Recent()
        self._seen: dict[str, _Recent] = {}

    def feed(self, event: Event) -> Event:
        if event.kind not in ENVELOPE_KINDS:
            return event
        seen = self._seen.setdefault(event.inbox, _Recent())
        if not seen.add(event.id):
            event.flags.append("duplicate")
            return event
        if event.kind == "request":
            self.open[event.id] = event
        elif event.kind == "response" and event.in_reply_to:
            request = self.open.pop(event.in_reply_to, None)
            if request is not None:
                self._answered.add(event.in_reply_to)
                event.latency = event.ts - request.ts
                if request.deadline is not None and event.ts > request.deadline:
                    event.flags.append("late")
            elif not self._answered.add(event.in_reply_to):
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
            if request.deadline is not None and request.deadline < moment:
                request.flags.append("timed out")
        return still


def _finite(value: Any) -> float:
    """A timestamp to sort by: any number is taken (as shown), a missing or non-finite one is 0."""
    try:
        ts = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
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


_INCIDENT = re.compile(rb'^\{\s*"t"\s*:\s*"(stop|crash|cancel)"')


def read_journal(path: Path, agent: str) -> Iterator[Event]:
    """The stop, crash and cancel lines of one agent's journal (the rest, the conversation, is
    skipped unparsed). A line without a time (older journals) sorts last."""
    try:
        f = path.open("rb")
    except OSError:
        return
    with f:
        offset = 0
        for line in f:
            start, offset = offset, offset + len(line)
            match = _INCIDENT.match(line)
            if match is None or not line.endswith(b"\n"):
                continue
            try:
                data = pydantic_core.from_json(line)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            kind = match.group(1).decode()
            ts = data.get("ts")
            ts = float(ts) if isinstance(ts, int | float) and math.isfinite(ts) else UNTIMED
            if kind == "stop":
                stop = data.get("stop")
                stop = stop if isinstance(stop, dict) else {}
                what = str(stop.get("reason", "?"))
                body: Any = stop
                flags = [] if what in ("answer", "shutdown") else [f"stopped: {what}"]
            else:
                what, body, flags = kind, data.get("detail"), [kind]
            yield Event(
                ts=ts,
                inbox=agent,
                segment=-1,
                offset=start,
                seq=None,
                id=f"{agent}:journal:{start}",
                kind=kind,
                type=what,
                sender=agent,
                recipient=agent,
                in_reply_to=None,
                trace_id=None,
                deadline=None,
                body=body,
                raw=line,
                flags=flags,
            )


def read_decisions(team_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The conductor's decisions and its outcome, from `conductor/state.json` (none if absent
    or unreadable: the timeline of the envelopes does not depend on it)."""
    try:
        state = json.loads((team_dir / "conductor" / "state.json").read_text())
    except (OSError, ValueError):
        return [], None
    if not isinstance(state, dict):
        return [], None
    decisions = [d for d in state.get("decisions") or [] if isinstance(d, dict)]
    outcome = state.get("outcome")
    return decisions, (str(outcome) if outcome is not None else None)


_FLAGGED_ACTIONS = {
    "escalate": "escalation",
    "brake": "brake",
    "stuck": "stuck",
    "no answer": "no answer",
    "check error": "check error",
    "conflict": "conflict",
}


def _decision_event(number: int, d: dict[str, Any], ts: float) -> Event:
    action = str(d.get("action", "?"))
    evidence = d.get("evidence") if isinstance(d.get("evidence"), dict) else None
    flags = [_FLAGGED_ACTIONS[action]] if action in _FLAGGED_ACTIONS else []
    if evidence is not None and (
        evidence.get("exit_code") not in (0, None) or evidence.get("error")
    ):
        flags.append("check failed")
    by = str(d.get("by", "conductor"))
    return Event(
        ts=ts,
        inbox="conductor",
        segment=-1,
        offset=number,
        seq=None,
        id=f"decision:{number}",
        kind="decision",
        type=action,
        sender=by,
        recipient=by,
        in_reply_to=None,
        trace_id=None,
        deadline=None,
        body=d,
        raw=json.dumps(d, ensure_ascii=False).encode(),
        flags=flags,
    )


def _carries(d: dict[str, Any], e: Event) -> bool:
    """Whether envelope `e` carries out decision `d` (the decisions record no time of their
    own, so each is shown where its envelope is)."""
    action, detail, by = str(d.get("action")), str(d.get("detail", "")), d.get("by")
    if action == "assign":
        return e.kind == "request" and e.type == "task" and detail.startswith(f"to {e.recipient},")
    if action == "submit":
        return e.kind == "response" and e.sender == by and e.type == "task_result"
    if action == "escalate":  # its detail names the escalation request's id
        return e.kind == "request" and e.type == "escalation" and e.id in detail
    if action.startswith("answer:"):  # the human's answer to an escalation
        return e.kind == "response" and e.sender == by
    return False


def _with_decisions(events: Iterator[Event], team_dir: Path) -> Iterator[Event]:
    """Place the conductor's decisions in the stream: each decision that an envelope carries
    out just before (a request) or after (a response) that envelope, the ones in between with
    the one after them; the rest, and the outcome, at the end."""
    decisions, outcome = read_decisions(team_dir)
    pending = list(enumerate(decisions))
    last_ts = 0.0
    for e in events:
        if math.isfinite(e.ts):
            last_ts = max(last_ts, e.ts)
        hit = next(
            (
                i
                for i, (_n, d) in enumerate(pending[:8])
                if e.kind in ENVELOPE_KINDS and _carries(d, e)
            ),
            None,
        )
        if hit is None:
            yield e
            continue
        placed = [_decision_event(n, d, e.ts) for n, d in pending[: hit + 1]]
        del pending[: hit + 1]
        if e.kind == "response":
            yield e
            yield from placed
        else:
            yield from placed
            yield e
    for n, d in pending:
        yield _decision_event(n, d, last_ts)
    if outcome is not None:
        end = _decision_event(len(decisions), {"by": "conductor", "action": "outcome"}, last_ts)
        end.body = {"outcome": outcome}
        if outcome != "accepted":
            end.flags.append(f"outcome: {outcome}")
        yield end


def timeline(
    team_dir: str | os.PathLike[str],
    *,
    now: float | None = None,
    summary: Summary | None = None,
    positions: dict[str, tuple[int, int]] | None = None,
    keep: Filter | None = None,
    joiner: Joiner | None = None,
    agent_files: bool = False,
) -> Iterator[Event]:
    """Every inbox merged into one timeline (by send time), each event flagged as it passes;
    with `agent_files`, the agents' stop, crash and cancel lines and the conductor's decisions
    in it too.

    Only the events `keep` accepts are yielded and counted in `summary` (pairing and flags
    always use the whole timeline). Requests still open when the stream ends are flagged
    `unanswered` (and `timed out` when their deadline has passed) and listed in
    `summary.unanswered`, unless a `joiner` is given: then they stay open in it, for the
    caller to go on and `finish` (see `finish`). `positions` receives where each inbox's
    reading stopped (for following the files afterwards).
    """
    root = Path(team_dir)
    summary = summary if summary is not None else Summary()
    names = members(root)
    streams: list[Iterator[Event]] = [
        _inbox_stream(InboxPaths(root / "inboxes", name), positions) for name in names
    ]
    if agent_files:
        streams += [read_journal(root / "agents" / f"{n}.state.jsonl", n) for n in names]
    merged: Iterator[Event] = heapq.merge(*streams, key=lambda e: e.ts)
    if agent_files:
        merged = _with_decisions(merged, root)
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

"""Forking a team: a copy of its state as it was when one envelope was sent, to re-drive from.

Theory of operation. The cut is a moment, T: the send time (`ts`) of the chosen envelope. The
fork holds what a `kill -9` of every process of the team at T would have left, which the runtime
already knows how to take up (a teammate resumes its task from its journal, unacked mail comes
again, a tool call in flight runs again with the same call id):

- **inboxes**: the chosen envelope's inbox (each inbox, for a broadcast) up to and including it;
  every other inbox up to its first envelope sent after T (a log stays a prefix of itself, with
  the same lines byte for byte, restamped with the new team's name);
- **journals**: each agent's journal as it was at T: the lines written at or before T (every
  line carries `ts`) of the journal then current, which is the one on disk or the previous
  task's (`<agent>.state.prev.jsonl`); an agent whose first journal began after T has none;
- **transcripts**: the model calls recorded at or before T;
- **cursors**: what each owner had handled by T, derived from the records rather than from the
  cursor now (which may have moved on): a request is handled when a response to it is in the
  cut; a response is handled (only the call that waited for it wanted it, and a call that is
  run again asks again); a message or a broadcast is handled when the owner's journal at T
  records it as shown to its model (`handled`), or, for a member without agent files (the lead,
  a person), when the source's committed cursor has it; a record that does not decode is
  handled (it is never delivered);
- **deadlines**: a request the cut leaves open (no response in it) loses its deadline in the
  fork, which may run long after the deadline passed (a signed team's keep theirs: the
  signature covers them); whoever waits for the answer bounds the wait;
- **what will be sent again**: an agent whose journal at T stops between a model reply and the
  results of its tool calls runs those calls again when it resumes (as after a crash), so what
  it sent after its last journal line kept counts as handled in its recipients' inboxes, and is
  not among the ids the cursor remembers: the copy sent again (a `request` is sent again with
  the same id) is delivered once, and answered to the call that now waits for it.

- **blobs**: the blobs of the claim checks among the copied records (`blobs/<sha256>`, copied
  and verified by the export), so that a payload over the envelope limit reaches the fork too.

Leases, heartbeats and the budget ledger are not copied: the fork is not running. Journal lines
written by an older teamrt carry no time: a start is placed at its task's request, a model call
at its record in the transcript, any other line at the next line that has a time (or, at the
end, at the file's last change), so such a journal is cut no later than it should be.

Reading goes through the team's `TeamView`, so any store forks (a Redis team forks into a team
directory, given `agent_dir` for its agents' files); the copy is always a team directory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from teamrt.agents.journal import Journal
from teamrt.agents.state import AgentState
from teamrt.envelopes import Response
from teamrt.errors import ReceiveTimeout, StoreError, UsageError
from teamrt.mail import InboxCut, export_team, open_view
from teamrt.mail.locator import Locator, describe, is_url
from teamrt.mail.log import Cursor, Entry, Position, Record, decode_entry
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.store import TeamView
from teamrt.names import validate_name
from teamrt.teamdir import AgentDir, TeamDir


@dataclass(frozen=True, slots=True)
class InboxFork:
    """One inbox in a fork: records kept and left out, and how many of the kept its owner had
    handled (the cursor)."""

    kept: int
    dropped: int
    handled: int


@dataclass(frozen=True, slots=True)
class AgentFork:
    """One agent's files in a fork: which journal held the cut (`current`, `previous`, or
    None: the agent had not started), its lines kept and left out, the task it was on
    (`task_id`, and whether it was still `in_progress`), and the model calls of its transcript
    kept."""

    journal: str | None
    lines: int
    dropped: int
    task_id: str | None
    in_progress: bool
    calls: int


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A request in the fork that has no response in it: re-driving the fork answers it."""

    id: str
    sender: str
    recipient: str
    type: str


@dataclass(frozen=True)
class ForkSummary:
    """What `fork_team` wrote."""

    source: str
    dest: Path
    at: str  # the envelope forked at
    cut: float  # its send time, T
    inboxes: dict[str, InboxFork] = field(default_factory=dict)
    agents: dict[str, AgentFork] = field(default_factory=dict)
    open_requests: tuple[OpenRequest, ...] = ()

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dest": str(self.dest),
            "at": self.at,
            "cut": self.cut,
            "inboxes": {n: asdict(i) for n, i in self.inboxes.items()},
            "agents": {n: asdict(a) for n, a in self.agents.items()},
            "open_requests": [asdict(r) for r in self.open_requests],
        }

    def lines(self) -> list[str]:
        """The summary as the command prints it."""
        out = [f"forked {self.source} at {self.at} (sent at {self.cut:.6f}) into {self.dest}"]
        for name, inbox in self.inboxes.items():
            out.append(
                f"  inbox {name}: {inbox.kept} envelopes kept ({inbox.handled} handled), "
                f"{inbox.dropped} left out"
            )
        for name, agent in self.agents.items():
            if agent.journal is None:
                out.append(f"  agent {name}: had not started (no journal)")
                continue
            task = "between tasks"
            if agent.task_id is not None:
                task = f"{'on' if agent.in_progress else 'done with'} task {agent.task_id}"
            out.append(
                f"  agent {name}: {agent.lines} journal lines kept ({agent.journal} journal), "
                f"{agent.dropped} left out, {agent.calls} model calls; {task}"
            )
        for request in self.open_requests:
            out.append(
                f"  open request {request.id} ({request.type}) from {request.sender} "
                f"to {request.recipient}"
            )
        return out


@dataclass(frozen=True, slots=True)
class _Sent:
    """What the cut needs of an envelope (not its body: a big team's inboxes are held as
    these while the cut is worked out)."""

    id: str
    kind: str
    type: str
    sender: str
    recipient: str
    in_reply_to: str | None
    ts: float
    deadline: float | None


@dataclass(slots=True)
class _Seen:
    """One record of an inbox, as much of it as the cut needs."""

    envelope: _Sent | None  # None: it does not decode
    end: Position


def fork_team(
    source: Locator,
    at: str,
    dest: str | os.PathLike[str],
    *,
    agent_dir: str | os.PathLike[str] | None = None,
) -> ForkSummary:
    """Copy the team at `source` as it was when envelope `at` was sent into the new team
    directory `dest` (whose name is the fork's team name); see the module docstring for the
    rule. `agent_dir` is where the source's agents' journals and transcripts are (default: the
    team directory's agents/). Raises `UsageError` for a missing source or `agent_dir`, an
    unknown envelope id or a `dest` that exists and is not empty."""
    destination = Path(dest)
    if not is_url(source) and not TeamDir.at(source).holds_team():
        raise UsageError(f"no team at {source}: there is no {TeamDir.at(source).roster}")
    if os.path.lexists(destination) and not (
        destination.is_dir() and not any(destination.iterdir())
    ):
        raise UsageError(f"{destination} exists and is not empty: fork into a new directory")
    validate_name(destination.name, what="team name (the new directory's name)")
    if agent_dir is not None and not Path(agent_dir).is_dir():  # else: no journals, silently
        raise UsageError(f"no agents' folder at {agent_dir}: give the --agent-dir the team used")
    with open_view(source) as view:
        try:
            return _fork(view, at, destination, agent_dir)
        except BaseException:
            if TeamDir(destination).roster.exists():  # ours, half written: not a fork
                shutil.rmtree(destination, ignore_errors=True)
            raise


def _fork(
    view: TeamView, at: str, dest: Path, agent_dir: str | os.PathLike[str] | None
) -> ForkSummary:
    members = view.members()
    inboxes = {name: [_seen(entry) for entry in view.scan(name)] for name in members}
    sent: dict[str, float] = {}
    for records in inboxes.values():
        for record in records:
            if record.envelope is not None:
                sent.setdefault(record.envelope.id, record.envelope.ts)
    if at not in sent:
        raise UsageError(
            f"no envelope {at!r} in team {view.team!r}: give the id of an envelope in one of "
            "its inboxes (teamrt replay shows them)"
        )
    cut = sent[at]
    kept = {name: _prefix(records, at, cut) for name, records in inboxes.items()}
    in_cut = [r.envelope for name in members for r in inboxes[name][: kept[name]] if r.envelope]
    responded = {e.in_reply_to for e in in_cut if e.kind == "response" and e.in_reply_to}

    source_agents = (
        Path(agent_dir)
        if agent_dir is not None
        else (TeamDir(view.directory).agents.path if view.directory is not None else None)
    )
    try:
        journals = {name: _cut_journal(source_agents, name, cut, sent) for name in members}
    except OSError as exc:
        raise StoreError(f"read the agents' files: {exc}", errno=exc.errno or 0) from None

    # an agent stopped between a reply and the results of its tool calls runs those calls
    # again when it resumes: what they had sent is sent again, so the first copy is not
    # delivered in the fork
    again = {
        name: journal.last
        for name, journal in journals.items()
        if journal is not None and _unfinished(journal.state)
    }
    cuts: dict[str, InboxCut] = {}
    summaries: dict[str, InboxFork] = {}
    for name in members:
        records = inboxes[name][: kept[name]]
        journal = journals[name]
        has_files = source_agents is not None and (
            AgentDir(source_agents).journal(name).exists()
            or AgentDir(source_agents).transcript(name).exists()
        )
        committed = view.committed(name) if not has_files else None
        resent = [_sent_again(r, again) for r in records]
        handled = [
            again_ or _handled(r, responded, journal.state if journal else None, committed)
            for r, again_ in zip(records, resent, strict=True)
        ]
        # what is sent again must not be taken for a duplicate of itself
        recent = [
            r.envelope.id
            for r, done, again_ in zip(records, handled, resent, strict=True)
            if done and not again_ and r.envelope
        ]
        undated = frozenset(
            i
            for i, r in enumerate(records)
            if r.envelope is not None
            and r.envelope.kind == "request"
            and r.envelope.deadline is not None
            and r.envelope.id not in responded
        )
        cuts[name] = InboxCut(handled=handled, recent=recent, undated=undated)
        summaries[name] = InboxFork(len(records), len(inboxes[name]) - len(records), sum(handled))

    origin = {"forked_at": at, "cut": cut}
    if dest.is_dir() and not dest.is_symlink():
        dest.rmdir()  # empty (checked): the team directory is made afresh, with its own mode
    export_team(view, dest, cuts=cuts, rename=True, origin=origin)

    try:
        agents = _fork_agents(source_agents, dest, members, journals, cut)
    except OSError as exc:
        raise StoreError(
            f"fork the agents' files into {dest}: {exc.strerror}", errno=exc.errno or 0
        ) from None

    open_requests = tuple(
        OpenRequest(e.id, e.sender, e.recipient, e.type)
        for e in in_cut
        if e.kind == "request" and e.id not in responded
    )
    return ForkSummary(
        describe(view.locator), dest, at, cut, summaries, agents, _unique(open_requests)
    )


def _fork_agents(
    source_agents: Path | None,
    dest: Path,
    members: tuple[str, ...],
    journals: dict[str, _JournalCut | None],
    cut: float,
) -> dict[str, AgentFork]:
    """Write each agent's journal and transcript as they were at `cut` into `dest`/agents."""
    agents: dict[str, AgentFork] = {}
    if source_agents is not None:
        target = TeamDir(dest).agents.path
        target.mkdir(mode=0o700, exist_ok=True)
        for name in members:
            journal = journals[name]
            calls = _cut_transcript(source_agents, target, name, cut)
            if journal is None and calls == 0:
                if AgentDir(source_agents).journal(name).exists():
                    agents[name] = AgentFork(None, 0, 0, None, False, 0)
                continue
            agents[name] = _write_journal(source_agents, target, name, journal, calls)
    return agents


def _seen(entry: Entry) -> _Seen:
    decoded = decode_entry(entry)
    if not isinstance(decoded, Record):
        return _Seen(None, entry.end)
    e = decoded.envelope
    sent = _Sent(e.id, e.kind, e.type, e.sender, e.recipient, e.in_reply_to, e.ts, e.deadline)
    return _Seen(sent, entry.end)


def _prefix(records: list[_Seen], at: str, cut: float) -> int:
    """How many records of one inbox the fork keeps (see the module docstring)."""
    for index, record in enumerate(records):
        if record.envelope is not None and record.envelope.id == at:
            return index + 1
    count = 0
    for index, record in enumerate(records):
        if record.envelope is None:
            continue
        if record.envelope.ts > cut:
            break
        count = index + 1  # undecodable records after the last kept one are left out
    return count


def _handled(
    record: _Seen, responded: set[str], state: AgentState | None, committed: Cursor | None
) -> bool:
    envelope = record.envelope
    if envelope is None or envelope.kind == "response":
        return True
    if envelope.kind == "request":
        return envelope.id in responded
    if state is not None:
        return envelope.id in state.handled
    if committed is not None:
        return _covers(committed, record.end)
    return False


def _unfinished(state: AgentState) -> bool:
    """Whether the state stops between a reply and the results of its tool calls."""
    step = state.open_step
    return step is not None and any(c.id not in step.results for c in step.reply.tool_calls)


def _sent_again(record: _Seen, again: dict[str, float]) -> bool:
    """Whether the record was sent by a tool call that the fork runs again."""
    envelope = record.envelope
    if envelope is None or envelope.sender not in again:
        return False
    return envelope.ts > again[envelope.sender]


def _covers(cursor: Cursor, end: Position) -> bool:
    """Whether a committed cursor counts the record ending at `end` as handled."""
    if end <= cursor.position:
        return True
    return any((a, b) < end <= (c, d) for a, b, c, d in cursor.ahead)


def _unique(requests: Iterable[OpenRequest]) -> tuple[OpenRequest, ...]:
    seen: dict[str, OpenRequest] = {}
    for request in requests:
        seen.setdefault(request.id, request)
    return tuple(seen.values())


# --- journals and transcripts --------------------------------------------------------------------


@dataclass
class _JournalCut:
    which: str  # "current" or "previous"
    lines: list[bytes]  # the lines kept, as written
    dropped: int
    state: AgentState
    last: float  # when the last line kept was written


def _id_time(id_: str) -> float | None:
    """The send time an envelope id carries (its first 14 hex digits: microseconds)."""
    id_ = id_.removeprefix("round:")
    try:
        return int(id_[:14], 16) / 1e6 if len(id_) >= 14 else None
    except ValueError:
        return None


def _times(
    lines: list[tuple[bytes, dict[str, Any]]],
    sent: dict[str, float],
    calls: list[float],
    written: float,
) -> list[float]:
    """When each journal line was written: its `ts`. A line of an older teamrt has none: a
    start is placed at its task's request, a model call at the matching transcript record
    (`calls`: the times of this journal's calls, when the transcript has them), any other line
    at the next line that has a time, or at `written` (the file's last change) at the end."""
    times: list[float | None] = []
    call_index = 0
    for _, record in lines:
        ts = record.get("ts")
        kind = record.get("t")
        if kind == "call":
            call_index += 1
        if isinstance(ts, int | float):
            times.append(float(ts))
        elif kind == "start":
            task_id = (record.get("state") or {}).get("task_id")
            at = sent.get(task_id, _id_time(task_id)) if isinstance(task_id, str) else None
            times.append(at)
        elif kind == "call" and len(calls) >= call_index:
            times.append(calls[call_index - 1])
        else:
            times.append(None)
    out: list[float] = []
    following = written
    for value in reversed(times):
        following = value if value is not None else following
        out.append(following)
    out.reverse()
    return out


def _read_lines(path: Path) -> list[tuple[bytes, dict[str, Any]]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(record, dict):
            out.append((line, record))
    return out


def _cut_journal(
    directory: Path | None, name: str, cut: float, sent: dict[str, float]
) -> _JournalCut | None:
    """Agent `name`'s journal as it was at `cut`, or None if it had none then."""
    if directory is None:
        return None
    journal = Journal(AgentDir(directory).journal(name))
    versions = [
        (which, path, _read_lines(path))
        for which, path in (("current", journal.path), ("previous", journal.previous_path))
    ]
    # the transcript's last calls are the current journal's, and those before, the previous's
    transcript = [
        float(r["ts"])
        for _, r in _read_lines(AgentDir(directory).transcript(name))
        if isinstance(r.get("ts"), int | float)
    ]
    oldest: dict[str, Any] | None = None
    for which, path, lines in versions:
        if not lines or lines[0][1].get("t") != "start":
            continue
        oldest = lines[0][1]
        mine = sum(1 for _, r in lines if r.get("t") == "call")
        later = (
            sum(1 for _, r in versions[0][2] if r.get("t") == "call") if which != "current" else 0
        )
        upto = len(transcript) - later
        calls = transcript[max(0, upto - mine) : upto] if upto >= mine else []
        times = _times(lines, sent, calls, path.stat().st_mtime)
        if times[0] > cut:
            continue  # this journal began after the cut: the one before held it
        count = next((i for i, t in enumerate(times) if t > cut), len(lines))
        kept = [line for line, _ in lines[:count]]
        state = _replayed(kept, path)
        return _JournalCut(which, kept, len(lines) - count, state, times[count - 1])
    if oldest is not None:
        snapshot = oldest.get("state") or {}
        if snapshot.get("handled") or int(snapshot.get("tasks") or 1) > 1:
            raise UsageError(
                f"{name}'s journals begin after the cut (a journal keeps the current task and "
                "the one before): fork at a later envelope"
            )
    return None


def _replayed(lines: list[bytes], origin: Path) -> AgentState:
    """The state the kept lines rebuild (through a scratch copy: loading never writes the
    source)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / origin.name
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        state = Journal(path).load()
    if state is None:
        raise UsageError(f"{origin}: the journal's first line is not a start record")
    return state


def _write_journal(
    source: Path, target: Path, name: str, cut: _JournalCut | None, calls: int
) -> AgentFork:
    if cut is None:
        return AgentFork(None, 0, 0, None, False, calls)
    journal = Journal(AgentDir(target).journal(name))
    _write(journal.path, b"".join(line + b"\n" for line in cut.lines))
    if cut.which == "current":  # the task before stays reachable in the fork too
        previous = Journal(AgentDir(source).journal(name)).previous_path
        if previous.exists():
            _write(journal.previous_path, previous.read_bytes())
    state = cut.state
    return AgentFork(
        cut.which,
        len(cut.lines),
        cut.dropped,
        state.task_id,
        state.stop is None and state.task_id is not None,
        calls,
    )


def _cut_transcript(source: Path, target: Path, name: str, cut: float) -> int:
    """Copy the model calls of `name`'s transcript recorded at or before `cut`; their count."""
    kept = [
        line
        for line, record in _read_lines(AgentDir(source).transcript(name))
        if isinstance(record.get("ts"), int | float) and record["ts"] <= cut
    ]
    if kept:
        _write(AgentDir(target).transcript(name), b"".join(line + b"\n" for line in kept))
    return len(kept)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


# --- re-driving a fork ---------------------------------------------------------------------------


async def wait_for_answers(
    mail: Mailboxes, requests: Iterable[str], *, member: str = "lead", timeout: float = 60.0
) -> dict[str, Response]:
    """Wait for the responses to `requests` (ids of requests `member` sent: a fork's open
    requests) in `member`'s inbox, and return them by request id; other envelopes read
    meanwhile are acked and dropped. For a driver that consumes the lead's inbox itself (a
    `Team(..., lead_here=False)` on the fork, which leaves the lead's inbox to it). Raises
    `ReceiveTimeout` naming what did not come in `timeout` seconds."""
    wanted = set(requests)
    answers: dict[str, Response] = {}
    inbox = await mail.open_inbox(member)
    with anyio.move_on_after(timeout):
        while wanted - answers.keys():
            envelope = await inbox.receive()
            if isinstance(envelope, Response) and envelope.in_reply_to in wanted:
                answers[envelope.in_reply_to] = envelope
            await inbox.ack(envelope)
    missing = sorted(wanted - answers.keys())
    if missing:
        raise ReceiveTimeout(f"no answer in {timeout:g}s to {', '.join(missing)}")
    return answers


__all__ = [
    "AgentFork",
    "ForkSummary",
    "InboxFork",
    "OpenRequest",
    "fork_team",
    "wait_for_answers",
]

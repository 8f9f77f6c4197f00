"""`teamrt replay`: print a team directory's timeline as text, JSON lines, a Mermaid sequence
diagram, or one self-contained HTML page; `--follow` keeps printing new envelopes."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from itertools import islice
from typing import Any, TextIO

from teamrt.cli.progress import Progress, on_terminal
from teamrt.cli.replay_page import Html
from teamrt.errors import UsageError
from teamrt.mail import TeamView, open_view
from teamrt.replay import (
    AGENT_KINDS,
    Event,
    Filter,
    Joiner,
    Summary,
    finish,
    timeline,
)
from teamrt.replay.timeline import _event

_COLOURS = [31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96]


# C0 and C1 controls (ESC starts terminal escape sequences), DEL, and the bidirectional overrides
# that can make a line read differently from what it holds: shown as escapes, never sent raw
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe(text: object) -> str:
    """`text` with every control character shown as an escape (`\\x1b`, `\\u202e`)."""
    return _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], str(text))


def _clock(ts: float) -> str:
    """The time of day of `ts`, or the number itself when it is no time a clock can show."""
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]
    except (ValueError, OverflowError, OSError):
        return f"{ts:<12.6g}"[:12]


def _fold(body: Any, width: int = 80) -> str:
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, default=str)
    text = safe(" ".join(str(text).split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def _what(e: Event) -> Any:
    """What an agent's journal line or a conductor decision says, in a few words."""
    body = e.body
    if isinstance(body, dict) and e.kind == "decision" and "action" in body:
        subtask = f"{body['subtask']}: " if body.get("subtask") else ""
        return f"{subtask}{body.get('detail', '')}"
    if isinstance(body, dict) and e.kind == "stop" and "detail" in body:
        return body["detail"]
    return body


class Text:
    """One line per envelope, a colour per agent on a terminal."""

    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out, self.colour = out, colour
        self._colours: dict[str, int] = {}

    def _name(self, name: str) -> str:
        name = safe(name)
        if not self.colour:
            return name
        code = self._colours.setdefault(name, _COLOURS[len(self._colours) % len(_COLOURS)])
        return f"\x1b[{code}m{name}\x1b[0m"

    def event(self, e: Event) -> None:
        if e.kind == "corrupt":
            self.out.write(
                f"{'?':12}  {e.inbox}'s inbox, segment {e.segment} offset {e.offset}:"
                f" undecodable ({safe(e.reason)})\n"
            )
            return
        flags = f" [{', '.join(e.flags)}]" if e.flags else ""
        latency = f" ({e.latency * 1000:.1f} ms)" if e.latency is not None else ""
        pad = " " * max(0, 10 - len(e.sender))
        if e.kind in AGENT_KINDS or e.kind == "decision":
            when = _clock(e.ts) if math.isfinite(e.ts) else f"{'(no time)':12}"
            self.out.write(
                f"{when}  {pad}{self._name(e.sender)}    {'':10} {safe(e.kind):9} "
                f"{safe(e.type):16}{flags}  {_fold(_what(e))}\n"
            )
            return
        self.out.write(
            f"{_clock(e.ts)}  {pad}{self._name(e.sender)} -> "
            f"{self._name(e.recipient):10} {safe(e.kind):9} {safe(e.type):16}"
            f"{latency}{flags}  {_fold(e.body)}\n"
        )

    def end(self, summary: Summary) -> None:
        p50 = summary.latency_percentile(50)
        p99 = summary.latency_percentile(99)
        self.out.write(
            f"\n{summary.envelopes} envelopes; {summary.requests} requests, "
            f"{summary.answered} answered"
        )
        if p50 is not None and p99 is not None:
            self.out.write(f" (latency p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms)")
        self.out.write(
            f"; {len(summary.unanswered)} unanswered ({summary.timed_out} timed out), "
            f"{summary.late} late, {summary.errors} errors, "
            f"{summary.answered_twice} answered twice, {summary.duplicates} "
            f"duplicates, {summary.corrupt} undecodable lines\n"
        )
        if summary.crashes or summary.cancels or summary.stops or summary.decisions:
            self.out.write(
                f"{summary.crashes} crashes, {summary.cancels} cancellations, "
                f"{summary.stops} stop reports, {summary.decisions} conductor decisions "
                f"({summary.escalations} escalations)\n"
            )
        for name, c in summary.agents.items():
            self.out.write(
                f"  {self._name(name)}: sent {c.sent}, received {c.received}, "
                f"unanswered {c.unanswered}, errors {c.errors}, crashes {c.crashes}, "
                f"cancellations {c.cancels}, flagged {c.flagged}\n"
            )
        for e in summary.unanswered[:20]:
            self.out.write(
                f"  unanswered: {safe(e.id)} {safe(e.sender)} -> {safe(e.recipient)} "
                f"{safe(e.type)} "
                f"[{', '.join(e.flags)}] {_fold(e.body, 60)}\n"
            )


class JsonLines:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def event(self, e: Event) -> None:
        self.out.write(json.dumps(e.to_json_dict(), ensure_ascii=False, default=str) + "\n")

    def end(self, summary: Summary) -> None:
        self.out.write(
            json.dumps(
                {
                    "summary": {
                        "events": summary.events,
                        "envelopes": summary.envelopes,
                        "requests": summary.requests,
                        "answered": summary.answered,
                        "unanswered": [e.id for e in summary.unanswered],
                        "timed_out": summary.timed_out,
                        "late": summary.late,
                        "errors": summary.errors,
                        "answered_twice": summary.answered_twice,
                        "duplicates": summary.duplicates,
                        "corrupt": summary.corrupt,
                        "crashes": summary.crashes,
                        "cancels": summary.cancels,
                        "stops": summary.stops,
                        "decisions": summary.decisions,
                        "escalations": summary.escalations,
                        "flagged": summary.flagged,
                        "agents": {n: asdict(c) for n, c in summary.agents.items()},
                        "latency_p50": summary.latency_percentile(50),
                        "latency_p99": summary.latency_percentile(99),
                        "read_to": {n: list(p) for n, p in summary.read_to.items()},
                    }
                }
            )
            + "\n"
        )


class Mermaid:
    """A sequence diagram: requests and messages as solid arrows, responses dashed."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.out.write("sequenceDiagram\n")
        self._participants: set[str] = set()

    def _participant(self, name: str) -> str:
        ident = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "unknown"
        if ident not in self._participants:
            self._participants.add(ident)
            self.out.write(f"    participant {ident} as {safe(name)}\n")
        return ident

    def event(self, e: Event) -> None:
        if e.kind in AGENT_KINDS or e.kind == "decision":
            who = self._participant(e.sender)
            label = _fold(f"{e.kind} {e.type}: {_fold(_what(e), 40)}", 60)
            label = label.replace(";", ",").replace("#", "")
            self.out.write(f"    Note over {who}: {safe(label)}\n")
            return
        if e.kind == "corrupt":
            who = self._participant(e.inbox)
            self.out.write(f"    Note over {who}: undecodable line at offset {e.offset}\n")
            return
        a, b = self._participant(e.sender), self._participant(e.recipient)
        arrow = "-->>" if e.kind == "response" else "->>"
        label = _fold(f"{safe(e.type)}: {_fold(e.body, 40)}", 60).replace(";", ",").replace("#", "")
        flags = f" [{', '.join(e.flags)}]" if e.flags else ""
        self.out.write(f"    {a}{arrow}{b}: {safe(label)}{flags}\n")

    def end(self, summary: Summary) -> None:
        for e in summary.unanswered:
            who = self._participant(e.recipient)
            self.out.write(f"    Note over {who}: unanswered {safe(e.type)} {safe(e.id[-8:])}\n")


Formatter = Text | JsonLines | Mermaid | Html


def run_replay(
    team_dir: str,
    *,
    fmt: str,
    keep: Filter,
    follow: bool,
    colour: str,
    out: TextIO | None = None,
    poll: float = 0.2,
    follow_for: float | None = None,
    quiet: bool = False,
) -> int:
    """Print the timeline of `team_dir` to `out` (stdout by default). While the files are
    read, progress is drawn on stderr if it is a terminal, unless `quiet`, or the timeline
    itself goes to the terminal (where it shows how far the reading has got)."""
    stream = out or sys.stdout
    use_colour = colour == "always" or (colour == "auto" and stream.isatty())
    view = open_view(team_dir)
    formatter: Formatter
    if fmt == "json":
        formatter = JsonLines(stream)
    elif fmt == "mermaid":
        formatter = Mermaid(stream)
    elif fmt == "html":
        formatter = Html(stream, view.team, list(view.members()))
    else:
        formatter = Text(stream, use_colour)
    summary = Summary()
    joiner = Joiner()  # requests stay open in it through --follow: answers may still come
    positions: dict[str, tuple[int, int]] = {}
    progress = Progress(
        f"replay {view.team}",
        unit="bytes",
        quiet=quiet or on_terminal(stream),
    )
    watch = _counted(progress, view) if progress.drawn else None
    with progress:
        events = timeline(
            view,
            summary=summary,
            positions=positions,
            keep=keep,
            joiner=joiner,
            agent_files=True,
            watch=watch,
        )
        for event in events:
            formatter.event(event)
    if follow and fmt in ("text", "json"):
        _follow(view, positions, formatter, keep, stream, poll, follow_for, joiner, summary)
    finish(joiner, summary, keep)
    summary.read_to.update(positions)
    formatter.end(summary)
    stream.flush()
    return 0


def _counted(progress: Progress, view: TeamView) -> Callable[[Iterator[Event]], Iterator[Event]]:
    """A `timeline` watch that tells `progress`, every 256 events, how many have been read and
    how many bytes of inbox records, of the inboxes' size when the replay started (where the
    store tells it). It takes the events 256 at a time, which costs nothing measurable per
    event."""
    total = sum(view.sizes(name).get("bytes", 0) for name in view.members())
    progress.update(0, total=total or None)

    def count(events: Iterator[Event]) -> Iterator[Event]:
        read = done = 0
        while chunk := list(islice(events, 256)):
            yield from chunk
            read += len(chunk)
            done += sum(len(e.raw) + 1 for e in chunk if e.segment >= 0)  # inbox records only
            progress.update(done, detail=f"{read:,} events")
        progress.update(max(done, total))  # every inbox read to its end

    return count


def _follow(
    view: TeamView,
    positions: dict[str, tuple[int, int]],
    formatter: Formatter,
    keep: Filter,
    stream: TextIO,
    poll: float,
    follow_for: float | None,
    joiner: Joiner,
    summary: Summary,
) -> None:
    """Print envelopes appended after the first pass (from where it stopped in each inbox),
    as they arrive, until interrupted, joined and counted like the first pass's. Members added
    meanwhile are followed from the start of their inboxes."""
    stop = None if follow_for is None else time.monotonic() + follow_for
    try:
        while stop is None or time.monotonic() < stop:
            batch: list[Event] = []
            for name in view.members():
                for entry in view.scan(name, after=positions.get(name)):
                    positions[name] = entry.end
                    batch.append(_event(name, entry.at[0], entry.at[1], entry.raw))
            for event in sorted(batch, key=lambda e: e.ts):
                joiner.feed(event)
                if keep(event):
                    summary.count(event)
                    formatter.event(event)
            stream.flush()
            time.sleep(poll)
    except KeyboardInterrupt:
        pass


def parse_time(value: str | None, *, option: str = "time") -> float | None:
    """Seconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise UsageError(
                f"{option} {value!r} is not a time: give seconds since the epoch (e.g. "
                f"{int(time.time()) - 3600}) or an ISO 8601 time (e.g. 2026-11-30T14:05, UTC)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not math.isfinite(seconds):
        raise UsageError(f"{option} {value!r} is not a time: give a finite number of seconds")
    return seconds


def split(values: Iterable[str] | None) -> tuple[str, ...]:
    return tuple(v for value in values or () for v in value.split(",") if v)

"""`teamrt replay`: print a team directory's timeline as text, JSON lines, a Mermaid sequence
diagram, or one self-contained HTML page; `--follow` keeps printing new envelopes."""

from __future__ import annotations

import html
import json
import re
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from teamrt.errors import UsageError
from teamrt.mail.filestore import InboxPaths
from teamrt.mail.log import LineSplitter
from teamrt.replay import Event, Filter, Summary, _event, members, select, timeline

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
        self.out.write(
            f"{_clock(e.ts)}  {pad}{self._name(e.sender)} -> "
            f"{self._name(e.recipient):10} {safe(e.kind):9} {safe(e.type):16}"
            f"{latency}{flags}  {_fold(e.body)}\n"
        )

    def end(self, summary: Summary) -> None:
        p50 = summary.latency_percentile(50)
        p99 = summary.latency_percentile(99)
        self.out.write(
            f"\n{summary.events} envelopes; {summary.requests} requests, "
            f"{summary.answered} answered"
        )
        if p50 is not None and p99 is not None:
            self.out.write(f" (latency p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms)")
        self.out.write(
            f"; {len(summary.unanswered)} unanswered, {summary.late} late, "
            f"{summary.answered_twice} answered twice, {summary.duplicates} "
            f"duplicates, {summary.corrupt} undecodable lines\n"
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
                        "requests": summary.requests,
                        "answered": summary.answered,
                        "unanswered": [e.id for e in summary.unanswered],
                        "late": summary.late,
                        "answered_twice": summary.answered_twice,
                        "duplicates": summary.duplicates,
                        "corrupt": summary.corrupt,
                        "latency_p50": summary.latency_percentile(50),
                        "latency_p99": summary.latency_percentile(99),
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


HTML_HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>teamrt replay: TEAM</title>
<style>
body{font:14px system-ui,sans-serif;margin:1em}
table{border-collapse:collapse;width:100%}
td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}
tr.event{cursor:pointer} tr.event:hover{background:#f4f4f8}
td.body{white-space:normal;max-width:40em}
.clamp{display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;overflow:hidden}
.flag{color:#b00;font-weight:bold} pre#detail{background:#f7f7f7;padding:1em;white-space:pre-wrap}
#controls{position:sticky;top:0;background:#fff;padding:.5em 0}
</style></head><body>
<h1>teamrt replay: TEAM</h1>
<div id="controls">Filter: <input id="filter" placeholder="agent, type, text..." size="40">
<label><input type="checkbox" id="flagged"> only flagged</label> <span id="count"></span></div>
<table><thead><tr><th>time</th><th>from</th><th>to</th><th>kind</th><th>type</th>
<th>latency</th><th>flags</th><th>body</th></tr></thead><tbody id="rows"></tbody></table>
<h2>Selected envelope</h2><pre id="detail">Click a row.</pre>
<script id="events" type="application/json">[
"""

HTML_TAIL = """]</script>
<script>
const events = JSON.parse(document.getElementById("events").textContent);
const rows = document.getElementById("rows");
function text(e) { return JSON.stringify(e).toLowerCase(); }
const colours = {};
const palette = ["#c0392b", "#2471a3", "#1e8449", "#9a7d0a", "#7d3c98", "#117a65", "#a04000"];
function colour(name) {
  if (!(name in colours)) colours[name] = palette[Object.keys(colours).length % palette.length];
  return colours[name];
}
function render() {
  const q = document.getElementById("filter").value.toLowerCase();
  const flagged = document.getElementById("flagged").checked;
  rows.textContent = "";
  let shown = 0;
  for (const e of events) {
    if (q && !text(e).includes(q)) continue;
    if (flagged && !(e.flags && e.flags.length)) continue;
    const tr = document.createElement("tr");
    tr.className = "event";
    const cells = [new Date(e.ts * 1000).toISOString().slice(11, 23), e.sender, e.recipient,
      e.kind, e.type, e.latency == null ? "" : (e.latency * 1000).toFixed(1) + " ms",
      (e.flags || []).join(", "), JSON.stringify(e.body)];
    cells.forEach((value, i) => {
      const td = document.createElement("td");
      if (i === 7) {  // bodies folded to two lines; click the row for the whole envelope
        const div = document.createElement("div");
        div.className = "clamp";
        div.textContent = value;
        td.className = "body";
        td.appendChild(div);
      } else {
        td.textContent = value;
      }
      if (i === 1 || i === 2) td.style.color = colour(value);
      if (i === 6) td.className = "flag";
      tr.appendChild(td);
    });
    tr.addEventListener("click", () => {
      document.getElementById("detail").textContent = JSON.stringify(e, null, 2);
    });
    rows.appendChild(tr);
    shown++;
  }
  document.getElementById("count").textContent = shown + " of " + events.length + " envelopes";
}
document.getElementById("filter").addEventListener("input", render);
document.getElementById("flagged").addEventListener("change", render);
render();
</script></body></html>
"""


class Html:
    """One self-contained page (no network): the events as JSON, a table, filters, details."""

    def __init__(self, out: TextIO, team: str) -> None:
        self.out = out
        self.out.write(HTML_HEAD.replace("TEAM", html.escape(team)))
        self._first = True

    def event(self, e: Event) -> None:
        data = json.dumps(e.to_json_dict(), ensure_ascii=False, default=str)
        data = data.replace("</", "<\\/")  # keep the script element closed only by its end tag
        self.out.write(("" if self._first else ",\n") + data)
        self._first = False

    def end(self, summary: Summary) -> None:
        self.out.write("\n" + HTML_TAIL)


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
) -> int:
    stream = out or sys.stdout
    use_colour = colour == "always" or (colour == "auto" and stream.isatty())
    formatter: Formatter
    if fmt == "json":
        formatter = JsonLines(stream)
    elif fmt == "mermaid":
        formatter = Mermaid(stream)
    elif fmt == "html":
        formatter = Html(stream, Path(team_dir).name)
    else:
        formatter = Text(stream, use_colour)
    summary = Summary()
    positions: dict[str, tuple[int, int]] = {}
    for event in select(timeline(team_dir, summary=summary, positions=positions), keep):
        formatter.event(event)
    if follow and fmt in ("text", "json"):
        _follow(Path(team_dir), positions, formatter, keep, stream, poll, follow_for)
    formatter.end(summary)
    stream.flush()
    return 0


def _follow(
    root: Path,
    positions: dict[str, tuple[int, int]],
    formatter: Formatter,
    keep: Filter,
    stream: TextIO,
    poll: float,
    follow_for: float | None,
) -> None:
    """Print envelopes appended after the first pass (from where it stopped in each inbox),
    as they arrive, until interrupted. Follows the active segment of each inbox."""
    readers: dict[str, tuple[Path, LineSplitter, int]] = {}
    for name in members(root):
        paths = InboxPaths(root / "inboxes", name)
        index, offset = positions.get(name, (0, 0))
        readers[name] = (paths.segments()[-1], LineSplitter(offset), index)
    stop = None if follow_for is None else time.monotonic() + follow_for
    try:
        while stop is None or time.monotonic() < stop:
            batch: list[Event] = []
            for name in members(root):
                if name not in readers:
                    readers[name] = (InboxPaths(root / "inboxes", name).log, LineSplitter(), 0)
                path, splitter, index = readers[name]
                try:
                    with path.open("rb") as f:
                        f.seek(splitter.offset)
                        data = f.read()
                except FileNotFoundError:
                    continue
                for offset, _end, raw, _long in splitter.feed(data):
                    batch.append(_event(name, index, offset, raw))
            for event in sorted(batch, key=lambda e: e.ts):
                if keep(event):
                    formatter.event(event)
            stream.flush()
            time.sleep(poll)
    except KeyboardInterrupt:
        pass


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise UsageError(
                f"not a time: {value!r} (use seconds since the epoch or an ISO 8601 time)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()


def split(values: Iterable[str] | None) -> tuple[str, ...]:
    return tuple(v for value in values or () for v in value.split(",") if v)

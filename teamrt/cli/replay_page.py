"""The replay page: one self-contained HTML file (no network, no external script) with a summary,
a lane per agent drawn beside each row, flagged rows marked, a search box, and paging.

How it stays usable on a huge run: the page holds at most `max_rows` events (the first half, then
every flagged one up to a quarter, then the last quarter), each body cut to `body_chars`, and the
browser draws one page of rows at a time; the summary counts every event. Writing streams: the
first rows go out as they come and only the bounded tail and flagged buffers wait for the end.
It must never load anything from the network or put a file's text into the page unescaped.
"""

from __future__ import annotations

import html
import json
from collections import deque
from dataclasses import asdict, fields
from typing import Any, TextIO

from teamrt.replay import Event, Summary

MAX_ROWS = 20_000
BODY_CHARS = 600


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no `<` (outside strings JSON has none; inside, the
    escape reads the same), so nothing in it can close the element or open a comment."""
    text = json.dumps(value, ensure_ascii=False, default=str, allow_nan=False)
    return text.replace("<", "\\u003c")


class Html:
    """One self-contained page: the events as JSON, drawn by the page's own script."""

    def __init__(
        self,
        out: TextIO,
        team: str,
        agents: list[str],
        *,
        max_rows: int = MAX_ROWS,
        body_chars: int = BODY_CHARS,
    ) -> None:
        self.out = out
        self.body_chars = body_chars
        self._head = max_rows - 2 * (max_rows // 4)
        self._flagged: list[tuple[int, Event]] = []
        self._flagged_cap = max_rows // 4
        self._tail: deque[tuple[int, Event]] = deque(maxlen=max_rows // 4)
        # (inbox, id) -> position of the requests not in the first rows: where to put the ones
        # found unanswered at the end (the most recent only: bounded)
        self._index: dict[tuple[str, str], int] = {}
        self._requests: set[str] = set()  # requests written in the first rows
        self.seen = 0
        self.written = 0
        out.write(HEAD.replace("TEAM", html.escape(team)))
        out.write(
            '<script id="lanes" type="application/json">' + _script_json(agents) + "</script>\n"
        )
        out.write('<script id="events" type="application/json">[\n')

    def _row(self, n: int, e: Event) -> str:
        data = e.to_json_dict()
        data["n"] = n
        body = json.dumps(data["body"], ensure_ascii=False, default=str)
        if len(body) > self.body_chars:
            data["body"] = body[: self.body_chars] + "..."
            data["truncated"] = len(body)
        if data["deadline"] is not None and not isinstance(data["deadline"], int | float):
            data["deadline"] = str(data["deadline"])
        try:
            return _script_json(data)
        except ValueError:  # a NaN or an infinity in a body: shown as text
            data["body"] = str(data["body"])
            data["deadline"] = str(data["deadline"])
            return _script_json(data)

    def _write(self, n: int, e: Event) -> None:
        self.out.write(("" if self.written == 0 else ",\n") + self._row(n, e))
        self.written += 1

    def event(self, e: Event) -> None:
        n = self.seen
        self.seen += 1
        if self.written < self._head:
            self._write(n, e)
            if e.kind == "request":
                self._requests.add(e.id)
        elif e.flags and len(self._flagged) < self._flagged_cap:
            self._flagged.append((n, e))
        else:
            self._tail.append((n, e))
            if e.kind == "request":
                self._index.setdefault((e.inbox, e.id), n)
                if len(self._index) > 4 * self._flagged_cap:  # bounded: forget the oldest
                    del self._index[next(iter(self._index))]

    def end(self, summary: Summary) -> None:
        """The buffered rows, the requests found unanswered at the end, and the summary."""
        rows = dict((*self._flagged, *self._tail))
        patch: dict[str, list[str]] = {}
        for e in summary.unanswered:
            if e.id in self._requests:
                patch[e.id] = e.flags  # written before its flags were known
            elif (e.inbox, e.id) in self._index and len(rows) < 2 * self._flagged_cap:
                rows.setdefault(self._index[e.inbox, e.id], e)
        for n in sorted(rows):
            self._write(n, rows[n])
        stats: dict[str, Any] = {
            f.name: getattr(summary, f.name)
            for f in fields(summary)
            if f.name not in ("unanswered", "latencies", "agents")
        }
        stats["agents"] = {name: asdict(counts) for name, counts in summary.agents.items()}
        stats["unanswered"] = len(summary.unanswered)
        stats["latency_p50"] = summary.latency_percentile(50)
        stats["latency_p99"] = summary.latency_percentile(99)
        meta = {"seen": self.seen, "written": self.written, "head": self._head}
        self.out.write("\n]</script>\n")
        for name, value in (("summary", stats), ("unanswered", patch), ("meta", meta)):
            self.out.write(
                f'<script id="{name}" type="application/json">{_script_json(value)}</script>\n'
            )
        self.out.write(TAIL)


HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>teamrt replay: TEAM</title>
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<style>
body{font:14px system-ui,sans-serif;margin:1em;color:#222}
h1{font-size:1.4em;margin:.2em 0 .5em}
h2{font-size:1.1em;margin:1em 0 .3em}
#cards{display:flex;flex-wrap:wrap;gap:6px}
.card{border:1px solid #ccd;border-radius:4px;padding:4px 10px;min-width:5.5em;background:#fafaff}
.card b{display:block;font-size:1.3em}
.card.bad{border-color:#c33;background:#fff0f0;color:#900}
table{border-collapse:collapse}
#agents td,#agents th{padding:2px 10px;text-align:right}
#agents td:first-child,#agents th:first-child{text-align:left}
#timeline{width:100%}
#timeline td,#timeline th{padding:0 6px;border-bottom:1px solid #e4e4ea;text-align:left;
 white-space:nowrap;vertical-align:middle}
#timeline td.lane{padding:0}
#timeline svg{display:block;overflow:visible}
#lanehead{padding-right:56px}
tr.event{cursor:pointer;height:24px} tr.event:hover{background:#f0f0f8}
tr.agentline{background:#f4f8ff} tr.decision{background:#fbf8ec}
tr.flagged{background:#fff1f0} tr.flagged td:first-child{border-left:4px solid #c0392b}
tr.gap td{text-align:center;color:#777;font-style:italic;background:#f6f6f6}
tr.selected{outline:2px solid #2471a3}
td.body{max-width:0;width:100%}
.clamp{min-width:12em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.flag{color:#b00;font-weight:bold}
pre#detail{background:#f7f7f7;padding:1em;white-space:pre-wrap;max-height:30em;overflow:auto}
#controls{position:sticky;top:0;background:#fff;padding:.5em 0;z-index:1;
 border-bottom:1px solid #ccd}
#controls button{min-width:2.5em} #page{margin:0 .4em}
#notice{background:#fff8e0;border:1px solid #e0c060;padding:4px 8px;margin:.5em 0}
</style></head><body>
<h1>teamrt replay: TEAM</h1>
<section id="overview"><div id="cards"></div><div id="notice" hidden></div>
<h2>Per agent</h2><table id="agents"></table></section>
<h2>Timeline</h2>
<div id="controls">Search: <input id="search" type="search"
 placeholder="agent, type, id, text..." size="36">
<label><input type="checkbox" id="flagged"> only flagged</label>
<button id="first">&laquo;</button><button id="prev">&lsaquo;</button>
<span id="page"></span><button id="next">&rsaquo;</button><button id="last">&raquo;</button>
<span id="count"></span></div>
<table id="timeline"><thead><tr><th>#</th><th>time</th><th class="lane" id="lanehead"></th>
<th>from</th><th>to</th><th>kind</th><th>type</th><th>latency</th><th>flags</th>
<th>body</th></tr></thead><tbody id="rows"></tbody></table>
<h2>Selected event</h2><pre id="detail">Click a row.</pre>
"""

TAIL = """<script>
"use strict";
const data = id => JSON.parse(document.getElementById(id).textContent);
const events = data("events"), summary = data("summary"), meta = data("meta");
const patch = data("unanswered");
for (const e of events)  // requests found unanswered only at the end of the replay
  if (e.kind === "request" && patch[e.id] && !e.flags.length) e.flags = patch[e.id];
const PAGE = 100, LANE = 64, ROW = 24;
const lanes = data("lanes");
for (const e of events) for (const who of [e.sender, e.recipient])
  if (who && who !== "*" && who !== "?" && !lanes.includes(who)) lanes.push(who);
const palette = ["#c0392b", "#2471a3", "#1e8449", "#9a7d0a", "#7d3c98", "#117a65", "#a04000",
  "#2e4053", "#b03a2e", "#1a5276"];
const colour = name => palette[Math.max(0, lanes.indexOf(name)) % palette.length];
const x = name => lanes.indexOf(name) * LANE + LANE / 2;
const width = lanes.length * LANE;
const NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, parent) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}
function clock(ts) {
  if (ts == null) return "(no time)";
  const d = new Date(ts * 1000);
  return isNaN(d) ? String(ts) : d.toISOString().slice(11, 23);
}
const flagged = e => e.flags && e.flags.length > 0;

// the summary: every event of the replay, not only those in this page
const cards = [["events", summary.events], ["envelopes", summary.envelopes],
  ["requests", summary.requests], ["answered", summary.answered],
  ["unanswered", summary.unanswered, 1], ["timed out", summary.timed_out, 1],
  ["late", summary.late, 1], ["errors", summary.errors, 1],
  ["quarantined lines", summary.corrupt, 1], ["duplicates", summary.duplicates, 1],
  ["answered twice", summary.answered_twice, 1], ["crashes", summary.crashes, 1],
  ["cancellations", summary.cancels, 1], ["stops", summary.stops],
  ["decisions", summary.decisions], ["escalations", summary.escalations, 1],
  ["flagged", summary.flagged, 1]];
if (summary.latency_p50 != null) cards.push(
  ["latency p50", (summary.latency_p50 * 1000).toFixed(1) + " ms"],
  ["latency p99", (summary.latency_p99 * 1000).toFixed(1) + " ms"]);
for (const [label, value, bad] of cards) {
  const card = el("div", undefined, "card" + (bad && value ? " bad" : ""));
  card.dataset.name = label;
  card.appendChild(el("b", typeof value === "number" ? value.toLocaleString("en") : value));
  card.appendChild(document.createTextNode(label));
  document.getElementById("cards").appendChild(card);
}
const columns = ["sent", "received", "unanswered", "errors", "crashes", "cancels", "stops",
  "flagged"];  // unanswered: requests to the agent that nobody answered
const agents = document.getElementById("agents");
const head = agents.insertRow();
for (const c of ["agent", ...columns]) head.appendChild(el("th", c));
for (const [name, counts] of Object.entries(summary.agents)) {
  const tr = agents.insertRow();
  tr.dataset.agent = name;
  const td = el("td", name);
  td.style.color = colour(name);
  tr.appendChild(td);
  for (const c of columns) tr.appendChild(el("td", String(counts[c])));
}
if (meta.written < meta.seen) {
  const notice = document.getElementById("notice");
  notice.hidden = false;
  notice.textContent = "This page holds " + meta.written.toLocaleString("en") + " of " +
    meta.seen.toLocaleString("en") + " events: the first " + meta.head.toLocaleString("en") +
    ", then flagged ones, then the last ones (the summary counts them all). " +
    "Narrow the replay with --since, --until, --agent, --type or --grep to see the others.";
}

// the lanes' heading: one name above each lane
const heading = svg("svg", {width: width, height: 44});
lanes.forEach((name, i) => {
  const t = svg("text", {x: i * LANE + LANE / 2, y: 38, "text-anchor": "start",
    transform: `rotate(-28 ${i * LANE + LANE / 2} 38)`, fill: colour(name),
    "font-size": 12}, heading);
  t.textContent = name.length > 14 ? name.slice(0, 13) + "\u2026" : name;
});
document.getElementById("lanehead").appendChild(heading);

function lane(e) {
  const s = svg("svg", {width: width, height: ROW, role: "img"});
  for (const name of lanes)
    svg("line", {x1: x(name), x2: x(name), y1: 0, y2: ROW, stroke: "#ddd"}, s);
  const mid = ROW / 2, from = x(e.sender);
  const bad = flagged(e) ? "#c0392b" : null;
  if (e.kind === "crash" || e.kind === "cancel") {
    const c = e.kind === "crash" ? "#c0392b" : "#d35400";
    svg("line", {x1: from - 6, y1: mid - 6, x2: from + 6, y2: mid + 6, stroke: c,
      "stroke-width": 3}, s);
    svg("line", {x1: from - 6, y1: mid + 6, x2: from + 6, y2: mid - 6, stroke: c,
      "stroke-width": 3}, s);
  } else if (e.kind === "stop") {
    svg("rect", {x: from - 6, y: mid - 6, width: 12, height: 12, fill: bad || "#555"}, s);
  } else if (e.kind === "decision") {
    svg("path", {d: `M${from} ${mid - 7}L${from + 7} ${mid}L${from} ${mid + 7}L${from - 7} ${mid}Z`,
      fill: bad || "#9a7d0a"}, s);
  } else if (e.kind === "corrupt") {
    svg("text", {x: x(e.inbox) - 4, y: mid + 5, fill: "#c0392b", "font-weight": "bold"}, s)
      .textContent = "?";
  } else {
    const targets = e.recipient === "*" ? [e.inbox] : [e.recipient];
    for (const target of targets) {
      const to = x(target);
      const c = bad || colour(e.sender);
      if (to === from || lanes.indexOf(target) < 0) {
        svg("circle", {cx: from, cy: mid, r: 5, fill: c}, s);
        continue;
      }
      const dir = to > from ? 1 : -1;
      svg("line", {x1: from, y1: mid, x2: to - dir * 7, y2: mid, stroke: c, "stroke-width": 2,
        "stroke-dasharray": e.kind === "response" ? "4 3" : ""}, s);
      svg("path", {d: `M${to} ${mid}L${to - dir * 8} ${mid - 5}L${to - dir * 8} ${mid + 5}Z`,
        fill: c}, s);
      svg("circle", {cx: from, cy: mid, r: 3, fill: c}, s);
    }
  }
  return s;
}

let page = 0, view = [];
const lowered = new Map();
function haystack(e) {
  let text = lowered.get(e);
  if (text === undefined) lowered.set(e, text = JSON.stringify(e).toLowerCase());
  return text;
}
function select(e, tr) {
  for (const old of document.querySelectorAll("tr.selected")) old.classList.remove("selected");
  tr.classList.add("selected");
  document.getElementById("detail").textContent = JSON.stringify(e, null, 2);
}
function shown(e) {  // the body as a row shows it: what happened, for agents and decisions
  const b = e.body;
  if (e.kind === "decision" && b && typeof b === "object" && "action" in b)
    return (b.subtask ? b.subtask + ": " : "") + (b.detail || "");
  if (e.kind === "stop" && b && typeof b === "object" && "detail" in b) return b.detail;
  return typeof b === "string" ? b : JSON.stringify(b);
}
function row(e) {
  const tr = el("tr", undefined, "event");
  if (flagged(e)) tr.classList.add("flagged");
  if (e.kind === "stop" || e.kind === "crash" || e.kind === "cancel")
    tr.classList.add("agentline");
  if (e.kind === "decision") tr.classList.add("decision");
  tr.dataset.kind = e.kind;
  const agentline = e.kind === "stop" || e.kind === "crash" || e.kind === "cancel" ||
    e.kind === "decision";
  const latency = e.latency == null ? "" : (e.latency * 1000).toFixed(1) + " ms";
  const body = shown(e);
  const cells = [String(e.n + 1), clock(e.ts), null, e.kind === "corrupt" ? e.inbox : e.sender,
    agentline ? "" : e.recipient, e.kind, e.type, latency, (e.flags || []).join(", "),
    e.kind === "corrupt" ? "undecodable: " + e.reason : body];
  cells.forEach((value, i) => {
    const td = el("td");
    if (i === 2) { td.className = "lane"; td.appendChild(lane(e)); }
    else if (i === 9) {
      td.className = "body";
      td.appendChild(el("div", value, "clamp"));
      td.title = value.slice(0, 2000);
    } else td.textContent = value;
    if (i === 3 || i === 4) td.style.color = colour(value);
    if (i === 8) td.className = "flag";
    tr.appendChild(td);
  });
  tr.addEventListener("click", () => select(e, tr));
  return tr;
}
function filter() {
  const q = document.getElementById("search").value.trim().toLowerCase();
  const only = document.getElementById("flagged").checked;
  view = events.filter(e => (!only || flagged(e)) && (!q || haystack(e).includes(q)));
  page = 0;
  draw();
}
function draw() {
  const pages = Math.max(1, Math.ceil(view.length / PAGE));
  page = Math.min(Math.max(0, page), pages - 1);
  const rows = document.getElementById("rows");
  rows.textContent = "";
  const whole = view.length === events.length;
  let before = null;
  for (const e of view.slice(page * PAGE, (page + 1) * PAGE)) {
    if (whole && before !== null && e.n > before + 1) {  // events this page does not hold
      const tr = el("tr", undefined, "gap");
      const td = el("td", (e.n - before - 1).toLocaleString("en") +
        " events not in this page");
      td.colSpan = 10;
      tr.appendChild(td);
      rows.appendChild(tr);
    }
    before = e.n;
    rows.appendChild(row(e));
  }
  document.getElementById("page").textContent = "page " + (page + 1) + " of " + pages;
  document.getElementById("count").textContent = view.length.toLocaleString("en") + " of " +
    events.length.toLocaleString("en") + " events";
}
const go = to => () => { page = to(page); draw(); };
document.getElementById("first").addEventListener("click", go(() => 0));
document.getElementById("prev").addEventListener("click", go(p => p - 1));
document.getElementById("next").addEventListener("click", go(p => p + 1));
document.getElementById("last").addEventListener("click", go(() => Infinity));
const search = document.getElementById("search"), only = document.getElementById("flagged");
function remember() {  // the view in the address (#flagged&q=...), to share or reload it
  const state = new URLSearchParams();
  if (only.checked) state.set("flagged", "1");
  if (search.value) state.set("q", search.value);
  history.replaceState(null, "", state.toString() ? "#" + state : location.pathname);
  filter();
}
const start = new URLSearchParams(location.hash.slice(1));
only.checked = start.has("flagged");
search.value = start.get("q") || "";
search.addEventListener("input", remember);
only.addEventListener("change", remember);
filter();
document.body.dataset.drawnMs = Math.round(performance.now());  // from navigation start
</script></body></html>
"""

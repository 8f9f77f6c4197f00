"""The agents' and the conductor's files as timeline events: the stop, crash and cancel lines of
each agent's journal, and the conductor's decisions placed at the envelopes that carried them
out (they record no time of their own). Only reads; a missing or unreadable file adds nothing."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic_core

from teamrt.replay.events import ENVELOPE_KINDS, UNTIMED, Event
from teamrt.teamdir import TeamDir

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
        state = json.loads(TeamDir(team_dir).conductor_state.read_text())
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


def with_decisions(events: Iterator[Event], team_dir: Path) -> Iterator[Event]:
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

"""Cases from a recorded team run: each task a member was given, with the result it sent back.

The inboxes are read back as one timeline (`teamrt.replay`): every request answered with a
`task_result` is a task, whoever asked it (the lead, or a teammate through its `request`
tool). Its case's input is the request's text and its member the one asked; its checks are
derived from the recorded answer (`equals` for a one-line answer, `contains` for each of its
first key lines otherwise), each with a note saying so, for the user to edit into what a right
answer must have. Tasks answered with an error, stopped without an answer (at a limit, say:
what they sent back is partial work), or not answered, make no case.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from teamrt.evals.cases import DERIVED, Case, Contains, Equals
from teamrt.evals.cases import Check as AnyCheck
from teamrt.replay import Event, timeline
from teamrt.team import RESULT

#: A one-line answer up to this long is checked with `equals`; a longer one with `contains`.
EQUALS_LIMIT = 200
#: Lines of a longer answer checked with `contains`, and how much of each.
KEY_LINES = 3
LINE_CHARS = 120
#: The longest case id (a name's length).
ID_CHARS = 64


@dataclass
class FromRun:
    """What `cases_from_run` found: the cases, and the tasks it made none for, with why."""

    cases: list[Case] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "<request id> to <member>: why"


def derive_checks(answer: str) -> list[AnyCheck]:
    """Checks that the recorded `answer` passes, as a starting point for the user's own."""
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if len(lines) == 1 and len(lines[0]) <= EQUALS_LIMIT:
        return [Equals(text=lines[0], note=DERIVED)]
    return [Contains(text=line[:LINE_CHARS], note=DERIVED) for line in lines[:KEY_LINES]]


def _case_id(member: str, number: int, taken: set[str]) -> str:
    """`<member>-<n>`, the member's name shortened to keep the id within a name's 64
    characters (and the next free number taken if the shortened id is another's)."""
    while True:
        suffix = f"-{number}"
        case_id = member[: ID_CHARS - len(suffix)] + suffix
        if case_id not in taken:
            taken.add(case_id)
            return case_id
        number += 1


def _tasks(locator: str | os.PathLike[str]) -> Iterator[tuple[Event, Event | None]]:
    """Each request with the response that answered it (None: unanswered), in send order."""
    requests: dict[str, Event] = {}
    answered: dict[str, Event] = {}
    for event in timeline(locator):
        if event.kind == "request":
            requests[event.id] = event
        elif event.kind == "response" and event.in_reply_to in requests:
            answered.setdefault(event.in_reply_to, event)
    for request_id, request in requests.items():
        yield request, answered.get(request_id)


def cases_from_run(locator: str | os.PathLike[str], *, member: str | None = None) -> FromRun:
    """Cases from the tasks of the team at `locator` (a team directory or a store URL); with
    `member`, only the tasks given to that member. Ids are `<member>-<n>`."""
    found = FromRun()
    numbers: dict[str, int] = {}
    taken: set[str] = set()
    for request, response in _tasks(locator):
        if member is not None and request.recipient != member:
            continue
        if response is None:
            if request.type not in ("shutdown_request", "plan_approval"):
                found.skipped.append(f"{request.id} to {request.recipient}: no answer recorded")
            continue
        if response.type != RESULT:
            if response.type == "error":
                found.skipped.append(f"{request.id} to {request.recipient}: answered an error")
            continue  # a protocol answer (shutdown_ack, plan_decision): not a task
        body: Any = response.body if isinstance(response.body, dict) else {}
        answer = body.get("answer")
        if not isinstance(request.body, str) or not request.body.strip():
            found.skipped.append(f"{request.id} to {request.recipient}: the task is not text")
            continue
        stopped = body.get("stop_reason")
        if stopped not in (None, "answer"):  # its `answer` is the partial work of a stopped run
            found.skipped.append(
                f"{request.id} to {request.recipient}: stopped ({stopped}) without an answer"
            )
            continue
        if not isinstance(answer, str) or not answer.strip():
            found.skipped.append(f"{request.id} to {request.recipient}: no answer recorded")
            continue
        numbers[request.recipient] = numbers.get(request.recipient, 0) + 1
        found.cases.append(
            Case(
                id=_case_id(request.recipient, numbers[request.recipient], taken),
                input=request.body,
                member=request.recipient,
                checks=tuple(derive_checks(answer)),
                recorded={
                    "answer": answer,
                    "stop_reason": body.get("stop_reason"),
                    "steps": body.get("steps"),
                    "tool_calls": body.get("tool_calls"),
                    "tokens": body.get("tokens"),
                    "cost": body.get("cost"),
                    "request": request.id,
                    "asked_by": request.sender,
                },
            )
        )
    return found

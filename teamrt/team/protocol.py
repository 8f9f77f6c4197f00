"""The team protocol: envelope types and bodies that teammates and the lead exchange.

A task is any request that is not one of the protocol's own (a `shutdown_request`, a
`plan_approval`): the teammate works on it and answers with a `task_result`. Errors travel as
error responses whose `error` names what happened: `Expired` (the request's deadline passed before
the teammate could start it), `Busy` (its queue is full), `TeammateCrashed`, `StaleShutdown`.

A task's requester that stops waiting for it (it was refused with `TeammateGone` or
`TeammateCrashed`, or the ask was cancelled) withdraws it with a `task_withdrawn` message naming
the task. It lands in the inbox after the task, so whichever incarnation reads it (in any process)
has read the task first: a queued task is dropped, a running one stops at its next step boundary,
and either is answered with stop reason `cancelled`. The withdrawal is acked together with its
task, never alone, so a restart never keeps one and loses the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeGuard

from teamrt.envelopes import Body, Envelope, Request, register_payload

TASK = "task"
STREAMED_TASK = "streamed_task"  # a task whose requester also wants progress as it happens
RESULT = "task_result"
PROGRESS = "task_progress"  # text, tool calls and results of a streamed task, as they happen
SHUTDOWN = "shutdown_request"
SHUTDOWN_ACK = "shutdown_ack"
IDLE = "idle"
CRASHED = "teammate_crashed"
PLAN_APPROVAL = "plan_approval"
PLAN_DECISION = "plan_decision"
WITHDRAWN = "task_withdrawn"  # the requester stopped waiting: the task must not run (any more)
PROTOCOL_TYPES = (SHUTDOWN,)  # delivered before anything else at a step boundary
#: Requests that are not tasks: the runner answers them itself (or, for plans, the lead).
CONTROL_TYPES = frozenset({SHUTDOWN, PLAN_APPROVAL})
#: Protocol answers that reach a teammate's desk only when their requester stopped waiting
#: (a plan decision after a restart): acked and dropped, never shown to the model.
LATE_PROTOCOL = frozenset({PLAN_DECISION, SHUTDOWN_ACK})

# error types of error responses
EXPIRED = "Expired"
BUSY = "Busy"
TEAMMATE_CRASHED = "TeammateCrashed"
STALE_SHUTDOWN = "StaleShutdown"

#: The stop reason of a task withdrawn by its requester (dropped from the queue, or stopped at
#: a step boundary).
CANCELLED = "cancelled"


class TaskResult(Body):
    """The body of a `result` response: the teammate's answer and how its run ended.

    A typed teammate (`Teammate(..., output_type=...)`) that answered sends the value as JSON
    in `output` (its JSON text is `answer` too) and the type's name in `output_name`;
    `team.ask(..., output_type=...)` validates it back into the type. A typed task whose
    answer failed validation twice ends with `stop_reason` `invalid_output`.
    """

    answer: str | None
    stop_reason: str
    detail: str
    steps: int
    tool_calls: int
    tokens: int
    cost: float | None
    trace_id: str | None = None  # the trace every envelope of the task carried
    output: Any = None  # a typed answer, as JSON data
    output_name: str | None = None  # the name of its type (None: an untyped teammate)


class ProgressBody(Body):
    """The body of a `task_progress` message: one piece of a streamed task as it happens."""

    task: str  # the id of the task request
    event: Literal["text", "tool_call", "tool_result"]
    text: str = ""  # text written by the model, a call's arguments, or a result
    name: str | None = None  # the tool, for tool events
    ok: bool | None = None  # for a tool result


class ShutdownBody(Body):
    incarnation: str | None = None  # None: whichever incarnation is running
    reason: str = ""


class PlanBody(Body):
    plan: str
    task: str  # the id of the task the plan is for


class DecisionBody(Body):
    approved: bool
    feedback: str = ""


class IdleBody(Body):
    incarnation: str
    last: TaskResult | None = None


class WithdrawBody(Body):
    """The body of a `task_withdrawn` message: the task its requester stopped waiting for."""

    task: str  # the id of the task request
    reason: str = ""  # why: "cancelled", or the refusal the requester got


class CrashBody(Body):
    member: str
    incarnation: str
    error: str
    restarting: bool


register_payload(RESULT, TaskResult)
register_payload(PROGRESS, ProgressBody)
register_payload(SHUTDOWN, ShutdownBody)
register_payload(IDLE, IdleBody)
register_payload(CRASHED, CrashBody)
register_payload(WITHDRAWN, WithdrawBody)
register_payload(PLAN_APPROVAL, PlanBody)
register_payload(PLAN_DECISION, DecisionBody)

#: Decides a plan: (member, plan) -> (approved, feedback). Runs in the lead's process.
Approver = Callable[[str, str], Awaitable[tuple[bool, str]]]


def is_shutdown(envelope: Envelope) -> TypeGuard[Request]:
    return envelope.type == SHUTDOWN and isinstance(envelope, Request)


def withdrawn(task: Request, reason: str) -> Envelope:
    """The message that withdraws `task`, from its requester to the member asked."""
    return Envelope.message(
        task.sender, task.recipient, WithdrawBody(task=task.id, reason=reason), type=WITHDRAWN
    )


def cancelled_result(detail: str, trace_id: str | None) -> TaskResult:
    """The answer of a withdrawn task that never started (or was not resumed)."""
    return TaskResult(
        answer=None,
        stop_reason=CANCELLED,
        detail=detail,
        steps=0,
        tool_calls=0,
        tokens=0,
        cost=None,
        trace_id=trace_id,
    )


def is_task(envelope: Envelope) -> TypeGuard[Request]:
    return isinstance(envelope, Request) and envelope.type not in CONTROL_TYPES

"""Teams: named teammates, each running its own agent loop as a task in one task group.

Theory of operation. A `Team` owns the only task group that runs teammates (this module is the
only place one is opened). Each teammate gets a supervisor task, which takes the member's lease
(one live incarnation per name, across processes), announces its incarnation to the lead with an
`idle` envelope, and then waits on the member's inbox at no CPU cost. A request is a task: the
teammate runs its agent loop on it and answers with a `result` response, whatever happens (the
final answer reaches whoever asked, even if the model never sent it). Envelopes that arrive while
the teammate works reach its model at the next step boundary, protocol envelopes first. A
`shutdown_request` for the current incarnation is acknowledged and ends the teammate after its
current step; one addressed to an earlier incarnation is refused. A teammate that crashes answers
the request it was working on with an error, reports the crash to the lead, and is restarted
if its policy says so; without a restart, requests already queued for it fail at once.

Everything between teammates goes through the mailboxes; nothing here shares an agent's context.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeGuard

import anyio
from anyio.abc import TaskGroup, TaskStatus
from pydantic import BaseModel

from teamrt.agents.limits import Limits
from teamrt.agents.loop import Agent
from teamrt.agents.memory import Memory
from teamrt.agents.messaging import messaging_tools
from teamrt.agents.state import AgentState, RunReport
from teamrt.agents.tools import Tool, tool
from teamrt.envelopes import Envelope, Request, new_id, register_payload
from teamrt.errors import LimitExceeded, StopRequested, TeammateGone, UsageError
from teamrt.mail.mailboxes import Mailboxes
from teamrt.models.base import ChatMessage, Model, Usage

# --- the protocol's envelope types --------------------------------------------------------------

TASK = "task"
RESULT = "task_result"
SHUTDOWN = "shutdown_request"
SHUTDOWN_ACK = "shutdown_ack"
IDLE = "idle"
CRASHED = "teammate_crashed"
PLAN_APPROVAL = "plan_approval"
PLAN_DECISION = "plan_decision"
PROTOCOL_TYPES = (SHUTDOWN,)  # delivered before anything else at a step boundary


class TaskResult(BaseModel):
    """The body of a `result` response: the teammate's answer and how its run ended."""

    answer: str | None
    stop_reason: str
    detail: str
    steps: int
    tool_calls: int
    tokens: int
    cost: float | None


class ShutdownBody(BaseModel):
    incarnation: str | None = None  # None: whichever incarnation is running
    reason: str = ""


class PlanBody(BaseModel):
    plan: str
    task: str  # the id of the task the plan is for


class DecisionBody(BaseModel):
    approved: bool
    feedback: str = ""


class IdleBody(BaseModel):
    incarnation: str
    last: TaskResult | None = None


class CrashBody(BaseModel):
    member: str
    incarnation: str
    error: str
    restarting: bool


register_payload(RESULT, TaskResult)
register_payload(SHUTDOWN, ShutdownBody)
register_payload(IDLE, IdleBody)
register_payload(CRASHED, CrashBody)
register_payload(PLAN_APPROVAL, PlanBody)
register_payload(PLAN_DECISION, DecisionBody)

#: Decides a plan: (member, plan) -> (approved, feedback). Runs in the lead's process.
Approver = Callable[[str, str], Awaitable[tuple[bool, str]]]


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartPolicy:
    """What to do when a teammate crashes: nothing (default), or restart with backoff."""

    on_failure: bool = False
    max_restarts: int = 3
    backoff: float = 0.5
    max_backoff: float = 10.0

    def delay(self, restarts: int) -> float:
        return min(self.max_backoff, self.backoff * 2.0**restarts) * (0.5 + random.random() / 2)


@dataclass
class Teammate:
    """A member of the team: its model, instructions, tools, limits and restart policy.

    `model` may be a factory, called once per incarnation (a restarted teammate gets a fresh
    model). The messaging tools are added for every teammate. Tools named in `needs_approval`
    refuse to run until the teammate has sent a plan with `submit_plan` and the lead approved
    it (a real gate: the refusal happens in the tool wrapper, whatever the model says).
    """

    name: str
    model: Model | Callable[[], Model]
    instructions: str = ""
    tools: Sequence[Tool | Callable[..., Any]] = ()
    limits: Limits | None = None
    memory: Memory | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    needs_approval: Sequence[str] = ()  # tools that stay blocked until the lead approves a plan


class TeamBudget:
    """One ledger for the whole team, checked before every model call of every member."""

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        deadline: float | None = None,
    ) -> None:
        self.max_tokens, self.max_cost, self.deadline = max_tokens, max_cost, deadline
        self.usage = Usage()
        self.cost = 0.0
        self._started = anyio.current_time() if deadline is not None else 0.0

    def check(self) -> None:
        if self.max_tokens is not None and self.usage.total_tokens >= self.max_tokens:
            raise LimitExceeded(
                "team_max_tokens",
                self.max_tokens,
                self.usage.total_tokens,
                "the team's token budget is spent:",
            )
        if self.max_cost is not None and self.cost >= self.max_cost:
            raise LimitExceeded(
                "team_max_cost",
                self.max_cost,
                round(self.cost, 6),
                "the team's cost budget (USD) is spent:",
            )
        if self.deadline is not None:
            elapsed = anyio.current_time() - self._started
            if elapsed >= self.deadline:
                raise LimitExceeded(
                    "team_deadline",
                    self.deadline,
                    round(elapsed, 3),
                    "the team's wall-clock deadline (s) has passed:",
                )

    def charge(self, usage: Usage, cost: float | None) -> None:
        self.usage = self.usage + usage
        self.cost += cost or 0.0


MemberState = Literal["starting", "idle", "working", "restarting", "stopped", "crashed"]


@dataclass
class MemberStatus:
    """What the team knows about one member, for status displays."""

    name: str
    state: MemberState = "starting"
    incarnation: str = ""
    step: int = 0
    tasks_done: int = 0
    restarts: int = 0
    last: str = ""


# --- the team -----------------------------------------------------------------------------------


class Team:
    """Teammates on shared mailboxes. An async context manager: start, work, shut down.

        async with FileMailboxes("mailboxes/demo") as mail:
            async with Team(mail, [researcher, writer]) as team:
                result = await team.ask("researcher", "What is inotify?")

    `lead` is the member that asks and receives idle and crash notices (the code using the
    team). `agent_dir` keeps each teammate's checkpoint journal and transcript. `remote` names
    members that run in other processes on the same team directory (`teamrt run-agent`): the
    team asks them like any member and sends them a shutdown request when it shuts down.
    """

    def __init__(
        self,
        mail: Mailboxes,
        teammates: Iterable[Teammate],
        *,
        lead: str = "lead",
        budget: TeamBudget | None = None,
        agent_dir: str | os.PathLike[str] | None = None,
        shutdown_deadline: float = 5.0,
        remote: Iterable[str] = (),
        approver: Approver | None = None,
    ) -> None:
        self.mail = mail
        self.teammates = {t.name: t for t in teammates}
        if lead in self.teammates:
            raise UsageError(f"the lead {lead!r} cannot also be a teammate")
        self.lead = lead
        self.budget = budget
        self.agent_dir = Path(agent_dir) if agent_dir is not None else None
        self.shutdown_deadline = shutdown_deadline
        self.remote = tuple(remote)  # members run by other processes (`teamrt run-agent`)
        self.approver = approver
        self.status: dict[str, MemberStatus] = {n: MemberStatus(n) for n in self.teammates}
        self.notices: list[Envelope] = []  # what reached the lead while an approver reads it
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._running = 0
        self._all_done = anyio.Event()
        self._task_group: TaskGroup | None = None

    async def __aenter__(self) -> Self:
        for name in (self.lead, *self.teammates, *self.remote):
            await self.mail.add_member(name)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            if self.approver is not None:
                task_group.start_soon(self._answer_plans, self.approver)
            for teammate in self.teammates.values():
                await task_group.start(self._supervise, teammate)
        except BaseException:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            self._task_group = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task_group is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                await self.shutdown()
        finally:
            task_group, self._task_group = self._task_group, None
            task_group.cancel_scope.cancel()  # teammates are down; this ends the plan answerer
            # only the team's own tasks run in it: the body's exception propagates as is
            await task_group.__aexit__(None, None, None)

    # -- asking --

    async def ask(self, member: str, text: str, *, timeout: float | None = None) -> TaskResult:
        """Give `member` a task (from the lead) and wait for its result."""
        status = self.status.get(member)
        if status is not None and status.state == "crashed":
            raise TeammateGone(f"{member!r} crashed and is not running: {status.last}")
        request = Envelope.request(self.lead, member, text, type=TASK, timeout=timeout)
        response = await self.mail.request(request, timeout=timeout)
        return TaskResult.model_validate(response.body)

    # -- shutting down --

    async def shutdown(self, deadline: float | None = None) -> None:
        """Ask every running teammate to stop after its current step; cancel any still running
        when the deadline passes. Never waits longer than the deadline."""
        deadline = self.shutdown_deadline if deadline is None else deadline
        for name in self.remote:
            await self.mail.send(
                Envelope.request(
                    self.lead,
                    name,
                    ShutdownBody(reason="team shutdown"),
                    type=SHUTDOWN,
                    timeout=deadline,
                )
            )
        running = [s for s in self.status.values() if s.state not in ("stopped", "crashed")]
        for status in running:
            body = ShutdownBody(incarnation=status.incarnation or None, reason="team shutdown")
            await self.mail.send(
                Envelope.request(self.lead, status.name, body, type=SHUTDOWN, timeout=deadline)
            )
        if self._running:
            with anyio.move_on_after(deadline):
                await self._all_done.wait()
        for name, scope in list(self._scopes.items()):
            if self.status[name].state not in ("stopped", "crashed"):
                self.status[name].last = "cancelled at the shutdown deadline"
                scope.cancel()

    async def _answer_plans(self, approver: Approver) -> None:
        """The lead's side of the approval gate: decide each plan that arrives."""
        inbox = self.mail.inbox(self.lead)
        while True:
            envelope = await inbox.receive()
            inbox.ack_nowait(envelope)
            if envelope.type != PLAN_APPROVAL or not isinstance(envelope, Request):
                self.notices.append(envelope)
                continue
            plan = PlanBody.model_validate(envelope.body)
            approved, feedback = await approver(envelope.sender, plan.plan)
            await self.mail.send(
                Envelope.response(
                    envelope, DecisionBody(approved=approved, feedback=feedback), type=PLAN_DECISION
                )
            )

    async def wait(self) -> None:
        """Return once every teammate of this team has stopped (or crashed for good)."""
        if self._running:
            await self._all_done.wait()

    # -- one teammate's life --

    async def _supervise(self, teammate: Teammate, *, task_status: TaskStatus[None]) -> None:
        self._running += 1
        try:
            await self._life(teammate, task_status)
        finally:
            self._running -= 1
            if self._running == 0:
                self._all_done.set()

    async def _life(self, teammate: Teammate, task_status: TaskStatus[None]) -> None:
        status = self.status[teammate.name]
        started = False
        carried: tuple[deque[Request], list[Envelope]] = (deque(), [])
        with anyio.CancelScope() as scope:
            self._scopes[teammate.name] = scope
            while True:
                incarnation = new_id()
                status.incarnation = incarnation
                lease = self.mail.store.acquire_lease(
                    teammate.name, f"pid {os.getpid()}, incarnation {incarnation}"
                )
                try:
                    if not started:
                        task_status.started()
                        started = True
                    runner = _Runner(self, teammate, incarnation, status, carried)
                    try:
                        await runner.serve()
                        status.state = "stopped"
                        return
                    except Exception as exc:  # a crash: reported below, never swallowed
                        restarting = (
                            teammate.restart.on_failure
                            and status.restarts < teammate.restart.max_restarts
                        )
                        await runner.report_crash(exc, restarting)
                        status.state = "restarting" if restarting else "crashed"
                        if not restarting:
                            return
                        carried = (runner.queued, runner.held)  # the next incarnation serves them
                finally:
                    lease.release()
                await anyio.sleep(teammate.restart.delay(status.restarts))
                status.restarts += 1
        status.state = "stopped" if status.state != "crashed" else "crashed"


class _Runner:
    """One incarnation of one teammate: waits for tasks, runs them, follows the protocol."""

    def __init__(
        self,
        team: Team,
        teammate: Teammate,
        incarnation: str,
        status: MemberStatus,
        carried: tuple[deque[Request], list[Envelope]] = (deque(), []),
    ) -> None:
        self.team, self.teammate, self.incarnation, self.status = (
            team,
            teammate,
            incarnation,
            status,
        )
        self.mail = team.mail
        self.inbox = team.mail.inbox(teammate.name)
        self.current: Request | None = None
        # from a crashed predecessor, if any: requests that arrived during its task, and mail
        # that arrived while it was idle (delivered with the next task)
        self.queued: deque[Request] = carried[0]
        self.held: list[Envelope] = carried[1]
        self.shutdown_request: Request | None = None
        self._tools: list[Tool | Callable[..., Any]] | None = None

    async def serve(self) -> None:
        await self._idle(None)
        while self.shutdown_request is None:
            if self.queued:  # requests that arrived while the last task ran
                await self._work(self.queued.popleft())
                continue
            envelope = await self.inbox.receive()
            if self._is_shutdown(envelope):
                await self._accept_shutdown(envelope)
                continue  # accepted: the loop ends; stale: refused, keep serving
            if isinstance(envelope, Request):
                await self._work(envelope)
            else:  # delivered with the next task
                self.held.append(envelope)
                self.inbox.ack_nowait(envelope)
                self.status.last = f"{envelope.type} {envelope.id} from {envelope.sender}"
        assert self.shutdown_request is not None
        await self.mail.send(
            Envelope.response(
                self.shutdown_request, {"incarnation": self.incarnation}, type=SHUTDOWN_ACK
            )
        )

    def _is_shutdown(self, envelope: Envelope) -> TypeGuard[Request]:
        return envelope.type == SHUTDOWN and isinstance(envelope, Request)

    async def _accept_shutdown(self, request: Request) -> bool:
        """Take a shutdown request if it is for this incarnation; refuse a stale one."""
        body = ShutdownBody.model_validate(request.body)
        self.inbox.ack_nowait(request)
        if body.incarnation not in (None, self.incarnation):
            await self.mail.send(
                Envelope.error(
                    request,
                    "StaleShutdown",
                    f"{self.teammate.name} is incarnation "
                    f"{self.incarnation}, not {body.incarnation}: ignored",
                )
            )
            return False
        self.shutdown_request = request
        return True

    async def _work(self, request: Request) -> None:
        self.current = request
        self.status.state = "working"
        self.status.last = f"task {request.id} from {request.sender}"
        agent = self._agent()
        text = request.body if isinstance(request.body, str) else str(request.body)
        report = await agent.run(text)
        result = _result(report)
        await self.mail.send(Envelope.response(request, result, type=RESULT))
        self.inbox.ack_nowait(request)
        self.current = None
        self.status.tasks_done += 1
        if self.shutdown_request is None and not self.queued:
            await self._idle(result)

    def _agent(self) -> Agent:
        teammate = self.teammate
        model = teammate.model if isinstance(teammate.model, Model) else teammate.model()
        if self._tools is None:  # once per incarnation, at its first task: a tool builds a
            # pydantic model for its arguments, which an idle teammate need not pay for
            self._tools = [*teammate.tools, *messaging_tools(self.mail, teammate.name)]
        tools = self._tools
        if teammate.needs_approval:
            tools = self._gated(tools)
        return Agent(
            teammate.name,
            model,
            instructions=teammate.instructions,
            tools=tools,
            limits=teammate.limits,
            memory=teammate.memory,
            budget=self.team.budget,
            directory=self.team.agent_dir,
            on_step=self._step_boundary,
        )

    def _gated(self, tools: list[Tool | Callable[..., Any]]) -> list[Tool | Callable[..., Any]]:
        """Block the side-effecting tools until the lead approves a plan for this task."""
        gated = set(self.teammate.needs_approval)
        approved = {"plan": False}

        def guard(inner: Tool) -> Tool:
            async def guarded(**kwargs: Any) -> Any:
                if not approved["plan"]:
                    raise PermissionError(
                        f"{inner.name} needs an approved plan: call submit_plan first"
                    )
                return (await inner.fn(**kwargs)) if inner.is_async else inner.fn(**kwargs)

            return dataclasses.replace(inner, fn=guarded, is_async=True)

        async def submit_plan(plan: str) -> str:
            """Send your plan to the lead for approval; side-effecting tools wait for it."""
            assert self.current is not None
            decision = await self.mail.request(
                Envelope.request(
                    self.teammate.name,
                    self.team.lead,
                    PlanBody(plan=plan, task=self.current.id),
                    type=PLAN_APPROVAL,
                    timeout=300,
                )
            )
            body = DecisionBody.model_validate(decision.body)
            approved["plan"] = body.approved
            verdict = "approved" if body.approved else "rejected"
            return f"plan {verdict}" + (f": {body.feedback}" if body.feedback else "")

        out: list[Tool | Callable[..., Any]] = [
            guard(t if isinstance(t, Tool) else tool(t)) if _tool_name(t) in gated else t
            for t in tools
        ]
        out.append(tool(submit_plan))
        return out

    async def _step_boundary(self, state: AgentState) -> list[ChatMessage]:
        """Deliver what arrived during the last step: protocol envelopes first."""
        self.status.step = state.steps
        arrived, self.held = self.held, []
        while True:
            try:
                arrived.append(self.inbox.receive_nowait())
            except anyio.WouldBlock:
                break
        arrived.sort(key=lambda e: e.type not in PROTOCOL_TYPES)
        messages = []
        for envelope in arrived:
            if self._is_shutdown(envelope):
                if await self._accept_shutdown(envelope):
                    raise StopRequested(f"shutdown requested by {envelope.sender}")
                continue
            if isinstance(envelope, Request):
                self.queued.append(envelope)  # another task: after this one (acked when done)
                continue
            messages.append(
                ChatMessage.user(
                    f"[{envelope.kind} {envelope.id} from {envelope.sender}, type {envelope.type}] "
                    + (envelope.body if isinstance(envelope.body, str) else repr(envelope.body))
                )
            )
            self.inbox.ack_nowait(envelope)
        return messages

    async def _idle(self, last: TaskResult | None) -> None:
        self.status.state = "idle"
        await self.mail.send(
            Envelope.message(
                self.teammate.name,
                self.team.lead,
                IdleBody(incarnation=self.incarnation, last=last),
            )
        )

    async def report_crash(self, exc: Exception, restarting: bool) -> None:
        error = f"{type(exc).__name__}: {exc}"
        name = self.teammate.name
        self.status.last = f"crashed: {error}"
        with anyio.CancelScope(shield=True):
            if self.current is not None:  # whoever asked learns at once, not at a timeout
                await self.mail.send(
                    Envelope.error(self.current, "TeammateCrashed", f"{name} crashed: {error}")
                )
                self.inbox.ack_nowait(self.current)
            await self.mail.send(
                Envelope.message(
                    name,
                    self.team.lead,
                    CrashBody(
                        member=name,
                        incarnation=self.incarnation,
                        error=error,
                        restarting=restarting,
                    ),
                )
            )
            if not restarting:  # nobody will serve what is queued: fail it now
                while True:
                    try:
                        queued: Envelope = self.queued.popleft()
                    except IndexError:
                        try:
                            queued = self.inbox.receive_nowait()
                        except anyio.WouldBlock:
                            break
                    if isinstance(queued, Request):
                        await self.mail.send(
                            Envelope.error(
                                queued, "TeammateCrashed", f"{name} crashed and will not restart"
                            )
                        )
                    self.inbox.ack_nowait(queued)


def _tool_name(item: Tool | Callable[..., Any]) -> str:
    return item.name if isinstance(item, Tool) else getattr(item, "__name__", "")


def _result(report: RunReport) -> TaskResult:
    return TaskResult(
        answer=report.answer if report.answer is not None else report.partial,
        stop_reason=report.stop.reason,
        detail=report.stop.detail,
        steps=report.steps,
        tool_calls=report.tool_calls,
        tokens=report.usage.total_tokens,
        cost=report.cost,
    )

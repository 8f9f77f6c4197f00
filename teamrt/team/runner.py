"""One incarnation of one teammate: its desk, its persistent agent, and the task protocol.

Theory of operation. The runner announces its incarnation to the lead (`idle`), then serves: a
task from the desk's queue is run by the teammate's agent (one per incarnation, whose
conversation carries across tasks) and answered with a `task_result`; mail of a kind that wakes
the teammate starts a round in which the model reads it; otherwise the runner waits on the desk at
no CPU cost. At every step boundary the agent takes in what arrived meanwhile through the runner
(`Inbound`): a shutdown ends the run there, new tasks are queued, and mail reaches the model in
bounded batches. A task interrupted by a shutdown, a crash or a kill is not answered: the next
incarnation finds it in its journal and resumes it from its last completed step. A task its
requester withdrew (`task_withdrawn`) is never started or resumed after the desk read the
withdrawal; one running stops at its next step boundary, answered with stop reason `cancelled`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable

import anyio

from teamrt import telemetry
from teamrt.agents.journal import Journal
from teamrt.agents.loop import Agent
from teamrt.agents.state import AgentState, RunReport
from teamrt.agents.tools import Tool
from teamrt.envelopes import Envelope, Request, current_trace, new_id, tracing
from teamrt.errors import (
    BlobTooLarge,
    StoreError,
)
from teamrt.models.base import ChatMessage, Model, Usage
from teamrt.team.config import MemberStatus, Teammate
from teamrt.team.context import TeamContext
from teamrt.team.desk import Desk
from teamrt.team.equip import build_agent, mcp_tools, team_tool_names, team_tools
from teamrt.team.plans import PlanGate, plan_approved
from teamrt.team.progress import Progress
from teamrt.team.protocol import (
    RESULT,
    SHUTDOWN_ACK,
    STREAMED_TASK,
    TEAMMATE_CRASHED,
    CrashBody,
    IdleBody,
    TaskResult,
)
from teamrt.team.task_protocol import (
    ROUND,
    gives_up,
    interrupted,
    is_round,
    next_move,
    queued_withdrawal,
    stop_between_steps,
)

log = logging.getLogger("teamrt.team")

__all__ = ["ROUND", "Runner", "TeamContext"]  # TeamContext and ROUND: their old import path


class Runner:
    """One incarnation of one teammate. See the module docstring."""

    def __init__(
        self,
        context: TeamContext,
        teammate: Teammate,
        incarnation: str,
        status: MemberStatus,
        carried: AgentState | None,
        attempts: dict[str, int],
    ) -> None:
        self.context, self.teammate, self.incarnation, self.status = (
            context,
            teammate,
            incarnation,
            status,
        )
        self.name = teammate.name
        self.mail = context.mail
        self.attempts = attempts  # crashes per task id, across incarnations
        agents = context.agents
        self.journal_path = agents.journal(self.name) if agents is not None else None
        self.transcript_path = agents.transcript(self.name) if agents is not None else None
        self.state = self._restore(carried)
        self._seen = set(self.state.handled) if self.state is not None else set()
        self.desk = Desk(
            self.mail,
            self.name,
            incarnation,
            max_queue=teammate.max_queue,
            wake_on=teammate.wake_on,
            seen=self._seen.__contains__,
            on_queue=lambda n: setattr(status, "queued", n),
            on_shutdown=lambda request: context.enforce_deadline(self.name, request),
            on_withdrawn=self._withdrawn_queued,
            on_withdrawn_running=self._withdrawn_running,
            started=context.started,
        )
        self.agent: Agent | None = None
        self.scope: anyio.CancelScope | None = None  # set by the team: cancels this incarnation
        self.cancelled: str | None = None  # why the team cancelled it, if it did
        self.current: Request | None = None
        self._round_id: str | None = None  # the round of mail in progress, if any
        self._recorded: set[tuple[str, str]] = set()  # incidents already in the journal
        self.progress = Progress(self.mail, self.name, status)
        self.plans = PlanGate(
            self.mail,
            self.name,
            context.lead,
            teammate.needs_approval,
            lambda: self.current.id if self.current is not None else "",
        )
        self._last: TaskResult | None = None
        self.mcp_tools: list[Tool] = []  # from the teammate's MCP servers, while connected

    def _restore(self, carried: AgentState | None) -> AgentState | None:
        if self.journal_path is not None:
            return Journal(self.journal_path).load()
        return carried  # no journal: the state the last incarnation in this process left

    # -- serving --

    async def serve(self, ready: Callable[[], None] = lambda: None) -> None:
        """Serve until a shutdown for this incarnation; `ready` is called once announced."""
        await self.desk.drain()
        left = interrupted(self.state)
        if left is not None and not is_round(left):
            self._to_front(left)
        await self._announce()
        self.desk.bounded = True
        ready()
        resume_round = is_round(left)
        while self.desk.shutdown is None:
            await self._move(resume_round)
            resume_round = False  # what was interrupted comes first, before any queued task
        await self.mail.send(
            Envelope.response(
                self.desk.shutdown, {"incarnation": self.incarnation}, type=SHUTDOWN_ACK
            )
        )

    async def _move(self, resume_round: bool) -> None:
        """Make the next move of the task protocol (`next_move`)."""
        desk = self.desk
        move = next_move(
            resume_round=resume_round,
            queued=bool(desk.tasks),
            mail_wakes=desk.wakes() or desk.full,
            idle=self.status.state == "idle",
        )
        if move == "resume_round":
            await self._round(resume=True)
        elif move == "work":
            task = desk.tasks.popleft()
            self.status.queued = len(desk.tasks)
            await self._work(task)
        elif move == "round":
            await self._round(resume=False)
        elif move == "announce":
            await self._announce()  # then look again: mail may have come meanwhile
        else:
            await desk.wait()

    def _withdrawn_queued(self, task: Request, who: str) -> str:
        """The desk dropped a withdrawn task from the queue: one an earlier incarnation had
        started is not resumed. Returns the detail its `cancelled` answer gives."""
        detail, started = queued_withdrawal(task.id, who, self.final_state())
        if started:
            self._forget(task.id)
        self.record("withdrawn", f"task {task.id}: {detail}")
        return detail

    def _withdrawn_running(self, task: Request, withdrawal: Envelope) -> None:
        """The task running now was withdrawn: its model call or tools in flight stop now."""
        current, agent = self.current, self.agent
        if current is not None and current.id == task.id and agent is not None:
            steps = agent.state.steps if agent.state is not None else 0
            agent.interrupt(
                f"withdrawn by {withdrawal.sender} after {steps} model calls: the model call "
                "or tools in flight were cut short"
            )

    def _to_front(self, task_id: str) -> None:
        tasks = self.desk.tasks
        for request in tasks:
            if request.id == task_id:
                tasks.remove(request)
                tasks.appendleft(request)
                return

    async def _work(self, request: Request) -> None:
        # a task starts or continues a trace: every envelope sent while handling it carries it
        attributes = {
            "teamrt.member": self.name,
            "teamrt.task.id": request.id,
            "teamrt.trace_id": request.trace_id or request.id,
            "teamrt.requester": request.sender,
        }
        with (
            tracing(request.trace_id or request.id),
            telemetry.span(f"task {self.name}", attributes, parent=request.traceparent),
        ):
            await self._work_traced(request)

    async def _work_traced(self, request: Request) -> None:
        if await self.desk.refuse_if_expired(request):
            return
        # a fresh check with the store (a paused process's flags are stale): LeaseLost if lost
        await self.mail.store.fence(self.name).check()
        withdrawal = self.desk.withdrawal(request.id)
        if withdrawal is not None:  # withdrawn after it left the queue, before it started
            detail = f"withdrawn by {withdrawal.sender} before it started: never ran"
            await self.desk.answer_withdrawn(request, withdrawal, detail)
            self.record("withdrawn", f"task {request.id}: {detail}")
            return
        self.current = request
        self.status.state = "working"
        self.status.last = f"task {request.id} from {request.sender}"
        agent = self._agent()
        agent.output_type = self.teammate.typed  # a task is typed when the teammate is
        text = request.body if isinstance(request.body, str) else json.dumps(request.body)
        streaming = self.progress.streaming = request if request.type == STREAMED_TASK else None
        agent.on_event = self.progress.on_event if self.teammate.stream or streaming else None
        state = agent.state
        if state is not None and state.task_id == request.id and state.stop is not None:
            report = agent.report()  # finished before a crash, unanswered: answer it now
            assert report is not None
        else:
            resuming = state is not None and state.task_id == request.id
            # a new task needs its own plan; a resumed one keeps what its conversation says
            self.plans.approved = resuming and state is not None and plan_approved(state)
            report = await agent.run(text, task_id=request.id, resume=True)
        await self.progress.flush()
        if report.stop.reason == "shutdown":
            return  # interrupted: it stays unacked, and the next incarnation resumes it
        result = _result(report).model_copy(update={"trace_id": current_trace()})
        try:
            await self.mail.send(Envelope.response(request, result, type=RESULT))
        except BlobTooLarge as exc:  # the asker learns why, as data; this teammate goes on
            await self.mail.send(Envelope.error(request, exc, f"{self.name}'s answer: {exc}"))
            result = result.model_copy(update={"answer": None, "output": None, "detail": str(exc)})
        self.desk.done(request)
        self.current = None
        self.status.tasks_done += 1
        self._spent(result)
        self._last = result

    async def _round(self, *, resume: bool) -> None:
        """A round of mail: the model reads what arrived and acts on it; no one awaits an
        answer (it goes to the lead with the next idle notice). It continues the trace of the
        first mail it will read that has one."""
        first = list(itertools.islice(self.desk.letters, self.teammate.mail_batch))
        with tracing(next((e.trace_id for e in first if e.trace_id), None)):
            await self._round_traced(resume=resume)

    async def _round_traced(self, *, resume: bool) -> None:
        self.status.state = "working"
        self.status.last = "reading mail"
        agent = self._agent()
        agent.output_type = None  # a round of mail has no one to answer, and no type
        state = agent.state
        self.progress.streaming = None
        agent.on_event = self.progress.on_event if self.teammate.stream else None
        self.plans.approved = False  # mail is not a task: no plan carries into it
        if resume and state is not None and state.task_id is not None:
            self._round_id = state.task_id
            report = await agent.run("", task_id=state.task_id, resume=True)
        else:
            self._round_id = ROUND + new_id()
            report = await agent.run("", task_id=self._round_id)
        if report.stop.reason != "shutdown":
            self._round_id = None
            self._last = _result(report)
            self._spent(self._last)
            self.status.rounds += 1

    def _spent(self, result: TaskResult) -> None:
        self.status.step = result.steps  # the status ends where the report does
        self.status.tokens += result.tokens
        self.status.cost += result.cost or 0.0

    async def _announce(self) -> None:
        self.status.state = "idle"
        last, self._last = self._last, None
        await self.mail.send(
            Envelope.message(
                self.name, self.context.lead, IdleBody(incarnation=self.incarnation, last=last)
            )
        )

    # -- the agent's inputs between steps (teamrt.agents.loop.Inbound) --

    async def before_step(self, state: AgentState) -> list[ChatMessage]:
        self.status.step = state.steps
        await self.desk.drain()
        current = self.current
        withdrawal = self.desk.withdrawal(current.id) if current is not None else None
        stop = stop_between_steps(self.desk.shutdown, withdrawal, state.steps)
        if stop is not None:
            raise stop
        more_unread = self.desk.full
        batch = self.desk.show(self.teammate.mail_batch)
        if not batch:
            return []
        return [ChatMessage.user(_render(batch, len(self.desk.letters), more_unread))]

    def handled(self) -> list[str]:
        return self.desk.handled()

    def recorded(self) -> None:
        self.desk.recorded()

    # -- the teammate's MCP servers, for the length of the incarnation --

    @contextlib.asynccontextmanager
    async def mcp_servers(self) -> AsyncIterator[None]:
        """Connect the teammate's MCP servers and take their tools for the incarnation (see
        `teamrt.team.equip.mcp_tools`)."""
        async with contextlib.AsyncExitStack() as stack:
            messaging = team_tools(self.context, self.name, self.desk)  # to know their names
            self.mcp_tools = await mcp_tools(
                stack, self.teammate, team_tool_names(self.teammate, messaging)
            )
            del messaging  # not kept for the incarnation's length: the agent makes its own
            try:
                yield
            finally:
                self.mcp_tools = []

    # -- building the agent, once per incarnation --

    def _agent(self) -> Agent:
        if self.agent is not None:
            return self.agent
        self.agent = build_agent(
            self.context,
            self.teammate,
            tools=[*self.teammate.tools, *self.mcp_tools],
            messaging=team_tools(self.context, self.name, self.desk),
            plans=self.plans,
            journal=self.journal_path,
            transcript=self.transcript_path,
            inbound=self,
            on_spend=self._absorb,
        )
        self.agent.restore(self.state)
        self.agent.fence = self.mail.store.fence(self.name)  # checked before each tool call
        return self.agent

    def _absorb(self, usage: Usage, cost: float | None) -> None:
        """A sub-agent's spend counts against this teammate's own limits too."""
        if self.agent is not None:
            self.agent.absorb(usage, cost)

    # -- the end of an incarnation --

    def record(self, kind: str, detail: str) -> None:
        """Put a crash or a cancellation in the agent's journal (when it has one), once."""
        if (kind, detail) in self._recorded:
            return
        self._recorded.add((kind, detail))
        if self.journal_path is not None:
            with contextlib.suppress(StoreError):  # the report must go out even on a full disk
                Journal(self.journal_path).incident(kind, detail)

    async def report_crash(self, exc: Exception, restarting: bool) -> None:
        current = self.current
        with tracing(current.trace_id or current.id if current is not None else None):
            await self._report_crash(exc, restarting)

    async def _report_crash(self, exc: Exception, restarting: bool) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.status.last = f"crashed: {error}"
        log.error(
            "%s (incarnation %s) %s: %s; %s",
            self.name,
            self.incarnation,
            "cancelled" if self.cancelled is not None else "crashed",
            error,
            "restarting" if restarting else "not restarting",
        )
        log.debug("%s crashed here:", self.name, exc_info=exc)  # the traceback, for debugging
        self.record("cancel" if self.cancelled is not None else "crash", error)
        with anyio.CancelScope(shield=True):
            current, round_id = self.current, self._round_id
            given_up = self.cancelled is not None  # a hung task is not resumed
            if current is None and round_id is not None:  # a round of mail crashed
                tries = self.attempts[round_id] = self.attempts.get(round_id, 0) + 1
                if gives_up(
                    cancelled=given_up,
                    restarting=restarting,
                    tries=tries,
                    task_attempts=self.teammate.restart.task_attempts,
                ):
                    self.desk.recorded()  # the mail it was shown is given up on: acked
                    self._forget(round_id)
                    log.warning("%s gave up on a round of mail after %d tries", self.name, tries)
                    error += f" (round of mail given up after {tries} tries)"
            if current is not None:
                tries = self.attempts[current.id] = self.attempts.get(current.id, 0) + 1
                if gives_up(
                    cancelled=given_up,
                    restarting=restarting,
                    tries=tries,
                    task_attempts=self.teammate.restart.task_attempts,
                ):
                    why = "" if not restarting or given_up else f" (task tried {tries} times)"
                    await self.mail.send(
                        Envelope.error(
                            current, TEAMMATE_CRASHED, f"{self.name} crashed: {error}{why}"
                        )
                    )
                    self.desk.done(current)
                    self.current = None
                    self._forget(current.id)
                # else: it stays held, and the next incarnation resumes it
            await self.mail.send(
                Envelope.message(
                    self.name,
                    self.context.lead,
                    CrashBody(
                        member=self.name,
                        incarnation=self.incarnation,
                        error=error,
                        restarting=restarting,
                    ),
                )
            )
            if not restarting:  # nobody will serve what is queued: fail it now
                await self.desk.drain()
                while self.desk.tasks:
                    queued = self.desk.tasks.popleft()
                    await self.mail.send(
                        Envelope.error(
                            queued, TEAMMATE_CRASHED, f"{self.name} crashed and will not restart"
                        )
                    )
                    self.desk.done(queued)

    def _forget(self, task_id: str) -> None:
        """A task given up on: a later incarnation must not resume it."""
        agent_state = self.agent.state if self.agent is not None else self.state
        if agent_state is not None and agent_state.task_id == task_id and agent_state.stop is None:
            agent_state.remember_handled([task_id])
            agent_state.task_id = None

    def final_state(self) -> AgentState | None:
        return self.agent.state if self.agent is not None else self.state

    async def close(self) -> None:
        """Hand back what is held, and close the model's client if it has one."""
        self.desk.release()
        own = self.agent is not None and not isinstance(self.teammate.model, Model)
        model = self.agent.model if own and self.agent is not None else None  # a factory's
        close = getattr(model, "aclose", None)  # a shared model instance is its owner's to close
        if close is not None:
            # a client that cannot close is its own teammate's problem: logged, bounded in time
            with anyio.move_on_after(min(2.0, self.context.shutdown_deadline()), shield=True):
                try:
                    await close()
                except Exception as exc:
                    log.warning("%s: its model's client did not close: %s", self.name, exc)


def _render(batch: list[Envelope], waiting: int, more_unread: bool) -> str:
    lines = []
    for envelope in batch:
        head = f"[{envelope.kind} {envelope.id} from {envelope.sender}"
        if envelope.type not in ("text", "result"):
            head += f", type {envelope.type}"
        if envelope.in_reply_to:
            head += f", in reply to {envelope.in_reply_to}"
        body = envelope.body if isinstance(envelope.body, str) else json.dumps(envelope.body)
        lines.append(f"{head}] {body}")
    if waiting or more_unread:
        count = f"{waiting}{' or more' if more_unread else ''}"
        lines.append(
            f"({count} more messages are waiting in your inbox: they reach you at your next "
            "steps, or call wait_for_messages)"
        )
    return "\n".join(lines)


def _result(report: RunReport) -> TaskResult:
    typed = report.output_name is not None and report.ok and report.answer is not None
    return TaskResult(
        answer=report.answer if report.answer is not None else report.partial,
        stop_reason=report.stop.reason,
        detail=report.stop.detail,
        steps=report.steps,
        tool_calls=report.tool_calls,
        tokens=report.usage.total_tokens,
        cost=report.cost,
        output=json.loads(report.answer) if typed and report.answer is not None else None,
        output_name=report.output_name,
    )

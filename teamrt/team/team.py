"""Teams: named teammates, each running its own agent loop as a task in one task group.

Theory of operation. A `Team` owns the only task group that runs teammates (this module is the
only place one is opened). Each teammate gets a supervisor task, which takes the member's lease
(one live incarnation per name, across processes) and runs one incarnation at a time (a
`Runner`): it serves tasks, wakes for mail, and follows the shutdown protocol. A teammate that
crashes reports it to the lead and is restarted if its policy says so; the next incarnation
takes up the conversation and resumes the interrupted task from its journal. The lead's inbox is
served from the start, like a member's (`teamrt.team.lead`): notices, plans for the approver,
requests for the program's handlers, and mail for the program (`lead_mail()`). A role can be a
pool of replicas; `ask` picks the least busy.

`Team` is a facade over the parts that own each concern: the roster (`teamrt.team.roster`),
the lead's asks and pools (`teamrt.team.asking`), supervision, restarts and stopping
(`teamrt.team.supervision`), the wait-for graph (`teamrt.team.waits`) and the lead's inbox
(`teamrt.team.lead`).

Everything between teammates goes through the mailboxes; nothing here shares an agent's context.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, overload

import anyio
from anyio.abc import TaskGroup

from teamrt.agents.output import OutputType, Rejected
from teamrt.envelopes import Envelope, Request
from teamrt.errors import InvalidOutput, OutputError, UsageError
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.store import Lease
from teamrt.team.asking import WITHDRAW_WITHIN, Asks
from teamrt.team.config import MemberStatus, TeamBudget, Teammate
from teamrt.team.context import TeamContext
from teamrt.team.lead import Handler, LeadServer
from teamrt.team.protocol import Approver, ProgressBody, TaskResult
from teamrt.team.roster import check_remote, expand
from teamrt.team.runner import Runner
from teamrt.team.supervision import Supervisor
from teamrt.team.waits import WaitsFor
from teamrt.teamdir import AgentDir

log = logging.getLogger("teamrt.team")

__all__ = ["WITHDRAW_WITHIN", "Team", "TeammateCancelled", "typed_answer"]

T = TypeVar("T")


class Team:
    """Teammates on shared mailboxes. An async context manager: start, work, shut down.

        async with FileMailboxes("mailboxes/demo") as mail:
            async with Team(mail, [researcher, writer]) as team:
                result = await team.ask("researcher", "What is inotify?")

    `lead` is the member that asks (the code using the team): its inbox is served from the
    start; idle and crash notices are kept in `notices` (the most recent `NOTICES_KEPT`), its
    mail comes from `lead_mail()`, and teammates' requests to it go to `on_request` (or a
    handler registered for their type with `handle`; with none they are refused `NoHandler`).
    `agent_dir` keeps each teammate's checkpoint journal and transcript. `remote` names
    members that run in other processes on the same team directory (`teamrt run-agent`): the
    team asks them like any member and sends them a shutdown request when it shuts down.
    `prices` (model name to USD per million input and output tokens) apply to every member; a
    teammate's own win.
    `store_outage`: how long (s) a network store that cannot be reached is waited out, by the
    lead and every teammate here, keeping each incarnation (it sets the mailboxes'; default
    theirs, 30 s). A longer outage stops the teammates it hit, each with a `StoreOutage` in
    `status[name].outage` (never reported as a crash): a new `Team` resumes their tasks from
    their journals (`teamrt run-agent` reconnects by itself).
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
        prices: dict[str, tuple[float, float]] | None = None,
        lead_here: bool = True,
        on_request: Handler | None = None,
        store_outage: float | None = None,
    ) -> None:
        self.mail = mail
        if store_outage is not None:
            if not store_outage >= 0:
                raise UsageError(f"store_outage must be a number of seconds, not {store_outage!r}")
            mail.store_outage = store_outage
        self.teammates: dict[str, Teammate]
        self.pools: dict[str, tuple[str, ...]]  # role -> its replicas' member names
        self.teammates, self.pools = expand(teammates, lead)
        self.lead = lead
        self.budget = budget
        self.agent_dir = Path(agent_dir) if agent_dir is not None else None
        self.shutdown_deadline = shutdown_deadline
        self.remote = tuple(remote)  # members run by other processes (`teamrt run-agent`)
        self.lead_here = lead_here  # False in `teamrt run-agent`: the lead runs elsewhere
        self.approver = approver
        self.prices = dict(prices or {})  # USD per million tokens, for every member's models
        self.status: dict[str, MemberStatus] = {n: MemberStatus(n) for n in self.teammates}
        self._lead = LeadServer(self, on_request)
        self._supervisor = Supervisor(
            mail,
            lead,
            status=self.status,
            remote=self.remote,
            agent_dir=self.agent_dir,
            context=self._runner_context,
            run=run_incarnation,
        )
        self._asks = Asks(
            mail,
            lead,
            teammates=self.teammates,
            pools=self.pools,
            status=self.status,
            server=self._lead,
            started=self._supervisor.started,
        )
        self._waits = WaitsFor()
        self._task_group: TaskGroup | None = None
        self._serving_lead = False
        self._lead_lease: Lease | None = None
        self.started = time.time()  # reset when the team starts

    async def __aenter__(self) -> Self:
        self.started = time.time()
        check_remote(self.remote, await self.mail.members_now())
        for name in (self.lead, *self.teammates):
            await self.mail.add_member(name)
        if self.lead_here:  # the lead's inbox has one consumer too: a second lead is MemberBusy
            self._lead_lease = await self.mail.store.acquire_lease(
                self.lead, f"pid {os.getpid()}, lead of this team"
            )
        try:
            await self._start()
        except BaseException:
            if self._lead_lease is not None:
                await self._lead_lease.release()
                self._lead_lease = None
            raise
        return self

    async def _start(self) -> None:
        budget, store = self.budget, self.mail.store
        if budget is not None and not budget.published_in(store):
            # every process of the team draws on it, from what it has spent already
            await budget.publish(store, store_outage=self.mail.store_outage)
        elif budget is not None:
            budget.store_outage = self.mail.store_outage
        elif self.lead_here:
            await self.mail.riding_out(
                lambda: store.ledger_update(lambda old: {} if old else None),  # none
                "clear the budget ledger",
            )
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = self._supervisor.task_group = task_group
        try:
            self._serve_lead()
            for teammate in self.teammates.values():
                await task_group.start(self._supervisor.supervise, teammate)
        except BaseException:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            self._task_group = self._supervisor.task_group = None
            raise

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
            self._supervisor.task_group = None
            task_group.cancel_scope.cancel()  # teammates are down; this ends the lead's server
            # only the team's own tasks run in it: the body's exception propagates as is
            try:
                await task_group.__aexit__(None, None, None)
            finally:
                self._lead.close()
                if self._lead_lease is not None:
                    await self._lead_lease.release()
                    self._lead_lease = None

    # -- asking --

    @overload
    async def ask(
        self,
        member: str,
        text: str,
        *,
        timeout: float | None = None,
        trace_id: str | None = None,
        key: str | None = None,
    ) -> TaskResult: ...

    @overload
    async def ask(
        self,
        member: str,
        text: str,
        *,
        output_type: type[T],
        timeout: float | None = None,
        trace_id: str | None = None,
        key: str | None = None,
    ) -> T: ...

    @overload
    async def ask(
        self,
        member: str,
        text: str,
        *,
        output_type: Any,
        timeout: float | None = None,
        trace_id: str | None = None,
        key: str | None = None,
    ) -> Any: ...

    async def ask(
        self,
        member: str,
        text: str,
        *,
        output_type: Any = None,
        timeout: float | None = None,
        trace_id: str | None = None,
        key: str | None = None,
    ) -> Any:
        """Give `member` a task (from the lead) and wait for its result: the `TaskResult`, or
        with `output_type`, the typed answer.

        `member` may name a pool (`Teammate(..., replicas=N)`): the task goes to its least busy
        replica. Raises `RemoteError` with `error_type` `Busy` (the member's queue is full) or
        `Expired` (the deadline passed before it could start), `RequestTimeout`, or
        `TeammateGone` for a member that is not running. A task refused with `TeammateGone`
        or a `TeammateCrashed` error, or whose ask is cancelled, is withdrawn (see `withdraw`):
        no later incarnation starts it. The task starts a trace (or
        continues `trace_id`): every envelope of it, in any process, carries the id, which the
        result gives back (`teamrt replay DIR --trace ID` shows the whole tree).

        `output_type` (usually the teammate's declared `Teammate(output_type=...)`; the member
        may run in another process) returns the answer validated into that type. A task that
        ends without one raises `InvalidOutput` (the answer failed validation twice, or does
        not match `output_type`) or `OutputError` (it stopped for another reason, or the
        teammate answered with text); both carry the `TaskResult`. A member of this team that
        declares no `output_type` is refused with `UsageError` before anything is sent.

        `key` makes the ask idempotent: a second ask with the same key, from any process of
        the team (a restarted lead included), never runs the task again and returns the first
        outcome (see `teamrt.team.lead.ask_once`); the same key with another member or text
        is refused with `UsageError`.
        """
        typed = self._asks.output_type(member, output_type) if output_type is not None else None
        request, result = await self._asks.ask(member, text, timeout, trace_id, key)
        return result if typed is None else typed_answer(request.recipient, result, typed)

    async def withdraw(
        self, task_id: str, *, member: str | None = None, reason: str = "withdrawn"
    ) -> None:
        """Withdraw a task the lead gave: if it is still queued it never runs; if it is
        running it stops at its next step boundary (its model call and tools cut short); either
        way it is answered with stop reason `cancelled` (a running `ask` returns that result,
        a late answer reaches the lead's notices). Honoured by every later incarnation of the
        member, in any process. `member` is needed for a task not being asked from this team
        now (one whose `ask` raised `RequestTimeout`, say: `exc.request.recipient`)."""
        await self._asks.withdraw(task_id, member, reason)

    @contextlib.asynccontextmanager
    async def stream(
        self, member: str, text: str, *, timeout: float | None = None
    ) -> AsyncIterator[AsyncIterator[ProgressBody | TaskResult]]:
        """Give `member` a task and see it happen: `ProgressBody` events (text as the model
        writes it, tool calls and their results), then the `TaskResult`. The teammate may run
        in another process: progress travels as `task_progress` messages to the lead.

            async with team.stream("researcher", "What is inotify?") as events:
                async for event in events:
                    ...

        Errors are those of `ask`, raised from the iterator. Leaving the block early withdraws
        the task (as cancelling an `ask` does): it stops at its next step boundary.
        """
        async with self._asks.stream(member, text, timeout) as events:
            yield events

    def pick(self, role: str) -> str:
        """The member to ask: `role` itself, or the least busy live replica of its pool
        (fewest tasks in flight from the lead, then idle before working)."""
        return self._asks.pick(role)

    @contextlib.contextmanager
    def waiting(self, member: str, on: str) -> Iterator[None]:
        """`member` waits on a request to `on`: refuse it with `Deadlock` if `on` (or whoever
        `on` waits on, and so on) is waiting on `member` (the wait-for graph of this team's
        members, in this process)."""
        with self._waits.waiting(member, on):
            yield

    # -- the lead's inbox (served by teamrt.team.lead) --

    @property
    def notices(self) -> deque[Envelope]:
        """The latest idle and crash notices the lead got (`NOTICES_KEPT`; they are acked)."""
        return self._lead.notices

    def lead_mail(self) -> AsyncGenerator[Envelope]:
        """The lead's mail as it comes: messages, broadcasts, and answers no `ask` here waits
        for (late ones, and a predecessor's outcomes after a restart). Each envelope is acked
        once the program asks for the next one; what it never takes stays in the inbox for
        the next lead (see `teamrt.team.lead`).

            async for envelope in team.lead_mail():
                ...
        """
        return self._lead.mail()

    def lead_mail_nowait(self) -> list[Envelope]:
        """The lead's mail read so far and not yet taken, taken (and acked) now."""
        return self._lead.mail_nowait()

    def handle(self, type: str, handler: Handler) -> None:
        """Answer teammates' requests of `type` to the lead with `handler(request)`: its
        return value is the answer; an exception it raises goes back as an error response."""
        self._lead.handlers[type] = handler

    def _serve_lead(self) -> None:
        """Start serving the lead's inbox (once, at start). A team whose lead runs elsewhere
        never consumes its inbox."""
        if self._serving_lead or self._task_group is None or not self.lead_here:
            return
        self._serving_lead = True
        self._task_group.start_soon(self._lead.serve)

    # -- shutting down --

    async def shutdown(self, deadline: float | None = None) -> None:
        """Ask every running teammate to stop after its current step; cancel any still running
        when the deadline passes. Never waits longer than the deadline."""
        deadline = self.shutdown_deadline if deadline is None else deadline
        await self._supervisor.shutdown(deadline)

    def enforce_deadline(self, member: str, shutdown: Request) -> None:
        """A teammate accepted `shutdown`: if it has not stopped by the request's deadline,
        cancel it there (whoever sent the request, in this process or another)."""
        self._supervisor.enforce_deadline(member, shutdown)

    async def wait(self) -> None:
        """Return once every teammate of this team has stopped (or crashed for good)."""
        await self._supervisor.wait()

    def _runner_context(self) -> TeamContext:
        """What an incarnation starting now takes from the team."""
        return TeamContext(
            mail=self.mail,
            lead=self.lead,
            agents=AgentDir(self.agent_dir) if self.agent_dir is not None else None,
            prices=self.prices,
            budget=self.budget,
            started=self.started,
            shutdown_deadline=lambda: self.shutdown_deadline,
            pick=self.pick,
            waiting=self.waiting,
            enforce_deadline=self.enforce_deadline,
        )

    async def cancel(self, member: str, reason: str) -> None:
        """Stop `member`'s current incarnation now, whatever it is doing (a hung teammate).

        Handled like a crash: the lead gets a `teammate_crashed` notice, the task it was on is
        answered with a `TeammateCrashed` error naming `reason` (and not resumed), and its
        restart policy decides whether a new incarnation starts.
        """
        self._supervisor.cancel(member, reason)


def typed_answer(member: str, result: TaskResult, typed: OutputType) -> Any:
    """The value of a teammate's typed answer, validated as `typed`; `InvalidOutput` or
    `OutputError` (carrying the result) when the task ended without one."""

    def error(kind: type[OutputError], message: str) -> OutputError:
        return kind(message, stop_reason=result.stop_reason, detail=result.detail, result=result)

    if result.stop_reason == "answer" and result.output_name is not None:
        try:
            return typed.check(json.dumps(result.output)).value
        except Rejected as exc:
            raise error(
                InvalidOutput,
                f"{member}'s answer ({result.output_name}) does not match {typed.name}: {exc}",
            ) from None
    if result.stop_reason == "invalid_output":
        raise error(InvalidOutput, f"{member} gave no valid {typed.name}: {result.detail}")
    if result.stop_reason == "answer":
        raise error(
            OutputError,
            f"{member} answered with text, not a typed answer ({typed.name}): its Teammate "
            "declares no output_type",
        )
    raise error(
        OutputError,
        f"{member} stopped ({result.stop_reason}) without a typed answer ({typed.name}): "
        f"{result.detail}",
    )


class TeammateCancelled(Exception):
    """An incarnation stopped by `Team.cancel` (reported like a crash)."""


async def run_incarnation(runner: Runner, ready: Callable[[], None]) -> Exception | None:
    """Run one incarnation (its desk's listener beside it); the crash, if it crashed."""
    try:
        with anyio.CancelScope() as scope:
            runner.scope = scope
            async with runner.mcp_servers(), anyio.create_task_group() as tasks:
                tasks.start_soon(runner.desk.listen)
                tasks.start_soon(runner.progress.flusher)
                await runner.serve(ready)
                tasks.cancel_scope.cancel()
    except Exception as group:  # a crash: reported by the caller, never swallowed
        return _sole(group)
    if runner.cancelled is not None:
        return TeammateCancelled(runner.cancelled)
    return None


def _sole(exc: Exception) -> Exception:
    """The exception inside task-group wrapping, when there is exactly one."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        inner = exc.exceptions[0]
        if not isinstance(inner, Exception):
            break
        exc = inner
    return exc

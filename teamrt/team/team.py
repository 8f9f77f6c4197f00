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

Everything between teammates goes through the mailboxes; nothing here shares an agent's context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, overload

import anyio
from anyio.abc import TaskGroup, TaskStatus

from teamrt.agents.journal import Journal
from teamrt.agents.output import OutputType, Rejected
from teamrt.agents.state import AgentState
from teamrt.envelopes import Envelope, Request, Response, new_id, peer_answer
from teamrt.errors import (
    Deadlock,
    InvalidOutput,
    MailboxClosed,
    OutcomeUnknown,
    OutputError,
    ReceiveTimeout,
    RemoteError,
    StoreError,
    StoreOutage,
    StoreUnavailable,
    TeammateGone,
    TeamrtError,
    UsageError,
)
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.outage import outage_of
from teamrt.mail.store import Lease
from teamrt.team.config import MemberStatus, TeamBudget, Teammate
from teamrt.team.lead import Handler, LeadServer, ask_once, keyed_id
from teamrt.team.protocol import (
    SHUTDOWN,
    SHUTDOWN_ACK,
    STREAMED_TASK,
    TASK,
    TEAMMATE_CRASHED,
    WITHDRAWN,
    Approver,
    ProgressBody,
    ShutdownBody,
    TaskResult,
    WithdrawBody,
    is_shutdown,
)
from teamrt.team.runner import Runner, TeamContext
from teamrt.teamdir import AgentDir

log = logging.getLogger("teamrt.team")

#: Seconds a withdrawal's send may take when the caller was cancelled (shielded, then given up).
WITHDRAW_WITHIN = 5.0

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
        self.teammates: dict[str, Teammate] = {}
        self.pools: dict[str, tuple[str, ...]] = {}  # role -> its replicas' member names
        for teammate in teammates:
            members = [teammate]
            if teammate.replicas > 1:
                members = [
                    dataclasses.replace(teammate, name=f"{teammate.name}-{i}", replicas=1)
                    for i in range(1, teammate.replicas + 1)
                ]
                self.pools[teammate.name] = tuple(m.name for m in members)
            for member in members:
                if member.name in self.teammates:
                    raise UsageError(f"two teammates are named {member.name!r}")
                self.teammates[member.name] = member
        if lead in self.teammates:
            raise UsageError(f"the lead {lead!r} cannot also be a teammate")
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
        self._in_flight: dict[str, int] = {}
        self._asking: dict[str, Request] = {}  # task id -> the task, while its ask awaits it
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._running = 0
        self._all_done = anyio.Event()
        self._task_group: TaskGroup | None = None
        self._serving_lead = False
        self._lead_lease: Lease | None = None
        self._runners: dict[str, Runner] = {}  # the current incarnation of each member
        self._carried: dict[str, AgentState | None] = {}  # conversations, without a journal
        self._waits_for: dict[str, list[str]] = {}  # member -> members its requests wait on
        self._stopping = False
        self._output_types: dict[Any, OutputType] = {}  # asked for with `ask(output_type=)`
        self.started = time.time()  # reset when the team starts

    async def __aenter__(self) -> Self:
        self.started = time.time()
        roster = await self.mail.members_now()
        undeclared = [name for name in self.remote if name not in roster]
        if undeclared:
            raise UsageError(
                f"remote members {undeclared} are not in the team's roster "
                f"({', '.join(roster) or 'empty'}): a remote member is run elsewhere, so it "
                "must be declared first (FileMailboxes(..., members=[...]) or `teamrt run-agent "
                "--join`); check the spelling"
            )
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
        self._task_group = task_group
        try:
            self._serve_lead()
            for teammate in self.teammates.values():
                await task_group.start(self._supervise, teammate)
        except BaseException:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            self._task_group = None
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
        typed = self._output_type(member, output_type) if output_type is not None else None
        request = self._task(member, text, TASK, timeout, trace_id)
        if key is not None:
            request = request.model_copy(update={"id": keyed_id(self.mail.team, self.lead, key)})
        async with self._asked(request):
            if key is not None:
                response = await ask_once(self._lead, member, request, key, timeout, self._request)
            else:
                response = await self._request(request, timeout)
        result = peer_answer(TaskResult, response)
        return result if typed is None else typed_answer(request.recipient, result, typed)

    def _output_type(self, member: str, output_type: Any) -> OutputType:
        """`output_type` ready to validate answers; refused for a member of this team (or a
        pool) whose teammate declares none, since it would answer with text."""
        names = self.pools.get(member, (member,))
        for name in names:
            teammate = self.teammates.get(name)
            if teammate is not None and teammate.output_type is None:
                raise UsageError(
                    f"{member!r} declares no output_type, so it answers with text: give its "
                    "Teammate an output_type (Teammate(..., output_type=...)) to ask for a "
                    "typed answer"
                )
        try:
            return self._output_types[output_type]
        except (KeyError, TypeError):  # not seen yet, or a type that cannot be a key
            typed = OutputType(output_type)
        with contextlib.suppress(TypeError):
            self._output_types[output_type] = typed
        return typed

    def _task(
        self, member: str, text: str, kind: str, timeout: float | None, trace_id: str | None
    ) -> Request:
        """The task request for `member` (a pool's least busy replica), which must be running;
        its answer comes back to the lead's inbox."""
        member = self.pick(member)
        status = self.status.get(member)
        if status is not None and status.state in ("crashed", "stopped"):
            raise TeammateGone(f"{member!r} {status.state} and is not running: {status.last}")
        return Envelope.request(
            self.lead, member, text, type=kind, timeout=timeout, trace_id=trace_id or new_id()
        )

    @contextlib.asynccontextmanager
    async def _asked(self, request: Request) -> AsyncIterator[None]:
        """While `request` is awaited: a refusal (`TeammateGone`, a `TeammateCrashed` error)
        or the caller's cancellation withdraws it, so that no later incarnation runs it."""
        self._asking[request.id] = request
        try:
            yield
        except TeammateGone as exc:
            started = await self._withdraw(request, "refused: the teammate is not running")
            raise TeammateGone(
                f"{exc}; it is withdrawn: no later incarnation starts it"
                + _if_started(started, request),
                task_id=request.id,
                started=started,
            ) from None
        except RemoteError as exc:
            if exc.error_type == TEAMMATE_CRASHED:
                await self._withdraw(request, "refused: the teammate crashed")
            raise
        except anyio.get_cancelled_exc_class():
            await self._withdraw(request, "cancelled")
            raise
        finally:
            self._asking.pop(request.id, None)

    async def withdraw(
        self, task_id: str, *, member: str | None = None, reason: str = "withdrawn"
    ) -> None:
        """Withdraw a task the lead gave: if it is still queued it never runs; if it is
        running it stops at its next step boundary (its model call and tools cut short); either
        way it is answered with stop reason `cancelled` (a running `ask` returns that result,
        a late answer reaches the lead's notices). Honoured by every later incarnation of the
        member, in any process. `member` is needed for a task not being asked from this team
        now (one whose `ask` raised `RequestTimeout`, say: `exc.request.recipient`)."""
        request = self._asking.get(task_id)
        if request is not None:
            await self._withdraw(request, reason)
            return
        if member is None:
            raise UsageError(
                f"task {task_id} is not being asked from this team: name its member "
                "(withdraw(task_id, member=...))"
            )
        await self._send_withdrawal(member, task_id, reason)

    async def _withdraw(self, request: Request, reason: str) -> bool | None:
        """Send the withdrawal of `request` (shielded, bounded); whether it had started."""
        await self._send_withdrawal(request.recipient, request.id, reason)
        return self._started(request)

    async def _send_withdrawal(self, member: str, task_id: str, reason: str) -> None:
        body = WithdrawBody(task=task_id, reason=reason)
        withdrawal = Envelope.message(self.lead, member, body, type=WITHDRAWN)
        # the caller may be cancelled already: the send must still go out, but not hang it
        with anyio.move_on_after(WITHDRAW_WITHIN, shield=True) as scope:
            try:
                await self.mail.send(withdrawal)
            except TeamrtError as exc:  # the caller's own error (or cancellation) comes first
                log.error("task %s of %s not withdrawn: %s", task_id, member, exc)
        if scope.cancelled_caught:
            log.error("task %s of %s not withdrawn: the send took over %gs", task_id, member,
                      WITHDRAW_WITHIN)  # fmt: skip

    def _started(self, request: Request) -> bool | None:
        """Whether the member had started `request`, as far as this process can tell."""
        runner = self._runners.get(request.recipient)
        if runner is not None and runner.current is not None and runner.current.id == request.id:
            return True
        if self.agent_dir is None or request.recipient in self.remote:
            return None
        try:
            state = Journal(AgentDir(self.agent_dir).journal(request.recipient)).load()
        except (StoreError, OSError):
            return None
        return state is not None and (state.task_id == request.id or request.id in state.handled)

    async def _request(self, request: Request, timeout: float | None) -> Response:
        """`mail.request`, counted as in flight to its member (for `pick`)."""
        member = request.recipient
        self._in_flight[member] = self._in_flight.get(member, 0) + 1
        try:
            return await self.mail.request(request, timeout=timeout)
        finally:
            self._in_flight[member] -= 1

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
        request = self._task(member, text, STREAMED_TASK, timeout, None)
        send, receive = anyio.create_memory_object_stream[ProgressBody | TaskResult | Exception](
            math.inf
        )
        self._lead.streams[request.id] = send

        async def ask() -> None:
            async with send:
                try:
                    async with self._asked(request):
                        response = await self._request(request, timeout)
                    await self._lead_caught_up()  # the progress sent before the answer first
                    await send.send(peer_answer(TaskResult, response))
                except Exception as exc:  # handed to the consumer, raised from its iterator
                    await send.send(exc)
                finally:
                    self._lead.streams.pop(request.id, None)

        async def events() -> AsyncIterator[ProgressBody | TaskResult]:
            async for item in receive:
                if isinstance(item, Exception):
                    raise item
                yield item

        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            with receive:
                try:
                    yield events()
                except Exception as exc:  # raised out of the task group as it is, not grouped
                    failure = exc
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _lead_caught_up(self) -> None:
        """Wait (briefly) until the lead's server has taken in what the lead's inbox read so
        far: an answer is routed at once, the messages read before it may still be queued."""
        inbox = await self.mail.open_inbox(self.lead)
        for _ in range(1000):
            if inbox.statistics().ready == 0:
                return
            await anyio.sleep(0.001)

    def pick(self, role: str) -> str:
        """The member to ask: `role` itself, or the least busy live replica of its pool
        (fewest tasks in flight from the lead, then idle before working)."""
        members = self.pools.get(role)
        if members is None:
            return role
        live = [m for m in members if self.status[m].state != "crashed"] or list(members)

        def load(member: str) -> tuple[int, int]:
            status = self.status[member]
            return (self._in_flight.get(member, 0), status.state != "idle")

        return min(live, key=load)

    @contextlib.contextmanager
    def waiting(self, member: str, on: str) -> Iterator[None]:
        """`member` waits on a request to `on`: refuse it with `Deadlock` if `on` (or whoever
        `on` waits on, and so on) is waiting on `member` (the wait-for graph of this team's
        members, in this process)."""
        cycle = self._path(on, member)
        if cycle is not None:
            chain = " -> ".join([member, *cycle])
            log.warning("deadlock refused: %s", chain)
            raise Deadlock(
                f"{chain}: {on} is busy waiting (through this chain) on {member}, so "
                f"{member}'s request to {on} could only time out; refused"
            )
        edges = self._waits_for.setdefault(member, [])
        edges.append(on)
        try:
            yield
        finally:
            edges.remove(on)
            if not edges:
                del self._waits_for[member]

    def _path(self, start: str, goal: str) -> list[str] | None:
        """A chain of waits from `start` to `goal`, if there is one."""
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            if path[-1] == goal:
                return path
            for nxt in self._waits_for.get(path[-1], ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

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
        self._stopping = True
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
        for status in self.status.values():
            if status.state == "restarting":  # between incarnations: nothing to ask to stop
                self._scopes[status.name].cancel()
        running = [
            s for s in self.status.values() if s.state not in ("stopped", "crashed", "restarting")
        ]
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
                log.warning("%s did not stop by the shutdown deadline: cancelled", name)
                if (runner := self._runners.get(name)) is not None:
                    runner.record("cancel", self.status[name].last)
                scope.cancel()

    def enforce_deadline(self, member: str, shutdown: Request) -> None:
        """A teammate accepted `shutdown`: if it has not stopped by the request's deadline,
        cancel it there (whoever sent the request, in this process or another)."""
        if shutdown.deadline is None or self._task_group is None:
            return
        self._task_group.start_soon(self._cancel_at, member, shutdown.deadline)

    async def _cancel_at(self, member: str, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.time()))
        status, scope = self.status[member], self._scopes.get(member)
        if scope is not None and status.state not in ("stopped", "crashed"):
            status.last = "cancelled at the shutdown deadline"
            log.warning("%s did not stop by its shutdown deadline: cancelled", member)
            if (runner := self._runners.get(member)) is not None:
                runner.record("cancel", status.last)
            scope.cancel()

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
        policy = teammate.restart
        started = False
        attempts: dict[str, int] = {}

        def ready() -> None:  # the team starts once each teammate announced itself (or died)
            nonlocal started
            if not started:
                task_status.started()
                started = True

        lease: Lease | None = None  # held from the first incarnation to the last, backoffs
        # included: a member between two incarnations is restarting, not gone
        try:
            with anyio.CancelScope() as scope:
                self._scopes[teammate.name] = scope
                while True:
                    incarnation = new_id()
                    status.incarnation = incarnation
                    previous, lease = (
                        lease,
                        await self.mail.store.acquire_lease(
                            teammate.name, f"pid {os.getpid()}, incarnation {incarnation}"
                        ),
                    )
                    if previous is not None:
                        await previous.release()
                    done = await self._while_leased(
                        lease, partial(self._incarnate, teammate, incarnation, ready, attempts)
                    )
                    if done is None:  # another holder took the lease over: it runs the member
                        log.warning("%s lost its lease to another holder (%s stopped renewing "
                                    "it in time); this incarnation stops", teammate.name,
                                    f"pid {os.getpid()}")  # fmt: skip
                        status.state, status.last = "stopped", "lease lost"
                        ready()
                        return
                    if done:
                        return
                    delay = policy.delay(status.restarts)
                    log.info("%s restarts in %.2fs (restart %d of %d)", teammate.name, delay,
                             status.restarts + 1, policy.max_restarts)  # fmt: skip
                    if await self._backoff(teammate.name, delay):
                        status.state = "stopped"  # asked to stop while it waited
                        return
                    status.restarts += 1
        finally:
            if lease is not None:
                try:
                    await lease.release()
                except (StoreUnavailable, OutcomeUnknown) as exc:  # it expires by itself
                    log.warning("%s's lease was not released: %s", teammate.name, exc)
        if status.state not in ("stopped", "crashed"):
            status.state = "stopped"

    async def _while_leased(
        self, lease: Lease, run: Callable[[], Awaitable[bool | None]]
    ) -> bool | None:
        """`run()`, stopped if the store reports the lease lost (a store whose leases expire,
        after another process took it over, or `run()` found it lost); None then."""
        if not self.mail.store.capabilities.leases_expire:
            return await run()
        outcome: list[bool | None] = []
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await lease.lost.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            outcome.append(await run())
            tg.cancel_scope.cancel()
        return outcome[0] if outcome else None

    async def _backoff(self, name: str, delay: float) -> bool:
        """Wait out a restart backoff, watching the member's inbox for a shutdown meanwhile
        (from a lead in any process); True if one came. Everything else read is handed back
        for the next incarnation, unacked."""
        inbox, held = await self.mail.open_inbox(name), []
        until = anyio.current_time() + delay
        try:
            while (left := until - anyio.current_time()) > 0:
                try:
                    envelope = await inbox.receive(timeout=left)
                except ReceiveTimeout:
                    return False
                if is_shutdown(envelope):
                    body = ShutdownBody.model_validate(envelope.body)
                    if body.incarnation in (None, self.status[name].incarnation):
                        inbox.ack_nowait(envelope)
                        await self.mail.send(
                            Envelope.response(envelope, {"incarnation": None}, type=SHUTDOWN_ACK)
                        )
                        return True
                held.append(envelope)
            return False
        finally:
            if held:
                with contextlib.suppress(MailboxClosed, UsageError):
                    inbox.release(*held)

    async def _incarnate(
        self,
        teammate: Teammate,
        incarnation: str,
        ready: Callable[[], None],
        attempts: dict[str, int],
    ) -> bool | None:
        """Run one incarnation; True if the member is done (stopped, or crashed for good),
        None if it lost its lease."""
        status, policy = self.status[teammate.name], teammate.restart
        await self.mail.open_inbox(teammate.name)  # the desk reads it
        runner = Runner(
            self._runner_context(),
            teammate,
            incarnation,
            status,
            self._carried.get(teammate.name),
            attempts,
        )
        try:
            crash = await self._incarnation(runner, ready)
            if crash is not None and not self.mail.store.lease_held(teammate.name):
                return None  # it lost its lease (LeaseLost): not a crash; it must not act
            if crash is None:
                status.state = "stopped"
                return True
            outage = outage_of(crash, self.mail.store_outage)
            if outage is not None:  # the store's fault, not the teammate's: no crash report
                self._stopped_by(runner, outage)
                ready()
                return True
            restarting = policy.on_failure and status.restarts < policy.max_restarts
            await runner.report_crash(crash, restarting)
            status.state = "restarting" if restarting else "crashed"
            if not restarting:
                ready()
                return True
        finally:
            self._runners.pop(teammate.name, None)
            self._carried[teammate.name] = runner.final_state()
            await runner.close()
        if self._stopping:
            status.state = "stopped"  # the team is shutting down: no new incarnation
            return True
        return False

    def _runner_context(self) -> TeamContext:
        """What an incarnation starting now takes from the team."""
        return TeamContext(
            mail=self.mail,
            lead=self.lead,
            agents=AgentDir(self.agent_dir) if self.agent_dir is not None else None,
            prices=self.prices,
            budget=self.budget,
            started=self.started,
            shutdown_deadline=self.shutdown_deadline,
            pick=self.pick,
            waiting=self.waiting,
            enforce_deadline=self.enforce_deadline,
        )

    def _stopped_by(self, runner: Runner, outage: StoreOutage) -> None:
        """The stop report of an incarnation that outlasted the store's outage tolerance: its
        task stays unanswered and unacked, for the next incarnation to resume."""
        status = runner.status
        status.state, status.outage = "stopped", str(outage)
        status.last = f"stopped by a store outage: {outage}"
        log.warning("%s (incarnation %s) stopped: %s; its task is resumed from the journal by "
                    "the next incarnation", runner.name, runner.incarnation, outage)  # fmt: skip
        runner.record("outage", str(outage))

    async def _incarnation(self, runner: Runner, ready: Callable[[], None]) -> Exception | None:
        """Run one incarnation (its desk's listener beside it); the crash, if it crashed."""
        self._runners[runner.name] = runner
        try:
            with anyio.CancelScope() as scope:
                runner.scope = scope
                async with runner.mcp_servers(), anyio.create_task_group() as tasks:
                    tasks.start_soon(runner.desk.listen)
                    tasks.start_soon(runner.flusher)
                    await runner.serve(ready)
                    tasks.cancel_scope.cancel()
        except Exception as group:  # a crash: reported by the caller, never swallowed
            return _sole(group)
        if runner.cancelled is not None:
            return TeammateCancelled(runner.cancelled)
        return None

    async def cancel(self, member: str, reason: str) -> None:
        """Stop `member`'s current incarnation now, whatever it is doing (a hung teammate).

        Handled like a crash: the lead gets a `teammate_crashed` notice, the task it was on is
        answered with a `TeammateCrashed` error naming `reason` (and not resumed), and its
        restart policy decides whether a new incarnation starts.
        """
        runner = self._runners.get(member)
        if runner is None or runner.scope is None:
            raise UsageError(f"{member!r} is not running in this team")
        log.warning("cancelling %s: %s", member, reason)
        runner.cancelled = reason
        runner.scope.cancel()


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


def _if_started(started: bool | None, request: Request) -> str:
    if started is False:
        return f" (task {request.id} had not started)"
    when = "it had started" if started else "if it had started"
    return (
        f" ({when}, task {request.id} stops at its next step: its outcome, stop reason "
        "`cancelled`, may still reach the lead)"
    )


def _sole(exc: Exception) -> Exception:
    """The exception inside task-group wrapping, when there is exactly one."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        inner = exc.exceptions[0]
        if not isinstance(inner, Exception):
            break
        exc = inner
    return exc

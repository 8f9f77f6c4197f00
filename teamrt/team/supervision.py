"""Supervision: each teammate's life under its lease, one incarnation at a time, restarted
by its policy after a crash; and stopping teammates, at the team's shutdown or its deadline.

`Supervisor` owns the incarnations running in this process (their cancel scopes and runners)
and the conversations carried from one incarnation to the next; the team hands it the task
group that runs them, what an incarnation takes from the team (`context`) and how one is run
(`run`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import anyio
from anyio.abc import TaskGroup, TaskStatus

from teamrt.agents.journal import Journal
from teamrt.agents.state import AgentState
from teamrt.envelopes import Envelope, Request, new_id
from teamrt.errors import (
    MailboxClosed,
    OutcomeUnknown,
    ReceiveTimeout,
    StoreError,
    StoreOutage,
    StoreUnavailable,
    UsageError,
)
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.outage import outage_of
from teamrt.mail.store import Lease
from teamrt.team.config import MemberStatus, Teammate
from teamrt.team.context import TeamContext
from teamrt.team.protocol import SHUTDOWN, SHUTDOWN_ACK, ShutdownBody, is_shutdown
from teamrt.team.runner import Runner
from teamrt.teamdir import AgentDir

log = logging.getLogger("teamrt.team")

#: Runs one incarnation (calling `ready` once it serves); the crash, if it crashed.
RunIncarnation = Callable[[Runner, Callable[[], None]], Awaitable[Exception | None]]


class Supervisor:
    """The teammates' lives in this process: leases, incarnations, restarts and stops."""

    def __init__(
        self,
        mail: Mailboxes,
        lead: str,
        *,
        status: dict[str, MemberStatus],
        remote: tuple[str, ...],
        agent_dir: Path | None,
        context: Callable[[], TeamContext],
        run: RunIncarnation,
    ) -> None:
        self.mail, self.lead = mail, lead
        self.status, self.remote, self.agent_dir = status, remote, agent_dir
        self.context = context  # what an incarnation starting now takes from the team
        self.run = run
        self.task_group: TaskGroup | None = None  # the team's, while it runs
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._running = 0
        self._all_done = anyio.Event()
        self._runners: dict[str, Runner] = {}  # the current incarnation of each member
        self._carried: dict[str, AgentState | None] = {}  # conversations, without a journal
        self._stopping = False
        self._late: list[str] = []  # members a shutdown cancelled at its deadline

    # -- one teammate's life --

    async def supervise(self, teammate: Teammate, *, task_status: TaskStatus[None]) -> None:
        """Run `teammate` until it is done (stopped, crashed for good, or its lease lost)."""
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
            self.context(),
            teammate,
            incarnation,
            status,
            self._carried.get(teammate.name),
            attempts,
        )
        try:
            self._runners[runner.name] = runner
            crash = await self.run(runner, ready)
            if crash is not None and not self.mail.store.lease_held(teammate.name):
                return None  # it lost its lease (LeaseLost): not a crash; it must not act
            if crash is None:
                status.state = "stopped"
                return True
            outage = outage_of(crash, self.mail.store_outage)
            if outage is not None:  # the store's fault, not the teammate's: no crash report
                _stopped_by(runner, outage)
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

    def started(self, request: Request) -> bool | None:
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

    # -- stopping --

    def cancel(self, member: str, reason: str) -> None:
        """Stop `member`'s current incarnation now (see `Team.cancel`)."""
        runner = self._runners.get(member)
        if runner is None or runner.scope is None:
            raise UsageError(f"{member!r} is not running in this team")
        log.warning("cancelling %s: %s", member, reason)
        runner.cancelled = reason
        runner.scope.cancel()

    async def shutdown(self, deadline: float) -> None:
        """Ask every running teammate to stop after its current step; cancel any still running
        when the deadline passes."""
        self._stopping = True
        for name in self.remote:
            await self._ask_to_stop(name, None, deadline)
        for status in self.status.values():
            if status.state == "restarting":  # between incarnations: nothing to ask to stop
                self._scopes[status.name].cancel()
        running = [
            s for s in self.status.values() if s.state not in ("stopped", "crashed", "restarting")
        ]
        for status in running:
            await self._ask_to_stop(status.name, status.incarnation or None, deadline)
        if self._running:
            with anyio.move_on_after(deadline):
                await self._all_done.wait()
        self._late += [name for name in list(self._scopes) if self._cancel_late(name)]
        if self._late:
            log.warning("%s", _late_summary(self._late))

    async def _ask_to_stop(self, member: str, incarnation: str | None, deadline: float) -> None:
        body = ShutdownBody(incarnation=incarnation, reason="team shutdown")
        await self.mail.send(
            Envelope.request(self.lead, member, body, type=SHUTDOWN, timeout=deadline)
        )

    def _cancel_late(self, member: str) -> bool:
        """Cancel `member` if it is still running past a shutdown deadline; True if this did
        (False: it had stopped, or was cancelled already)."""
        status, scope = self.status[member], self._scopes.get(member)
        if scope is None or scope.cancel_called or status.state in ("stopped", "crashed"):
            return False
        status.last = "cancelled at the shutdown deadline"
        if (runner := self._runners.get(member)) is not None:
            runner.record("cancel", status.last)
        scope.cancel()
        return True

    def enforce_deadline(self, member: str, shutdown: Request) -> None:
        """A teammate accepted `shutdown`: if it has not stopped by the request's deadline,
        cancel it there (whoever sent the request, in this process or another)."""
        if shutdown.deadline is None or self.task_group is None:
            return
        self.task_group.start_soon(self._cancel_at, member, shutdown.deadline)

    async def _cancel_at(self, member: str, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.time()))
        if not self._cancel_late(member):
            return
        if self._stopping:  # the team's shutdown names everyone it cancelled, in one warning
            self._late.append(member)
        else:
            log.warning("%s did not stop by its shutdown deadline: cancelled", member)

    async def wait(self) -> None:
        """Return once every teammate has stopped (or crashed for good)."""
        if self._running:
            await self._all_done.wait()


def _late_summary(late: list[str], shown: int = 10) -> str:
    """One line for every member a shutdown cancelled at its deadline (a big team's shutdown
    may cancel hundreds: the first few are named)."""
    named = ", ".join(repr(name) for name in late[:shown])
    more = f" and {len(late) - shown} more" if len(late) > shown else ""
    teammates = "teammate" if len(late) == 1 else "teammates"
    return f"{len(late)} {teammates} did not stop by the shutdown deadline: cancelled {named}{more}"


def _stopped_by(runner: Runner, outage: StoreOutage) -> None:
    """The stop report of an incarnation that outlasted the store's outage tolerance: its
    task stays unanswered and unacked, for the next incarnation to resume."""
    status = runner.status
    status.state, status.outage = "stopped", str(outage)
    status.last = f"stopped by a store outage: {outage}"
    log.warning("%s (incarnation %s) stopped: %s; its task is resumed from the journal by "
                "the next incarnation", runner.name, runner.incarnation, outage)  # fmt: skip
    runner.record("outage", str(outage))

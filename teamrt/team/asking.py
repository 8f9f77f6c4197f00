"""The lead's asks: task requests to members (a pool's least busy replica), the tasks in
flight, their withdrawal when refused or cancelled, and streamed tasks.

`Asks` owns what the lead has asked and not yet heard back; whether a member had started a
task is the supervisor's to say (`started`), and the lead's inbox is the `LeadServer`'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from teamrt.agents.output import OutputType
from teamrt.envelopes import Envelope, Request, Response, new_id, peer_answer
from teamrt.errors import RemoteError, TeammateGone, TeamrtError, UsageError
from teamrt.mail.mailboxes import Mailboxes
from teamrt.team.config import MemberStatus, Teammate
from teamrt.team.lead import LeadServer, ask_once, keyed_id
from teamrt.team.protocol import (
    STREAMED_TASK,
    TASK,
    TEAMMATE_CRASHED,
    WITHDRAWN,
    ProgressBody,
    TaskResult,
    WithdrawBody,
)

log = logging.getLogger("teamrt.team")

#: Seconds a withdrawal's send may take when the caller was cancelled (shielded, then given up).
WITHDRAW_WITHIN = 5.0


class Asks:
    """The tasks the lead gives its members and waits on."""

    def __init__(
        self,
        mail: Mailboxes,
        lead: str,
        *,
        teammates: dict[str, Teammate],
        pools: dict[str, tuple[str, ...]],
        status: dict[str, MemberStatus],
        server: LeadServer,
        started: Callable[[Request], bool | None],
    ) -> None:
        self.mail, self.lead = mail, lead
        self.teammates, self.pools, self.status = teammates, pools, status
        self.server = server
        self.started = started  # whether a member had started a task, as far as one can tell
        self._in_flight: dict[str, int] = {}
        self._asking: dict[str, Request] = {}  # task id -> the task, while its ask awaits it
        self._output_types: dict[Any, OutputType] = {}  # asked for with `ask(output_type=)`

    async def ask(
        self,
        member: str,
        text: str,
        timeout: float | None,
        trace_id: str | None,
        key: str | None,
    ) -> tuple[Request, TaskResult]:
        """Give `member` a task and wait for its result (see `Team.ask`); the request sent."""
        request = self.task(member, text, TASK, timeout, trace_id)
        if key is not None:
            request = request.model_copy(update={"id": keyed_id(self.mail.team, self.lead, key)})
        async with self.asked(request):
            if key is not None:
                response = await ask_once(self.server, member, request, key, timeout, self.request)
            else:
                response = await self.request(request, timeout)
        return request, peer_answer(TaskResult, response)

    def output_type(self, member: str, output_type: Any) -> OutputType:
        """`output_type` ready to validate answers; refused for a member of this team (or a
        pool) whose teammate declares none, since it would answer with text."""
        for name in self.pools.get(member, (member,)):
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

    def task(
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
    async def asked(self, request: Request) -> AsyncIterator[None]:
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

    async def withdraw(self, task_id: str, member: str | None, reason: str) -> None:
        """Withdraw a task the lead gave (see `Team.withdraw`)."""
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
        return self.started(request)

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

    async def request(self, request: Request, timeout: float | None) -> Response:
        """`mail.request`, counted as in flight to its member (for `pick`)."""
        member = request.recipient
        self._in_flight[member] = self._in_flight.get(member, 0) + 1
        try:
            return await self.mail.request(request, timeout=timeout)
        finally:
            self._in_flight[member] -= 1

    @contextlib.asynccontextmanager
    async def stream(
        self, member: str, text: str, timeout: float | None
    ) -> AsyncIterator[AsyncIterator[ProgressBody | TaskResult]]:
        """Give `member` a task and see it happen (see `Team.stream`)."""
        request = self.task(member, text, STREAMED_TASK, timeout, None)
        send, receive = anyio.create_memory_object_stream[ProgressBody | TaskResult | Exception](
            math.inf
        )
        self.server.streams[request.id] = send

        async def ask() -> None:
            async with send:
                try:
                    async with self.asked(request):
                        response = await self.request(request, timeout)
                    await self._lead_caught_up()  # the progress sent before the answer first
                    await send.send(peer_answer(TaskResult, response))
                except Exception as exc:  # handed to the consumer, raised from its iterator
                    await send.send(exc)
                finally:
                    self.server.streams.pop(request.id, None)

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


def _if_started(started: bool | None, request: Request) -> str:
    if started is False:
        return f" (task {request.id} had not started)"
    when = "it had started" if started else "if it had started"
    return (
        f" ({when}, task {request.id} stops at its next step: its outcome, stop reason "
        "`cancelled`, may still reach the lead)"
    )

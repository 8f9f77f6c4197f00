"""The lead's side of a team: its inbox served from the start, like any member's.

Theory of operation. One server task reads the lead's inbox for as long as the team runs. Idle,
crash and shutdown-ack notices are acked at once and kept in a short view (`Team.notices`);
progress goes to whoever streams the task; plans go to the approver; requests go to the handler
registered for their type (answered with its return value, or an error response: `NoHandler`
when there is none). Everything else (messages, broadcasts, answers whose request is not
waiting in this process, a predecessor's outcomes included) is mail for the program, handed
over through a small buffer and acked only once the program has taken it (`Team.lead_mail()`).
When the buffer is full the server stops reading (what comes behind waits too: requests, plans,
progress): what the program has not taken stays in the inbox, unacked, and comes again to the
next lead. It must never ack mail the program has not seen.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import BaseModel, ValidationError

from teamrt.agents.tools import cancelled_for_real
from teamrt.envelopes import ERROR_TYPE, Envelope, Request, Response
from teamrt.errors import MailboxClosed, RemoteError, UsageError
from teamrt.mail.inbox import Inbox
from teamrt.mail.mailboxes import remote_error
from teamrt.team.protocol import (
    CRASHED,
    IDLE,
    LATE_PROTOCOL,
    PLAN_APPROVAL,
    PLAN_DECISION,
    PROGRESS,
    SHUTDOWN_ACK,
    DecisionBody,
    PlanBody,
    ProgressBody,
    TaskResult,
)

if TYPE_CHECKING:
    from teamrt.team.team import Team

log = logging.getLogger("teamrt.team")

#: Notices (idle, crash, shutdown ack) the lead keeps for inspection; older ones are dropped.
NOTICES_KEPT = 200
#: Mail read from the lead's inbox and not yet taken by the program; beyond it the server waits.
MAIL_BUFFERED = 64
#: The error type of a request to the lead that no handler takes.
NO_HANDLER = "NoHandler"

#: Answers a request to the lead: its return value is the response's body.
Handler = Callable[[Request], Awaitable[Any]]


class LeadServer:
    """Serves one team's lead inbox (see the module docstring); owned by its `Team`."""

    def __init__(self, team: Team, on_request: Handler | None) -> None:
        self.team = team
        self.notices: deque[Envelope] = deque(maxlen=NOTICES_KEPT)
        self.handlers: dict[str, Handler] = {}
        self.on_request = on_request
        self._send, self._receive = anyio.create_memory_object_stream[Envelope](MAIL_BUFFERED)
        self._inbox: Inbox | None = None
        self._settled: dict[str, anyio.Event] = {}  # keyed asks here, woken by a late answer
        #: Streamed tasks asked from this process, by task id: where their progress goes.
        self.streams: dict[str, MemoryObjectSendStream[ProgressBody | TaskResult | Exception]] = {}
        self._busy = 0  # envelopes received and not yet handled (for `caught_up`)

    def settling(self, task_id: str) -> anyio.Event | None:
        """The event set when the keyed ask of `task_id` running here ends (None: none runs)."""
        return self._settled.get(task_id)

    @contextlib.contextmanager
    def asking_once(self, task_id: str) -> Iterator[anyio.Event]:
        """While a keyed ask of `task_id` runs here: the event a late answer sets (the server
        settles the record with it), set when the ask ends, so that an ask of the same key
        here waiting on this one reads the record then."""
        settled = self._settled[task_id] = anyio.Event()
        try:
            yield settled
        finally:
            del self._settled[task_id]
            settled.set()

    def close(self) -> None:
        """The team stopped: the program's mail loop ends. What it did not take is handed back
        to the inbox, unacked (received again by whoever reads it next)."""
        self._send.close()
        untaken: list[Envelope] = []
        with contextlib.suppress(anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            while True:
                untaken.append(self._receive.receive_nowait())
        self._receive.close()
        if untaken and self._inbox is not None:
            with contextlib.suppress(MailboxClosed, UsageError):
                self._inbox.release(*untaken)

    def __del__(self) -> None:  # a team never entered: its streams were never used
        self.close()

    async def serve(self) -> None:
        """Read the lead's inbox until cancelled (with the team)."""
        inbox = self._inbox = await self.team.mail.open_inbox(self.team.lead)
        async with anyio.create_task_group() as handlers:
            while True:
                try:
                    envelope = await inbox.receive()  # answers to `ask` are routed before this
                except MailboxClosed:
                    return
                self._busy += 1
                try:
                    if isinstance(envelope, Request):
                        handlers.start_soon(self._answer, inbox, envelope)
                    elif not await self._notice(envelope):
                        await self._hand_over(inbox, envelope)
                finally:
                    self._busy -= 1

    async def _hand_over(self, inbox: Inbox, envelope: Envelope) -> None:
        """Mail to the program, waiting while its buffer is full (back-pressure). Cancelled
        before the program has it, the envelope goes back to the inbox, unacked."""
        try:
            await self._outcome(envelope)
            await self._send.send(envelope)
        except BaseException:
            with contextlib.suppress(MailboxClosed, UsageError):
                inbox.release(envelope)
            raise

    async def _notice(self, envelope: Envelope) -> bool:
        """Handle what is not the program's mail (acked here); False for mail."""
        if envelope.type == PROGRESS:
            await self._progressed(envelope)
        elif envelope.type in (IDLE, CRASHED, SHUTDOWN_ACK):
            self.notices.append(envelope)
        elif not (isinstance(envelope, Response) and envelope.type in LATE_PROTOCOL):
            return False
        self._ack(envelope)
        return True

    async def _outcome(self, envelope: Envelope) -> None:
        """An answer no request here waits for: it settles the record of a keyed ask."""
        if isinstance(envelope, Response) and envelope.in_reply_to is not None:
            await self.team.mail.store.task_record_settle(
                envelope.in_reply_to, envelope.model_dump(mode="json")
            )
            if (settled := self._settled.get(envelope.in_reply_to)) is not None:
                settled.set()

    def _ack(self, envelope: Envelope) -> None:
        if self._inbox is not None:
            with contextlib.suppress(MailboxClosed):
                self._inbox.ack_nowait(envelope)

    async def mail(self) -> AsyncGenerator[Envelope]:
        """The program's mail, in order; each envelope is acked once the next is asked for
        (or the loop is left), so a lead that dies mid-way gets it again next time."""
        taken: Envelope | None = None
        try:
            while True:
                if taken is not None:
                    self._ack(taken)
                    taken = None
                try:
                    taken = await self._receive.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    return
                yield taken
        finally:
            if taken is not None:
                self._ack(taken)

    def mail_nowait(self) -> list[Envelope]:
        """The mail read and not yet taken, taken now (and acked): for inspection and tests."""
        out: list[Envelope] = []
        while True:
            try:
                envelope = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return out
            self._ack(envelope)
            out.append(envelope)

    async def caught_up(self) -> None:
        """Wait (briefly) until the server has handled what the lead's inbox holds."""
        inbox = self._inbox or await self.team.mail.open_inbox(self.team.lead)
        for _ in range(1000):
            if self._busy == 0 and inbox.statistics().ready == 0:
                return
            await anyio.sleep(0.001)

    @property
    def buffered(self) -> int:
        """Mail read from the inbox that the program has not taken yet (at most MAIL_BUFFERED)."""
        return self._receive.statistics().current_buffer_used

    # -- requests to the lead --

    async def _answer(self, inbox: Inbox, request: Request) -> None:
        """Answer one request to the lead; acked once the answer is sent."""
        try:
            if request.type == PLAN_APPROVAL:
                approved, feedback = await self._decide(request)
                body = DecisionBody(approved=approved, feedback=feedback)
                response = Envelope.response(request, body, type=PLAN_DECISION)
            else:
                response = await self._handled(request)
            await self.team.mail.send(response)
        finally:
            self._ack(request)

    async def _handled(self, request: Request) -> Response:
        handler = self.handlers.get(request.type, self.on_request)
        if handler is None:
            return Envelope.error(
                request,
                NO_HANDLER,
                f"the lead {self.team.lead!r} takes no requests of type {request.type!r}: its "
                "program registers none (Team(..., on_request=...) or team.handle(type, ...))",
            )
        try:
            body = await handler(request)
        except BaseException as exc:  # the handler's bug is the asker's error, not the team's
            if isinstance(exc, anyio.get_cancelled_exc_class()) and cancelled_for_real():
                raise
            log.warning("the lead's handler failed on %s's request: %r", request.sender, exc)
            return Envelope.error(request, exc)
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        return Envelope.response(request, body)

    async def _progressed(self, envelope: Envelope) -> None:
        """A streamed task's progress: to whoever streams it (dropped once nobody does)."""
        try:
            body = ProgressBody.model_validate(envelope.body)
        except ValidationError:
            return
        listener = self.streams.get(body.task)
        if listener is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await listener.send(body)

    async def _decide(self, request: Request) -> tuple[bool, str]:
        """The lead's side of the approval gate: put the plan to the approver. Whatever goes
        wrong (a malformed plan, the approver's own bug) rejects the plan, saying why: it never
        takes the team down."""
        approver = self.team.approver
        if approver is None:
            return False, "the lead has no approver: no plan can be approved"
        try:
            plan = PlanBody.model_validate(request.body)
            return await approver(request.sender, plan.plan)
        except ValidationError as exc:
            return False, f"the plan is malformed: {exc.errors()[0]['msg']}"
        except BaseException as exc:  # the approver's bug must not take the team down
            if isinstance(exc, anyio.get_cancelled_exc_class()) and cancelled_for_real():
                raise
            log.warning("the approver failed on %s's plan: %r", request.sender, exc)
            return False, f"the approver failed: {type(exc).__name__}: {exc}"


# -- idempotent asks ------------------------------------------------------------------------------


def keyed_id(team: str, lead: str, key: str) -> str:
    """The id of the task request of an ask with idempotency `key`: the same in every process
    (30 hex digits, like any envelope id), so the teammate's dedup and the lead's routing of the
    answer match a retry to the first ask."""
    return hashlib.blake2b(f"{team}\0{lead}\0{key}".encode(), digest_size=15).hexdigest()


#: Sends a task request and waits for its answer (the team's `mail.request`, counted per member).
Asker = Callable[[Request, float | None], Awaitable[Response]]


async def ask_once(
    server: LeadServer, role: str, request: Request, key: str, timeout: float | None, ask: Asker
) -> Response:
    """`request` (its id from `key`) sent at most once per key (through `ask`), its first
    outcome returned.

    The store's task record is written before the send: a retry that finds it settled returns
    the outcome (an error response raises as `RemoteError`, as it did the first time); one that
    finds it unsettled (the first caller died, or timed out) lets the lead's server catch up
    with the inbox (where an earlier answer may wait), then sends the same request again,
    which the teammate's dedup by id recognises if it holds or handled it.
    """
    store = server.team.mail.store
    asked = {"key": key, "member": role, "text": request.body}
    mine = {**asked, "request": request.model_dump(mode="json")}
    record = await store.task_record_create(request.id, mine)
    if {k: record.get(k) for k in asked} != asked:
        raise UsageError(
            f"the idempotency key {key!r} was used for another ask (to {record.get('member')!r}: "
            f"{str(record.get('text'))[:80]!r}); a retry must repeat its ask exactly, and a new "
            "ask needs a new key"
        )
    while (other := server.settling(request.id)) is not None:  # the same key, asked here
        await other.wait()  # one request per id waits in an inbox: this ask waits for that one
        record = await store.task_record_create(request.id, mine)
    if "outcome" in record:
        return _outcome(record["outcome"])
    with server.asking_once(request.id) as settled:
        if record.get("request") != mine["request"]:
            await server.caught_up()
            record = await store.task_record_create(request.id, mine)
        if "outcome" in record:
            return _outcome(record["outcome"])
        return await _sent(server, request, timeout, settled, ask)


async def _sent(
    server: LeadServer, request: Request, timeout: float | None, settled: anyio.Event, ask: Asker
) -> Response:
    """Send `request` and wait for its answer, or for the lead's server to settle its record
    with an answer that came before this wait (a predecessor's)."""
    store = server.team.mail.store
    got: list[Envelope] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def request_it() -> None:
            try:
                got.append(await ask(request, timeout))
            except RemoteError as exc:  # an outcome too: a retry gets the same error
                got.append(exc.response)
            except Exception as exc:  # no outcome (a timeout, a teammate gone): raised as is
                failed.append(exc)
            tg.cancel_scope.cancel()

        async def settled_elsewhere() -> None:
            await settled.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(request_it)
        tg.start_soon(settled_elsewhere)
    if failed:
        raise failed[0]
    outcome = got[0].model_dump(mode="json") if got else {}
    record = await store.task_record_settle(request.id, outcome) if got else None
    if record is None:
        record = await store.task_record_create(request.id, {})
    return _outcome(record["outcome"])


def _outcome(data: dict[str, Any]) -> Response:
    """A settled record's answer, raised as `RemoteError` if it was an error response."""
    response = Response.model_validate(data)
    if response.type == ERROR_TYPE:
        raise remote_error(response)
    return response

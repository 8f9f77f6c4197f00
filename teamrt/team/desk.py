"""A teammate's desk: its inbox, sorted into tasks, a shutdown, and conversation mail.

Theory of operation. The desk is the only reader of a teammate's inbox. Whatever it reads it
sorts at once: a shutdown request for this incarnation is taken (and acked), a stale one refused;
a task is refused if its deadline has passed (`Expired`) or the queue is full (`Busy`), else it
joins the task queue; everything else is conversation mail. Nothing it keeps is acked until it is
safe: a task when its result is sent, mail when the agent's journal holds the step that showed it
to the model. A withdrawal (`task_withdrawn`, from the task's requester) comes after its task in
the inbox: a queued task is dropped and answered `cancelled`; one already taken by the runner is
marked (`withdrawals`), and the runner stops it at its next step boundary. A withdrawal is acked
with its task, never before it (an ack alone could outlive the task's at a restart); one whose task
is answered already, or never came, is acked at once. When an incarnation ends, whatever the desk
still holds goes back to the inbox (`Inbox.release`), so the next incarnation sees it; a process
that dies never acked it, so the next process reads it again from the committed cursor.

The desk reads all the time (`listen`, a task beside the runner's, so a task that overflows
the queue is refused at once even while the teammate works, and a shutdown is known at once), and
also on demand (`drain`, at step boundaries). Reading is bounded: at most `max_buffered` pieces of
mail are held in memory (the rest stays in the log, and the model is told that more is waiting),
and a long read yields to the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection

import anyio
import anyio.lowlevel
from pydantic import ValidationError

from teamrt.envelopes import Envelope, Request
from teamrt.errors import MailboxClosed, UsageError
from teamrt.mail.mailboxes import Inbox, Mailboxes
from teamrt.team.protocol import (
    BUSY,
    EXPIRED,
    LATE_PROTOCOL,
    RESULT,
    STALE_SHUTDOWN,
    WITHDRAWN,
    ShutdownBody,
    WithdrawBody,
    cancelled_result,
    is_shutdown,
    is_task,
)

log = logging.getLogger("teamrt.team")

#: Envelopes read between two yields to the event loop.
_YIELD_EVERY = 256
#: Conversation mail held in memory at most; the rest waits in the log.
DEFAULT_MAX_BUFFERED = 10_000


class Desk:
    """Sorts one teammate's inbox for one incarnation. See the module docstring."""

    def __init__(
        self,
        mail: Mailboxes,
        me: str,
        incarnation: str,
        *,
        max_queue: int,
        wake_on: Collection[str],
        seen: Callable[[str], bool] = lambda _id: False,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        clock: Callable[[], float] = time.time,
        on_queue: Callable[[int], None] = lambda _n: None,
        on_shutdown: Callable[[Request], None] = lambda _r: None,
        on_withdrawn: Callable[[Request, str], str] = lambda _r, who: f"{who}: never ran",
        on_withdrawn_running: Callable[[Request, Envelope], None] = lambda _r, _w: None,
        started: float = 0.0,
    ) -> None:
        self.mail, self.me, self.incarnation = mail, me, incarnation
        self.inbox: Inbox = mail.inbox(me)
        self.tasks: deque[Request] = deque()
        self.letters: deque[Envelope] = deque()  # conversation mail not shown to the model yet
        self.shutdown: Request | None = None
        self.max_queue, self.wake_on, self.max_buffered = (
            max_queue,
            frozenset(wake_on),
            max_buffered,
        )
        self._seen, self._clock = seen, clock
        self._held: dict[str, Envelope] = {}  # everything kept and not acked, in arrival order
        self._shown: list[Envelope] = []  # shown to the model, waiting for the journal
        self._changed = anyio.Event()  # something was sorted
        self._space = anyio.Event()  # the mail buffer has room again
        self._on_queue, self._on_shutdown = on_queue, on_shutdown
        # called with a dropped task and who withdrew it; returns its answer's detail
        self._on_withdrawn = on_withdrawn
        self._on_withdrawn_running = on_withdrawn_running  # a task the runner has, withdrawn
        #: task id -> its withdrawal, for tasks the runner took from the queue (held, unacked)
        self.withdrawals: dict[str, Envelope] = {}
        self.started = started  # when the team started (wall clock)
        # tasks found in the inbox at start were accepted before (by an earlier incarnation) or
        # waited for one: the queue's bound applies from the moment the runner is ready
        self.bounded = False

    # -- reading --

    @property
    def full(self) -> bool:
        """True when the desk holds as much mail as it may: the rest stays in the log."""
        return len(self.letters) >= self.max_buffered

    async def listen(self) -> None:
        """Read and sort the inbox as envelopes arrive, until cancelled (pausing while the
        mail buffer is full)."""
        while True:
            while self.full:
                space = self._space = anyio.Event()
                await space.wait()
            envelope = await self.inbox.receive()
            await self._sort(envelope)
            await self.drain()

    async def drain(self) -> None:
        """Read and sort whatever is in the inbox now (up to the mail buffer's size).

        Always yields once: a teammate working through a backlog step after step must let the
        other agents of the process run."""
        await anyio.lowlevel.checkpoint()
        read = 0
        while not self.full:
            try:
                envelope = self.inbox.receive_nowait()
            except anyio.WouldBlock:
                return
            await self._sort(envelope)
            read += 1
            if read % _YIELD_EVERY == 0:
                # a big backlog must not starve the other agents
                await anyio.lowlevel.checkpoint()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until something new is sorted; False if `timeout` seconds passed first."""
        changed = self._changed
        with anyio.move_on_after(timeout if timeout is not None else math.inf):
            await changed.wait()
            return True
        return False

    async def wait_for_letters(self, timeout: float, limit: int) -> list[Envelope]:
        """What `wait_for_messages` gets: conversation mail only, up to `limit`, waiting up to
        `timeout` seconds. Returns early (empty) when a shutdown arrives."""
        deadline = time.monotonic() + timeout
        await self.drain()
        while not self.letters and self.shutdown is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self.wait(remaining):
                break
        return self.show(limit)

    def _sorted(self) -> None:
        self._on_queue(len(self.tasks))
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _sort(self, envelope: Envelope) -> None:
        if self._seen(envelope.id):  # handled by an earlier incarnation, before its ack
            self.inbox.ack_nowait(envelope)
            return
        if is_shutdown(envelope):
            await self._take_shutdown(envelope)
        elif is_task(envelope):
            await self._take_task(envelope)
        elif envelope.type == WITHDRAWN:
            await self._take_withdrawal(envelope)
        elif envelope.type in LATE_PROTOCOL:  # its requester stopped waiting: nobody's mail
            self.inbox.ack_nowait(envelope)
        else:
            self._held[envelope.id] = envelope
            self.letters.append(envelope)
        self._sorted()

    async def _take_shutdown(self, request: Request) -> None:
        # one left over from before this team started (an earlier run's) is refused once its
        # deadline passed; one sent since is honoured late (it waited out a restart backoff)
        if request.ts < self.started and await self.refuse_if_expired(request):
            return
        self.inbox.ack_nowait(request)
        body = ShutdownBody.model_validate(request.body)
        if body.incarnation in (None, self.incarnation):
            self.shutdown = request
            self._on_shutdown(request)
            return
        await self.mail.send(
            Envelope.error(
                request,
                STALE_SHUTDOWN,
                f"{self.me} is incarnation {self.incarnation}, not {body.incarnation}: ignored",
            )
        )

    async def _take_task(self, request: Request) -> None:
        if await self.refuse_if_expired(request):
            return
        if self.bounded and len(self.tasks) >= self.max_queue:
            self.inbox.ack_nowait(request)
            log.info("%s refused task %s: busy (%d queued)", self.me, request.id, len(self.tasks))
            await self.mail.send(
                Envelope.error(
                    request,
                    BUSY,
                    f"{self.me} is busy: {len(self.tasks)} tasks are queued "
                    f"(max_queue={self.max_queue}); ask again later or ask another member",
                )
            )
            return
        self._held[request.id] = request
        self.tasks.append(request)

    async def _take_withdrawal(self, withdrawal: Envelope) -> None:
        try:
            body = WithdrawBody.model_validate(withdrawal.body)
        except ValidationError:
            body = None
        task = self._held.get(body.task) if body is not None else None
        # only its requester may withdraw a task; one not held is answered and acked already
        if body is None or task is None or not is_task(task) or task.sender != withdrawal.sender:
            self.inbox.ack_nowait(withdrawal)
            return
        why = f" ({body.reason})" if body.reason else ""
        log.info("%s: task %s withdrawn by %s%s", self.me, task.id, withdrawal.sender, why)
        if task not in self.tasks:  # the runner has it: it stops at its next step boundary
            self._held[withdrawal.id] = withdrawal
            self.withdrawals[task.id] = withdrawal
            self._on_withdrawn_running(task, withdrawal)
            return
        self.tasks.remove(task)
        detail = self._on_withdrawn(task, f"withdrawn by {withdrawal.sender}{why}")
        await self.answer_withdrawn(task, withdrawal, detail)

    async def answer_withdrawn(self, task: Request, withdrawal: Envelope, detail: str) -> None:
        """Answer a withdrawn task that will not run with stop reason `cancelled`, then ack it
        together with its withdrawal."""
        result = cancelled_result(detail, task.trace_id)
        await self.mail.send(Envelope.response(task, result, type=RESULT))
        self.withdrawals[task.id] = withdrawal  # done() acks the two together
        self.done(task)

    def withdrawal(self, task_id: str) -> Envelope | None:
        """The withdrawal of a task the runner holds, if its requester withdrew it."""
        return self.withdrawals.get(task_id)

    async def refuse_if_expired(self, request: Request) -> bool:
        """Answer `Expired` (and ack) if the request's deadline has passed."""
        deadline = request.deadline
        if deadline is None or not math.isfinite(deadline) or deadline > self._clock():
            return False
        self.inbox.ack_nowait(request)
        self._held.pop(request.id, None)
        late = self._clock() - deadline
        log.info("%s refused %s %s: its deadline passed %.3fs ago", self.me, request.type,
                 request.id, late)  # fmt: skip
        await self.mail.send(
            Envelope.error(
                request,
                EXPIRED,
                f"the request's deadline passed {late:.3f}s before {self.me} could start it: "
                "not worked on",
            )
        )
        return True

    # -- what the model sees --

    def wakes(self) -> bool:
        """True if some held mail is of a kind that wakes an idle teammate."""
        return any(e.kind in self.wake_on for e in self.letters)

    def show(self, limit: int) -> list[Envelope]:
        """Take up to `limit` pieces of mail to show the model; they are acked once the
        journal holds the step that showed them (`recorded`)."""
        batch = [self.letters.popleft() for _ in range(min(limit, len(self.letters)))]
        self._shown.extend(batch)
        if batch and not self.full:
            self._space.set()
        return batch

    def give_back(self, envelopes: list[Envelope]) -> None:
        """Taken by `show` but not shown after all: first in line again, still unacked."""
        taken = {e.id for e in envelopes}
        self._shown = [e for e in self._shown if e.id not in taken]
        self.letters.extendleft(reversed(envelopes))

    def waiting(self) -> int:
        return len(self.letters)

    def handled(self) -> list[str]:
        return [e.id for e in self._shown]

    def recorded(self) -> None:
        """The journal holds what was shown: ack it."""
        if self._shown:
            shown, self._shown = self._shown, []
            for envelope in shown:
                self._held.pop(envelope.id, None)
            self._ack(*shown)

    def done(self, request: Request) -> None:
        """A task is answered (or refused): ack it, with its withdrawal if there is one."""
        self._held.pop(request.id, None)
        withdrawal = self.withdrawals.pop(request.id, None)
        if withdrawal is None:
            self._ack(request)
            return
        self._held.pop(withdrawal.id, None)
        self._ack(request, withdrawal)

    def _ack(self, *envelopes: Envelope) -> None:
        # closed: the process is going down, and unacked means delivered again, never lost
        with contextlib.suppress(MailboxClosed):
            self.inbox.ack_nowait(*envelopes)

    # -- the end of an incarnation --

    def release(self) -> None:
        """Hand everything held and not acked back to the inbox, in arrival order."""
        held, self._held = list(self._held.values()), {}
        self.tasks.clear()
        self.withdrawals.clear()
        self.letters.clear()
        self._shown.clear()
        # closed: the next process reads them again from the committed cursor
        if held:
            with contextlib.suppress(MailboxClosed, UsageError):
                self.inbox.release(*held)

"""Mailboxes: sending, receiving, acks, request/response and broadcast over any store.

Theory of operation. `send` encodes an envelope once (refusing NaN and Infinity, signing it when
the team has a key; one over the envelope limit goes as a claim check, claims.py) and has the
store append it, retrying an append whose outcome a network store could not tell with the same
envelope (the receiver drops a second copy by id); a broadcast is
appended to every other member's inbox, in one step where the store can, and otherwise reports
exactly who got it if some appends fail. A receiver in the same process is woken directly, one in
another process by the store's watcher (inotify, or a blocking read of a network store), and a slow
shared rescan covers lost notifications. A background task renews this process's leases. Each
`Inbox` (inbox.py) belongs to one owner, holding its member's lease; it routes responses to the
`request` calls awaiting them. `request(consume=False)` watches the
sender's inbox from its end instead, for tools beside a live owner.

A request's wait for its answer is a `Requester`'s (requesting.py), the background tasks an
`Upkeep`'s (upkeep.py).

Everything here is store-agnostic: no file or lock is touched in this module, and no concrete
store is named (`teamrt.mail.open_mailboxes` turns a directory or a store URL into a store).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Self, TypeVar

import anyio
from anyio.abc import TaskGroup
from pydantic import ValidationError

from teamrt import telemetry
from teamrt.codec import encode
from teamrt.envelopes import (
    Broadcast,
    Envelope,
    ErrorBody,
    Request,
    Response,
    current_trace,
    payload_model,
    registered_payload,
    validate_body,
)
from teamrt.errors import (
    EnvelopeTooLarge,
    LeaseLost,
    MailboxClosed,
    OutcomeUnknown,
    PartialBroadcast,
    RemoteError,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from teamrt.mail import claims
from teamrt.mail.inbox import Inbox, InboxStatistics, deadline_after
from teamrt.mail.outage import DEFAULT_STORE_OUTAGE, ride_out
from teamrt.mail.requesting import GONE_AFTER, Liveness, Requester
from teamrt.mail.signing import Signer, fingerprint, team_key
from teamrt.mail.store import Store, run_local
from teamrt.mail.upkeep import Upkeep

__all__ = [
    "DEFAULT_COMMIT_DELAY",
    "DEFAULT_RESCAN_INTERVAL",
    "GONE_AFTER",
    "Inbox",
    "InboxStatistics",
    "Mailboxes",
]

log = logging.getLogger("teamrt.mail")
_Liveness = Liveness  # the name it had here, for callers that import it
T = TypeVar("T")

DEFAULT_RESCAN_INTERVAL = 1.0
#: A request to a member that ran and is not running fails after this many seconds (the
#: member may be between two incarnations, or starting), then is checked every half second.
LIVENESS_GRACE = 2.0
#: How long background cursor commits (ack_nowait, routed responses) wait to batch acks.
DEFAULT_COMMIT_DELAY = 0.01
#: The safety rescan checks every waiting inbox of a process that has up to this many open;
#: beyond it, those the store reports as possibly written, plus `RESCAN_SWEEP` more in turn.
RESCAN_EACH_UP_TO = 64
RESCAN_SWEEP = 16
#: How long `send` kept retrying an append by default, before `store_outage` covered sends too
#: (kept for callers that import it; `send_retry=None` now means `store_outage`).
DEFAULT_SEND_RETRY = 10.0


def remote_error(response: Response) -> RemoteError:
    """The `RemoteError` an error response stands for (its body as sent, or as text when it is
    not an error body)."""
    try:
        body = ErrorBody.model_validate(response.body)
    except ValidationError:
        body = ErrorBody(error="error", message=repr(response.body)[:500])
    return RemoteError(body.error, body.message, response)


def _batch_key(envelope: Envelope) -> str:
    return envelope.recipient  # "*" for broadcasts, which are sent one by one


class Mailboxes:
    """Every inbox of one team, over a store. Use as an async context manager.

    `open_mailboxes(locator)` (a directory or a store URL), `FileMailboxes` and
    `MemoryMailboxes` are the usual ways to make one. `store_outage`: how long (s) every
    store call made through these mailboxes (sends, cursor commits, reads, lease renewals, and
    the team's ledger and leases) waits out a network store that cannot be reached or does not
    answer, before the error goes through (`teamrt.mail.outage.ride_out`). `send_retry`: the
    same for sends alone, when they should give up sooner (default: `store_outage`). `key`
    (else `TEAMRT_TEAM_KEY`): the team key, which must be the one the team was created with
    (none for an unsigned team), or opening raises `TeamKeyMismatch`.
    """

    def __init__(
        self,
        store: Store,
        *,
        members: Iterable[str] = (),
        rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
        commit_delay: float = DEFAULT_COMMIT_DELAY,
        key: str | bytes | None = None,
        send_retry: float | None = None,
        store_outage: float = DEFAULT_STORE_OUTAGE,
    ) -> None:
        self.store = store
        self.store_outage = store_outage
        self._send_retry = send_retry
        secret = team_key(key)
        self._signer = None if secret is None else Signer(secret)
        self._fingerprint = "" if secret is None else fingerprint(secret, store.team)
        self._initial_members = tuple(members)
        self._inboxes: dict[str, Inbox] = {}
        self._task_group: TaskGroup | None = None
        self._open = False
        self._upkeep = Upkeep(
            store, self._inboxes, rescan_interval=rescan_interval, commit_delay=commit_delay
        )
        self._requester = Requester(store, self, self._inboxes, self._signer)

    @property
    def team(self) -> str:
        return self.store.team

    @property
    def members(self) -> tuple[str, ...]:
        """The roster as this process last saw it (`members_now()` asks the store)."""
        return self.store.members()

    async def members_now(self) -> tuple[str, ...]:
        """The roster now (another process may have added members)."""
        return await self.store.members_now()

    async def __aenter__(self) -> Self:
        try:
            await self.store.open(self._initial_members, signing=self._fingerprint)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a refused open holds no connection
                await self.store.close()
            raise
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        try:
            await self._upkeep.start(
                task_group,
                self._wake,
                rescan_each_up_to=RESCAN_EACH_UP_TO,
                rescan_sweep=RESCAN_SWEEP,
            )
        except BaseException:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            raise
        self._task_group = task_group
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._open = False
        try:
            with anyio.CancelScope(shield=True):
                try:
                    for inbox in self._inboxes.values():
                        try:
                            await inbox.flush()  # acks made with ack_nowait() are not lost
                        except LeaseLost as exc:  # its new holder gets the unacked mail again
                            log.warning("%s: acks not committed on close: %s", inbox.name, exc)
                finally:
                    for inbox in self._inboxes.values():
                        await inbox.close()
                    self._inboxes.clear()
        finally:
            # whatever the flush raised, the background tasks stop and the store closes
            try:
                if self._task_group is not None:
                    self._task_group.cancel_scope.cancel()
                    # only our background tasks run in it: the body's exception propagates
                    await self._task_group.__aexit__(None, None, None)
            finally:
                self._task_group = None
                with anyio.CancelScope(shield=True):
                    await self.store.close()
        return None

    def _check_open(self) -> None:
        if not self._open:
            raise MailboxClosed("the mailboxes are not open: use 'async with'")

    async def add_member(self, name: str) -> None:
        """Add `name` to the roster and create its inbox."""
        self._check_open()
        await self.store.add_member(name)

    def inbox(self, name: str) -> Inbox:
        """The inbox of member `name`, owned by this process (one object per name), opened on
        first use. On a store whose inboxes open over a network, open it first with
        `await mail.open_inbox(name)` (which works on every store)."""
        self._check_open()
        inbox = self._inboxes.get(name)
        if inbox is None:
            if not self.store.capabilities.opens_locally:
                raise UsageError(
                    f"{name}'s inbox is not open, and a {type(self.store).__name__} opens "
                    f"inboxes over the network: use `await mail.open_inbox({name!r})` first"
                )
            inbox = self._make_inbox(name)
            run_local(inbox.open(), f"opening {name}'s inbox")
            self._inboxes[name] = inbox
        return inbox

    async def open_inbox(self, name: str) -> Inbox:
        """The inbox of member `name`, owned by this process, opened (taking its lease) if it
        is not open yet. Works on every store."""
        self._check_open()
        inbox = self._inboxes.get(name)
        if inbox is None:
            inbox = self._make_inbox(name)
            await inbox.open()
            existing = self._inboxes.get(name)
            if existing is not None:  # another task opened it while this one waited
                await inbox.close()
                return existing
            self._inboxes[name] = inbox
        return inbox

    def _make_inbox(self, name: str) -> Inbox:
        """`name`'s inbox over this store, not open yet, committed by the background
        committer (`Upkeep.commit_soon`)."""
        commit_soon = self._upkeep.commit_soon
        inbox = Inbox(
            self.store,
            name,
            commit_soon=lambda: commit_soon(inbox),
            riding_out=self.riding_out,
            signer=self._signer,
        )
        return inbox

    # -- sending --

    def _encode(self, envelope: Envelope, *, traced: bool | None = None) -> bytes:
        """One envelope as `_encode_many` makes it; the usual one (nothing to fill in or check
        beyond the encoding: no task's trace, no telemetry, no payload model, no team key) the
        short way, once per send. `traced`: `telemetry.enabled()`, if the caller asked."""
        fields = envelope.__dict__  # (one read through pydantic's __getattr__ hook, not three)
        if (
            fields["team"] is None
            and self._signer is None
            and (fields["trace_id"] is not None or current_trace() is None)
            and not (telemetry.enabled() if traced is None else traced)
            and type(fields["type"]) is str
            and registered_payload(fields["type"]) is None
        ):
            encoded = encode(envelope, finite=True)
            if len(encoded) <= self.store.max_envelope:
                return encoded
        return self._encode_many((envelope,))[0]

    def _encode_many(self, envelopes: Iterable[Envelope], *, validate: bool = True) -> list[bytes]:
        """Each envelope as the line its inbox gets (before `seq` and `team`), checked; what is
        the same for the whole batch is looked up once (the batched send's hot path).
        `validate=False`: bodies are not checked against their payload models (a claim check's
        reference, whose payload was)."""
        trace = current_trace()
        traced = telemetry.enabled()
        team, limit, signer = self.store.team, self.store.max_envelope, self._signer
        payload_for = payload_model
        lines = []
        for envelope in envelopes:
            if envelope.trace_id is None and trace is not None:
                envelope = envelope.model_copy(update={"trace_id": trace})  # the task's trace
            if traced and envelope.traceparent is None:
                envelope = envelope.model_copy(update={"traceparent": telemetry.traceparent()})
            if envelope.team is not None and envelope.team != team:
                raise UsageError(f"envelope is for team {envelope.team!r}, not {team!r}")
            if validate and payload_for(envelope.type) is not None:
                validate_body(envelope.type, envelope.body)
            encoded = encode(envelope, finite=True)
            if signer is not None:
                encoded = signer.sign(encoded, team)
            if len(encoded) > limit:
                raise EnvelopeTooLarge(
                    f"envelope {envelope.id} from {envelope.sender} is {len(encoded)} bytes "
                    f"encoded, over the limit of {limit}; nothing was sent"
                )
            lines.append(encoded)
        return lines

    async def send(self, envelope: Envelope) -> None:
        """Append `envelope` to its recipient's inbox (every other member's, for a broadcast).

        When this returns the envelope is in the log at the configured durability. Anything
        but an `Envelope` is a `TypeError` (a programming error).
        """
        if not isinstance(envelope, Envelope):
            raise TypeError(f"send() takes an Envelope, not {type(envelope).__name__}")
        if not self._open:
            self._check_open()
        if not telemetry.enabled():
            await self._send(envelope, False)
            return
        attributes = {
            "messaging.system": "teamrt",
            "messaging.operation.type": "send",
            "messaging.destination.name": envelope.recipient,
            "messaging.message.id": envelope.id,
            "teamrt.envelope.kind": envelope.kind,
            "teamrt.envelope.type": envelope.type,
            "teamrt.sender": envelope.sender,
        }
        with telemetry.span(f"send {envelope.type}", attributes):
            await self._send(envelope, True)

    async def _send(self, envelope: Envelope, traced: bool) -> None:
        """`send`, once open (`traced`: inside a telemetry span)."""
        try:
            encoded = self._encode(envelope, traced=traced)
        except EnvelopeTooLarge as refused:  # its body goes as a claim check (claims.py)
            encoded = await self._check_in(envelope, refused)
        recipient = envelope.recipient
        if recipient == "*" and isinstance(envelope, Broadcast):  # (only a broadcast's is "*")
            await self._broadcast(envelope, encoded)
            return
        try:
            await self.store.append(recipient, encoded)
        except (StoreUnavailable, OutcomeUnknown):
            await self._append(recipient, encoded)  # retried with the same bytes
        self._wake(recipient)

    async def _check_in(self, envelope: Envelope, refused: EnvelopeTooLarge) -> bytes:
        """`envelope` as a claim check (claims.py): its body kept as a blob, and the
        reference that names it encoded (not validated again: the body was)."""
        reference, put = claims.check_in(self.store, envelope, refused)
        (encoded,) = self._encode_many((reference,), validate=False)
        await self._retrying(envelope.recipient, put)
        return encoded

    async def _append(self, recipient: str, encoded: bytes | Sequence[bytes]) -> None:
        """Append, retried as `_retrying` says."""
        if isinstance(encoded, bytes):
            await self._retrying(recipient, lambda: self.store.append(recipient, encoded))
        else:
            await self._retrying(recipient, lambda: self.store.append_many(recipient, encoded))

    async def _retrying(self, to: str, append: Callable[[], Awaitable[T]]) -> T:
        """`append()`, with an outage waited out for `send_retry` seconds: not reached
        (`StoreUnavailable`: nothing was sent) or not answered (`OutcomeUnknown`: maybe sent;
        the same bytes again are dropped by the receiver as a duplicate id)."""
        retry = self.store_outage if self._send_retry is None else self._send_retry
        return await ride_out(append, f"send to {to}", retry)

    async def riding_out(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """`call()` (a store call safe to repeat), with an outage waited out for
        `store_outage` seconds (see `teamrt.mail.outage`)."""
        return await ride_out(call, what, self.store_outage)

    async def _broadcast(self, envelope: Broadcast, encoded: bytes) -> None:
        """Append to every member's inbox but the sender's: in one step on a store with
        atomic broadcasts; otherwise one by one, and if some appends fail, the others are
        still tried and `PartialBroadcast` names who got it and who did not."""
        if self.store.capabilities.atomic_broadcast:
            reached = await self._retrying(
                "every member", lambda: self.store.append_broadcast(envelope.sender, encoded)
            )
            for member in reached:
                self._wake(member)
            return
        delivered: list[str] = []
        failed: list[tuple[str, StoreError]] = []
        for member in await self.store.members_now():
            if member == envelope.sender:
                continue
            try:
                await self._append(member, encoded)
            except StoreError as exc:
                failed.append((member, exc))
                continue
            delivered.append(member)
            self._wake(member)
        if not failed:
            return
        if not delivered:
            raise failed[0][1]  # nothing was written anywhere: the store's own error says so
        missed = ", ".join(
            f"{member} ({str(exc.strerror or exc).removesuffix('; nothing was written')})"
            for member, exc in failed
        )
        raise PartialBroadcast(
            f"broadcast {envelope.id} from {envelope.sender} reached {', '.join(delivered)} "
            f"but not {missed}; it is in the inboxes of those it reached",
            tuple(delivered),
            tuple(member for member, _ in failed),
        ) from failed[0][1]

    async def send_many(self, envelopes: Sequence[Envelope]) -> None:
        """Send several envelopes; consecutive ones to the same inbox share one locked write.

        Every envelope is encoded and checked before anything is written to its inbox.
        """
        self._check_open()
        for recipient, group in itertools.groupby(envelopes, key=_batch_key):
            if recipient == "*":
                for broadcast in group:
                    await self.send(broadcast)
                continue
            envelopes_to = list(group)
            try:
                batch = self._encode_many(envelopes_to)
            except EnvelopeTooLarge:  # one is a claim check: each is sent on its own, in order
                for envelope in envelopes_to:
                    await self.send(envelope)
                continue
            await self._append(recipient, batch)
            self._wake(recipient)

    def _wake(self, name: str) -> None:
        """Wake whoever waits on `name`'s inbox in this process (it was written to)."""
        inbox = self._inboxes.get(name)
        if inbox is not None:
            inbox.wake()

    # -- request / response --

    async def request(
        self,
        envelope: Request,
        *,
        timeout: float | None = None,
        consume: bool = True,
        require_live: bool = True,
    ) -> Response:
        """Send a request and wait for its response, matched by id and accepted only from the
        member that was asked (answers from anyone else are counted as rejected and dropped).

        A member that ran and is not running now (no live holder of its lease, or a holder
        whose heartbeat stopped) fails the request within about `LIVENESS_GRACE` seconds
        with `TeammateGone`, in any process, instead of at its timeout; the request stays in
        its inbox for when it starts again. A member that never ran (a human answering with
        `teamrt send`) is waited for; `require_live=False` waits for any member.

        The sender must be a member; its inbox is opened here (taking its lease) unless
        `consume=False`, which watches the sender's inbox for the answer without consuming it
        (for tools such as `teamrt send --wait` beside the inbox's live owner; the owner also
        receives the answer). Raises `RequestTimeout` when no answer comes in time (a late
        answer still reaches the sender's inbox) and `RemoteError` when the callee answers
        with an error response.
        """
        if type(envelope) is not Request and not isinstance(envelope, Request):  # exact: no ABC
            raise UsageError(f"request() takes a request envelope, not a {envelope.kind}")
        deadline = deadline_after(timeout)  # NaN, or too large for a float: UsageError
        if timeout == math.inf:
            timeout = None  # no deadline to stamp: wait as for None
        stamped = envelope.deadline  # (read once: a model's field is read through a hook)
        if timeout is None and stamped is not None:
            timeout = max(0.0, stamped - time.time())
            deadline = deadline_after(timeout)
        elif timeout is not None and stamped is None:
            envelope = envelope.with_deadline(envelope.ts + timeout)
        grace = LIVENESS_GRACE if require_live else math.inf
        if not consume:
            self._check_open()
            response = await self._requester.watching(envelope, timeout, grace)
        else:
            response = await self._requester.in_inbox(envelope, timeout, deadline, grace)
        if response.is_error:
            raise remote_error(response)
        return response

    def statistics(self) -> dict[str, InboxStatistics]:
        return {name: inbox.statistics() for name, inbox in self._inboxes.items()}

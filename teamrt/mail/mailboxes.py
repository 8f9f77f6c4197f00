"""Mailboxes: sending, receiving, acks, request/response and broadcast over any store.

Theory of operation. `send` encodes an envelope once (refusing NaN and Infinity, signing it when
the team has a key) and has the store append it; a broadcast is appended to every other member's
inbox and reports exactly who got it if some appends fail. A receiver in the same process is woken
directly, one in another process by the store's watcher (inotify), and a slow shared rescan covers
lost notifications. Each `Inbox` (inbox.py) belongs to one owner, holding its member's lease; it
routes responses to the `request` calls awaiting them. `request(consume=False)` watches the
sender's inbox from its end instead, for tools beside a live owner.

Everything here is store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup
from pydantic import ValidationError

from teamrt import telemetry
from teamrt.envelopes import (
    Broadcast,
    Envelope,
    ErrorBody,
    Request,
    Response,
    check_finite,
    current_trace,
    validate_body,
)
from teamrt.errors import (
    EnvelopeTooLarge,
    MailboxClosed,
    PartialBroadcast,
    RemoteError,
    RequestTimeout,
    StoreError,
    TeammateGone,
    UsageError,
)
from teamrt.mail.filestore import FileStore
from teamrt.mail.inbox import Inbox, InboxStatistics, _Reply
from teamrt.mail.log import decode_line, encode
from teamrt.mail.memory import MemoryStore
from teamrt.mail.signing import Signer, team_key
from teamrt.mail.store import DEFAULT_MAX_ENVELOPE, HEARTBEAT_INTERVAL, Durability, Store

__all__ = [
    "DEFAULT_COMMIT_DELAY",
    "DEFAULT_RESCAN_INTERVAL",
    "FileMailboxes",
    "Inbox",
    "InboxStatistics",
    "Mailboxes",
    "MemoryMailboxes",
]

DEFAULT_RESCAN_INTERVAL = 1.0
#: A request to a member that ran and is not running fails after this many seconds (the
#: member may be between two incarnations, or starting), then is checked every half second.
LIVENESS_GRACE = 2.0
_LIVENESS_EVERY = 0.5
#: How long background cursor commits (ack_nowait, routed responses) wait to batch acks.
DEFAULT_COMMIT_DELAY = 0.01
_POLL_INTERVAL = 0.05  # where the platform has no file notifications


def _batch_key(envelope: Envelope) -> str:
    return envelope.recipient  # "*" for broadcasts, which are sent one by one


class Mailboxes:
    """Every inbox of one team, over a store. Use as an async context manager.

    `FileMailboxes` and `MemoryMailboxes` are the usual ways to make one.
    """

    def __init__(
        self,
        store: Store,
        *,
        members: Iterable[str] = (),
        rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
        commit_delay: float = DEFAULT_COMMIT_DELAY,
        key: str | bytes | None = None,
    ) -> None:
        self.store = store
        secret = team_key(key)
        self._signer = None if secret is None else Signer(secret)
        self._initial_members = tuple(members)
        self._rescan_interval = rescan_interval
        self._inboxes: dict[str, Inbox] = {}
        self._task_group: TaskGroup | None = None
        self._open = False
        self._to_commit: set[Inbox] = set()
        self._commit_delay = commit_delay
        self._commit_wanted = anyio.Event()

    @property
    def team(self) -> str:
        return self.store.team

    @property
    def members(self) -> tuple[str, ...]:
        return self.store.members(refresh=True)

    async def __aenter__(self) -> Self:
        await self.store.open(self._initial_members)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        try:
            await task_group.start(self._watch)
            task_group.start_soon(self._rescan)
            task_group.start_soon(self._committer)
            task_group.start_soon(self._heartbeat)
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
                for inbox in self._inboxes.values():
                    await inbox.flush()  # acks made with ack_nowait() are not lost on close
        finally:
            for inbox in self._inboxes.values():
                inbox._close()
            self._inboxes.clear()
        try:
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()
                # only our background tasks run in it: the body's exception propagates as is
                await self._task_group.__aexit__(None, None, None)
        finally:
            self._task_group = None
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
        """The inbox of member `name`, owned by this process (one object per name)."""
        self._check_open()
        inbox = self._inboxes.get(name)
        if inbox is None:
            inbox = self._inboxes[name] = Inbox(self, name)
        return inbox

    # -- sending --

    def _encode(self, envelope: Envelope) -> bytes:
        if envelope.trace_id is None and (trace := current_trace()) is not None:
            envelope = envelope.model_copy(update={"trace_id": trace})  # the task's trace
        if telemetry.enabled() and envelope.traceparent is None:
            envelope = envelope.model_copy(update={"traceparent": telemetry.traceparent()})
        if envelope.team is not None and envelope.team != self.store.team:
            raise UsageError(f"envelope is for team {envelope.team!r}, not {self.store.team!r}")
        validate_body(envelope.type, envelope.body)
        encoded = encode(envelope)
        check_finite(envelope, encoded)
        if self._signer is not None:
            encoded = self._signer.sign(encoded, self.store.team)
        if len(encoded) > self.store.max_envelope:
            raise EnvelopeTooLarge(
                f"envelope {envelope.id} from {envelope.sender} is {len(encoded)} bytes encoded, "
                f"over the limit of {self.store.max_envelope}; nothing was sent"
            )
        return encoded

    async def send(self, envelope: Envelope) -> None:
        """Append `envelope` to its recipient's inbox (every other member's, for a broadcast).

        When this returns the envelope is in the log at the configured durability.
        """
        self._check_open()
        if telemetry.enabled():
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
                await self._send(envelope)
            return
        await self._send(envelope)

    async def _send(self, envelope: Envelope) -> None:
        encoded = self._encode(envelope)
        if isinstance(envelope, Broadcast):
            await self._broadcast(envelope, encoded)
            return
        await self.store.append(envelope.recipient, encoded)
        self._wake(envelope.recipient)

    async def _broadcast(self, envelope: Broadcast, encoded: bytes) -> None:
        """Append to every member's inbox but the sender's; if some appends fail, the others
        are still tried and `PartialBroadcast` names who got it and who did not."""
        delivered: list[str] = []
        failed: list[tuple[str, StoreError]] = []
        for member in self.store.members(refresh=True):
            if member == envelope.sender:
                continue
            try:
                await self.store.append(member, encoded)
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
            batch = [self._encode(envelope) for envelope in group]
            await self.store.append_many(recipient, batch)
            self._wake(recipient)

    def _wake(self, name: str) -> None:
        inbox = self._inboxes.get(name)
        if inbox is not None:
            inbox._signal()

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
        if not isinstance(envelope, Request):
            raise UsageError(f"request() takes a request envelope, not a {envelope.kind}")
        if timeout is None and envelope.deadline is not None:
            timeout = max(0.0, envelope.deadline - time.time())
        elif timeout is not None and envelope.deadline is None:
            envelope = envelope.model_copy(update={"deadline": envelope.ts + timeout})
        if not consume:
            response = await self._watch_for_response(envelope, timeout, require_live)
        else:
            response = await self._request(envelope, timeout, require_live)
        if response.is_error:
            try:
                body = ErrorBody.model_validate(response.body)
            except ValidationError:
                body = ErrorBody(error="error", message=repr(response.body)[:500])
            raise RemoteError(body.error, body.message, response)
        return response

    def _timed_out(self, envelope: Request, timeout: float | None) -> RequestTimeout:
        return RequestTimeout(
            f"no response from {envelope.recipient} to request {envelope.id} "
            f"(type {envelope.type!r}) within {timeout:g}s; the request stays in "
            f"{envelope.recipient}'s inbox and a late response will be delivered to "
            f"{envelope.sender}'s inbox",
            envelope,
        )

    def _check_alive(self, envelope: Request) -> None:
        if self.store.member_alive(envelope.recipient) is False:
            raise TeammateGone(
                f"{envelope.recipient} is not running (nobody holds its lease, or its holder "
                f"stopped beating); request {envelope.id} (type {envelope.type!r}) stays in "
                f"its inbox for when it starts again"
            )

    async def _watch_for_response(
        self, envelope: Request, timeout: float | None, require_live: bool = True
    ) -> Response:
        """Read the sender's inbox from its current end, without a lease, a commit or a
        quarantine entry, until the answer from the asked member arrives."""
        self._check_open()
        reader = self.store.tail_reader(envelope.sender)
        check_at = time.monotonic() + LIVENESS_GRACE if require_live else math.inf
        try:
            await self.send(envelope)
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                while True:
                    if time.monotonic() >= check_at:
                        self._check_alive(envelope)
                        check_at = time.monotonic() + _LIVENESS_EVERY
                    frames = reader.read()[1]
                    for frame in frames:
                        decoded = decode_line(frame[2]) if not frame[3] else None
                        if (
                            isinstance(decoded, Response)
                            and decoded.in_reply_to == envelope.id
                            and decoded.sender == envelope.recipient
                            and decoded.team == self.store.team
                            and (self._signer is None or self._signer.verify(frame[2], self.team))
                        ):
                            return decoded
                    if not frames:
                        await anyio.sleep(_POLL_INTERVAL / 5)
        finally:
            reader.close()
        raise self._timed_out(envelope, timeout)

    async def _request(
        self, envelope: Request, timeout: float | None, require_live: bool = True
    ) -> Response:
        inbox = self.inbox(envelope.sender)
        reply = _Reply(envelope.recipient)
        inbox._pending[envelope.id] = reply
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        check_at = time.monotonic() + LIVENESS_GRACE if require_live else math.inf
        try:
            await self.send(envelope)
            while reply.response is None:
                inbox._pump()
                if reply.response is not None:
                    break
                if not await inbox._wait(min(deadline, check_at)):
                    if time.monotonic() >= deadline:
                        break
                    try:
                        self._check_alive(envelope)
                    except TeammateGone:
                        inbox._timed_out.add(envelope.id)  # a late answer is counted as late
                        raise
                    check_at = time.monotonic() + _LIVENESS_EVERY
        finally:
            inbox._pending.pop(envelope.id, None)
        response = reply.response
        if response is None:
            inbox._timed_out.add(envelope.id)
            raise self._timed_out(envelope, timeout)
        return response

    def statistics(self) -> dict[str, InboxStatistics]:
        return {name: inbox.statistics() for name, inbox in self._inboxes.items()}

    # -- background: notifications and the safety rescan --

    async def _watch(self, *, task_status: Any) -> None:
        await self.store.watch(self._wake, task_status=task_status)

    def _commit_soon(self, inbox: Inbox) -> None:
        self._to_commit.add(inbox)
        if not self._commit_wanted.is_set():  # wake the committer once per batch, not per ack
            self._commit_wanted.set()

    async def _committer(self) -> None:
        """Commits cursors for ack_nowait() and routed responses, off the caller's path.

        A failed background commit is not lost: the acks stay pending and the next ack() or
        flush() on that inbox retries the commit and raises if it fails again.
        """
        while True:
            await self._commit_wanted.wait()
            await anyio.sleep(self._commit_delay)  # let a burst of acks share one commit
            inboxes, self._to_commit = self._to_commit, set()
            self._commit_wanted = anyio.Event()
            for inbox in inboxes:
                with contextlib.suppress(StoreError):
                    await inbox.flush()

    async def _heartbeat(self) -> None:
        """Keep the leases this process holds visibly alive to other processes."""
        while True:
            self.store.heartbeat()
            await anyio.sleep(HEARTBEAT_INTERVAL)

    async def _rescan(self) -> None:
        interval = _POLL_INTERVAL if self.store.needs_polling else self._rescan_interval
        while True:
            await anyio.sleep(interval)
            for inbox in list(self._inboxes.values()):
                if inbox._has_new():
                    inbox._signal()


class FileMailboxes(Mailboxes):
    """Mailboxes in a team directory on local disk (see mailboxes/README.md for the format).

        async with FileMailboxes("mailboxes/demo", members=["lead", "writer"]) as mail:
            await mail.send(Envelope.message("lead", "writer", "hello"))
            envelope = await mail.inbox("writer").receive(timeout=5)

    - `durability="none"` (default): an acknowledged send survives kill -9 of any process;
      `"fsync"` also survives power loss, with concurrent senders sharing fsyncs.
    - `members`: names to add to the roster (idempotent); a recipient must be a member.
    - `rescan_interval`: the safety rescan behind file notifications, in seconds.
    - `segment_bytes`: log size at which an inbox rotates into a new segment; recorded in
      team.json when the team is created, and that recorded value wins afterwards.
    - `max_envelope`: the largest encoded envelope accepted (bytes).
    - `create=False`: refuse to create a team directory that does not exist.
    - `key`: a team key (or `TEAMRT_TEAM_KEY`): envelopes are signed with it, and unsigned or
      badly signed ones are quarantined (see mailboxes/README.md, "Trust").
    - `shared_group=True` (or `TEAMRT_SHARED_GROUP=1`): accept a team directory shared by one
      group (group-writable); by default it must be this user's and writable by nobody else.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "none",
        members: Iterable[str] = (),
        rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
        segment_bytes: int | None = None,
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        create: bool = True,
        key: str | bytes | None = None,
        shared_group: bool | None = None,
    ) -> None:
        store = FileStore(
            path,
            durability=durability,
            segment_bytes=segment_bytes,
            max_envelope=max_envelope,
            create=create,
            shared_group=shared_group,
        )
        super().__init__(store, members=members, rescan_interval=rescan_interval, key=key)
        self.path = store.path


class MemoryMailboxes(Mailboxes):
    """Mailboxes in memory: the same behaviour as `FileMailboxes`, nothing on disk."""

    def __init__(
        self,
        team: str = "team",
        *,
        members: Iterable[str] = (),
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        key: str | bytes | None = None,
    ) -> None:
        super().__init__(MemoryStore(team, max_envelope=max_envelope), members=members, key=key)

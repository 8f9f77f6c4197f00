"""Mailboxes: sending, receiving, acks, request/response and broadcast over any store.

Theory of operation. `send` encodes an envelope once and has the store append it; a receiver in the
same process is woken directly, one in another process by the store's watcher (inotify), and a
slow shared rescan covers lost notifications. An `Inbox` belongs to one owner: it reads new lines
from its cursor, routes responses to the `request` calls awaiting them (dropping duplicates),
queues everything else for `receive`, and turns acks into committed cursors. Duplicates (the same
id again, after a sender retried) are dropped; corrupt lines are quarantined and skipped.

Everything here is store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio
from anyio import WouldBlock
from anyio.abc import TaskGroup
from pydantic import ValidationError

from teamrt.envelopes import (
    Broadcast,
    Envelope,
    ErrorBody,
    Request,
    Response,
    check_finite,
    validate_body,
)
from teamrt.errors import (
    EnvelopeTooLarge,
    MailboxClosed,
    PartialBroadcast,
    ReceiveTimeout,
    RemoteError,
    RequestTimeout,
    StoreError,
    UsageError,
)
from teamrt.mail.filestore import FileStore
from teamrt.mail.group import GroupCommit
from teamrt.mail.log import (
    AckTracker,
    Corrupt,
    Frame,
    decode_line,
    encode,
)
from teamrt.mail.memory import MemoryStore
from teamrt.mail.signing import Signer, team_key
from teamrt.mail.store import DEFAULT_MAX_ENVELOPE, Durability, Lease, Store

DEFAULT_RESCAN_INTERVAL = 1.0
#: How long background cursor commits (ack_nowait, routed responses) wait to batch acks.
DEFAULT_COMMIT_DELAY = 0.01
_POLL_INTERVAL = 0.05  # where the platform has no file notifications
_REMEMBERED_REQUESTS = 4096


def _batch_key(envelope: Envelope) -> str:
    return envelope.recipient  # "*" for broadcasts, which are sent one by one


class _BoundedSet:
    """Remembers the most recent `size` keys."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self._keys[key] = None
        if len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


@dataclass(frozen=True, slots=True)
class InboxStatistics:
    """A snapshot of one inbox's counters in this process."""

    name: str
    ready: int  # read and waiting for receive()
    unacked: int  # delivered (or ready) and not acked yet
    pending_requests: int  # requests from this agent awaiting their response
    quarantined: int  # corrupt lines skipped since open
    duplicates_dropped: int  # envelopes with an id already handled
    duplicate_responses: int  # second answers to an already answered request
    late_responses: int  # answers that arrived after their request timed out
    rejected_responses: int = 0  # answers to a pending request from someone it did not ask


class _Reply:
    __slots__ = ("expected", "response")

    def __init__(self, expected: str) -> None:
        self.expected = expected  # the member that was asked
        self.response: Response | None = None


class Inbox:
    """One agent's inbox, owned by this process: `receive`, `receive_nowait`, `ack`.

    Acks are per envelope and may come in any order; the committed cursor covers the handled
    prefix plus the ids acked beyond it, so after a restart exactly the unacked envelopes come
    again.
    """

    def __init__(self, mailboxes: Mailboxes, name: str) -> None:
        self.name = name
        self._mailboxes = mailboxes
        self._store = store = mailboxes.store
        # one consumer per inbox: this process's lease on the member, shared with a Team of
        # this process that already holds it (then re-taken if that Team lets it go)
        self._lease: Lease | None = None
        if not store.lease_held(name):
            self._lease = store.acquire_lease(name, self._holder())
        try:
            self._reader = store.reader(name)
            try:
                cursor = self._reader.load_cursor()
                self._reader.seek(cursor)
            except BaseException:
                self._reader.close()
                raise
        except BaseException:
            if self._lease is not None:
                self._lease.release()
            raise
        self._tracker = AckTracker(cursor)
        self._team = store.team
        self._signer = mailboxes._signer
        self._ready: deque[Envelope] = deque()  # decoded by _pump(), not yet received
        self._frames: deque[Frame] = deque()  # read, not yet decoded
        self._segment = cursor.segment  # the segment the frames come from
        self._max_line = store.max_line
        self._event: anyio.Event | None = None
        self._pending: dict[str, _Reply] = {}
        self._answered = _BoundedSet(_REMEMBERED_REQUESTS)
        self._timed_out = _BoundedSet(_REMEMBERED_REQUESTS)
        self._quarantined = self._duplicates = self._duplicate_responses = self._late = 0
        self._rejected = 0
        self._closed = False
        self._commits = GroupCommit(self._commit)
        store.watch_inbox(name)

    # -- receiving --

    def _holder(self) -> str:
        return f"pid {os.getpid()}, inbox of {self.name}"

    def _check_lease(self) -> None:
        """Re-take the member's lease if the holder this inbox shared it with let it go (a
        Team between two incarnations); reload from the committed cursor if another consumer
        committed meanwhile."""
        self._lease = self._store.acquire_lease(self.name, self._holder())
        if self._reader.changed_elsewhere():
            cursor = self._reader.load_cursor()
            self._reader.seek(cursor)
            self._tracker = AckTracker(cursor)
            self._segment = cursor.segment
            self._ready.clear()
            self._frames.clear()

    def receive_nowait(self) -> Envelope:
        """The next envelope, or raise `anyio.WouldBlock` if none is there yet."""
        if self._lease is None and not self._store.lease_held(self.name):
            self._check_lease()
        if self._ready:
            return self._ready.popleft()
        if self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        envelope = self._next()
        if envelope is None:
            raise WouldBlock
        return envelope

    async def receive(self, timeout: float | None = None) -> Envelope:
        """Wait for the next envelope; raise `ReceiveTimeout` after `timeout` seconds."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.receive_nowait()
            except WouldBlock:
                pass
            if not await self._wait(deadline):
                raise ReceiveTimeout(f"nothing arrived in {self.name}'s inbox within {timeout:g}s")

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Envelope:
        return await self.receive()

    async def ack(self, *envelopes: Envelope) -> None:
        """Mark envelopes handled; return once the cursor that says so is committed.

        Concurrent acks share one commit. The commit runs in a worker thread, so the event loop
        is not blocked by the file system (a rename over a file can cost ~0.6 ms on ext4).
        """
        if self._mark(envelopes):
            await self._commits.wait(self._commits.ticket())

    def ack_nowait(self, *envelopes: Envelope) -> None:
        """Mark envelopes handled; the cursor is committed in the background, soon.

        If the process dies before that commit, the envelopes are delivered again (delivery is
        at-least-once either way). `flush()` waits for the commit.
        """
        if self._mark(envelopes):
            self._commits.ticket()
            self._mailboxes._commit_soon(self)

    def release(self, *envelopes: Envelope) -> None:
        """Hand back envelopes that were received but not acked: the next `receive` calls get
        them again, in the order given, before anything newer.

        This is redelivery within one process (a restart in another process gets every
        unacked envelope again from the committed cursor anyway). Releasing an acked envelope
        is a usage error: it would be handled twice.
        """
        if self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        for envelope in envelopes:
            if not self._tracker.is_outstanding(envelope.id):
                raise UsageError(
                    f"envelope {envelope.id} is not received and unacked: it cannot be released"
                )
        self._ready.extendleft(reversed(envelopes))
        if envelopes:
            self._signal()

    async def flush(self) -> None:
        """Wait until every ack so far is in the committed cursor."""
        await self._commits.wait(self._commits.requested)

    def _mark(self, envelopes: tuple[Envelope, ...]) -> bool:
        if self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        changed = False
        for envelope in envelopes:
            changed = self._tracker.ack(envelope.id) or changed
        return changed

    def statistics(self) -> InboxStatistics:
        return InboxStatistics(
            self.name,
            len(self._ready) + len(self._frames),
            self._tracker.unacked,
            len(self._pending),
            self._quarantined,
            self._duplicates,
            self._duplicate_responses,
            self._late,
            self._rejected,
        )

    # -- internals shared with Mailboxes --

    async def _commit(self) -> None:
        cursor = self._tracker.cursor()
        if self._mailboxes.store.blocking_commits:
            await anyio.to_thread.run_sync(self._reader.commit, cursor)
        else:
            self._reader.commit(cursor)

    def _signal(self) -> None:
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    def _has_new(self) -> bool:
        return self._event is not None and self._reader.has_new()

    async def _wait(self, deadline: float) -> bool:
        """Wait for a wake-up; False once `deadline` (monotonic) has passed."""
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        if self._frames or self._reader.has_new():  # came before the event existed
            return True
        if deadline == math.inf:
            await event.wait()
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        with anyio.move_on_after(remaining):
            await event.wait()
            return True
        return False

    def _next(self) -> Envelope | None:
        """Decode lines until one is for `receive`; None when nothing more is there.

        Lines are decoded one at a time, as they are handed out, so a large backlog never turns
        into a large batch of live envelopes (which the garbage collector would keep scanning).
        This is the receive hot path: it avoids intermediate objects for good lines.
        """
        frames, tracker = self._frames, self._tracker
        while True:
            if not frames:
                segment, new = self._reader.read()
                if not new:
                    return None
                self._segment = segment
                frames.extend(new)
            frame = frames.popleft()
            _, end, raw, too_long = frame
            decoded = decode_line(raw) if not too_long else None
            if not isinstance(decoded, Envelope):
                reason = decoded or f"line longer than {self._max_line} bytes"
                self._quarantine(Corrupt(frame[0], end, reason, raw))
                continue
            if (
                decoded.team != self._team
                or (decoded.recipient != self.name and decoded.recipient != "*")
                or (self._signer is not None and not self._signer.verify(raw, self._team))
            ):
                self._quarantine(Corrupt(frame[0], end, self._misfiled(decoded), raw))
                continue
            if not tracker.deliver(decoded.id, self._segment, end, decoded.seq):
                self._duplicates += 1
                continue
            if not isinstance(decoded, Response) or self._route(decoded):
                return decoded

    def _misfiled(self, envelope: Envelope) -> str:
        if envelope.team != self._team:
            return f"wrong team: {envelope.team!r} in the inbox of {self.name} of {self._team!r}"
        if envelope.recipient != self.name and envelope.recipient != "*":
            return f"wrong recipient: {envelope.recipient!r} in the inbox of {self.name}"
        return "bad signature"

    def _quarantine(self, item: Corrupt) -> None:
        self._reader.quarantine(self._segment, item)
        self._tracker.skipped((self._segment, item.end))
        self._quarantined += 1

    def _route(self, response: Response) -> bool:
        """Hand a response to the request awaiting it; True if it is for `receive` instead."""
        request_id = response.in_reply_to
        reply = self._pending.get(request_id)
        if reply is not None and response.sender != reply.expected:
            # not from the member that was asked: flagged and dropped; the real answer wins
            self._tracker.ack(response.id)
            self._rejected += 1
            self._commits.ticket()
            self._mailboxes._commit_soon(self)
            return False
        if reply is not None:
            del self._pending[request_id]
            reply.response = response
            self._answered.add(request_id)
            self._tracker.ack(response.id)  # handled by request(): commit in the background
            self._commits.ticket()
            self._mailboxes._commit_soon(self)
            self._signal()  # requesters waiting on this inbox check their replies
            return False
        if request_id in self._answered:
            self._tracker.ack(response.id)
            self._duplicate_responses += 1
            return False
        if request_id in self._timed_out:
            self._late += 1
        return True

    def _pump(self) -> None:
        """Read everything there is, so that responses reach their requests; envelopes for
        `receive` wait in order in the ready queue."""
        if self._lease is None and not self._store.lease_held(self.name):
            self._check_lease()
        queued = False
        while (envelope := self._next()) is not None:
            self._ready.append(envelope)
            queued = True
        if queued:
            self._signal()  # a receiver waiting on this inbox has something now

    def _close(self) -> None:
        self._closed = True
        self._pending.clear()
        self._reader.close()
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        self._signal()


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
        self, envelope: Request, *, timeout: float | None = None, consume: bool = True
    ) -> Response:
        """Send a request and wait for its response, matched by id and accepted only from the
        member that was asked (answers from anyone else are counted as rejected and dropped).

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
            response = await self._watch_for_response(envelope, timeout)
        else:
            response = await self._request(envelope, timeout)
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

    async def _watch_for_response(self, envelope: Request, timeout: float | None) -> Response:
        """Read the sender's inbox from its current end, without a lease, a commit or a
        quarantine entry, until the answer from the asked member arrives."""
        self._check_open()
        reader = self.store.tail_reader(envelope.sender)
        try:
            await self.send(envelope)
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                while True:
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

    async def _request(self, envelope: Request, timeout: float | None) -> Response:
        inbox = self.inbox(envelope.sender)
        reply = _Reply(envelope.recipient)
        inbox._pending[envelope.id] = reply
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        try:
            await self.send(envelope)
            while reply.response is None:
                inbox._pump()
                if reply.response is not None or not await inbox._wait(deadline):
                    break
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

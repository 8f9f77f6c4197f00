"""An inbox owned by this process: reading from the cursor, dedup, acks, routing responses.

Theory of operation. An `Inbox` belongs to one owner, the process that holds its member's lease
(taken when the inbox opens, or shared with a Team of the same mailboxes that already holds it,
and taken back if that Team lets it go). It decodes the records its store's reader hands out one
at a time as they are received; quarantines what does not decode, what names another team or
recipient, and (in a signed team) what is not signed with the team key; drops ids it has handled;
routes a response to the `request()` awaiting it only if it comes from the member that was asked;
queues everything else for `receive`; and turns acks into committed cursors (group commit), each
commit first recording the records it quarantined. A lease the store reports lost (a network
store whose lease expired) closes the inbox to this process: `LeaseLost`.

Reads are fenced: an envelope is handed out (`receive`, the batches, `drain`) only while the
lease is known held (`LeaseRecord.known_held`, a clock comparison), with no await between that
check and the hand-out; otherwise `receive` first asks the store (`Store.confirm_lease`), and
the synchronous calls hand out nothing. So a holder paused past its lease's time limit, whose
buffers filled meanwhile, hands out nothing once it resumes: it finds the lease lost. Leases
that cannot be lost while their process lives (files, memory) skip the check.

The inbox drives owners of their own: its lease and the read fence (fence.py), the tasks
waiting on it (waiting.py, which `Inbox` is), the answers its requests wait for (replies.py)
and the records it skips (quarantine.py).

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Self, TypeVar

from anyio import WouldBlock

from teamrt.codec import EnvelopeFields, decode_fields
from teamrt.envelopes import Envelope, Response
from teamrt.errors import MailboxClosed, ReceiveTimeout, UsageError
from teamrt.mail.claims import CLAIM, redeem
from teamrt.mail.fence import InboxLease
from teamrt.mail.group import GroupCommit
from teamrt.mail.log import AckTracker, Corrupt, Cursor, Entry
from teamrt.mail.quarantine import Quarantine
from teamrt.mail.replies import PendingReply as PendingReply  # its old place
from teamrt.mail.replies import Replies, Unmatched
from teamrt.mail.signing import Signer
from teamrt.mail.store import InboxReader, Lease, Store, run_local
from teamrt.mail.waiting import Waitable
from teamrt.mail.waiting import _wake_waiter as _wake_waiter  # its old place

T = TypeVar("T")
#: How an inbox makes a store call that is safe to repeat: `(call, what)` with an outage
#: waited out (`Mailboxes.riding_out`).
RideOut = Callable[[Callable[[], Awaitable[T]], str], Awaitable[T]]


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


def deadline_after(timeout: float | None) -> float:
    """The `time.monotonic()` deadline `timeout` seconds from now (infinite for None).

    Raises `UsageError` for NaN (a NaN deadline on the event loop's timer heap compares false
    with every other timer, so it fires at no particular time and can hold other tasks' timers
    up behind it) and for a number too large for a float."""
    if timeout is None:
        return math.inf
    try:
        deadline = time.monotonic() + timeout
    except OverflowError:
        raise UsageError(f"timeout {timeout} is too large: give seconds, or None") from None
    if deadline != deadline:  # NaN
        raise UsageError("timeout must be a number of seconds or None, not NaN")
    return deadline


class Inbox(Waitable):
    """One agent's inbox, owned by this process: `receive`, `receive_nowait`, `ack`.

    Acks are per envelope and may come in any order; the committed cursor covers the handled
    prefix plus the ids acked beyond it, so after a restart exactly the unacked envelopes come
    again.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        commit_soon: Callable[[], None],
        riding_out: RideOut[None],
        signer: Signer | None = None,
    ) -> None:
        """Not open yet: `Mailboxes.inbox()` / `open_inbox()` make and open it.

        `commit_soon`: asks for this inbox's cursor to be committed in the background soon
        (`flush()` commits it); `riding_out`: makes a repeatable store call with an outage
        waited out; `signer`: the team key's, in a signed team."""
        super().__init__()
        self.name = name
        self._commit_soon = commit_soon
        self._riding_out = riding_out
        self._store = store
        # one consumer per inbox: this process's lease on the member, shared with a Team of
        # this process that already holds it (then re-taken if that Team lets it go)
        self._fence = InboxLease(store, name)
        self._reader: InboxReader | None = None
        self._tracker = AckTracker()
        self._team = store.team
        self._signer = signer
        # decoded by _pump() (or released), not yet received
        self._ready: deque[EnvelopeFields | Envelope] = deque()
        self._entries: deque[Entry] = deque()  # read, not yet decoded
        self._one: list[EnvelopeFields] = []  # what _take() decodes into, one at a time
        self._released: set[str] = set()  # ids handed back by release() and not acked since
        self._rejects = Quarantine(name, self._team)  # skipped, recorded before the next commit
        self._max_line = store.max_line
        self._replies = Replies()  # the requests awaiting an answer, and those done lately
        # responses handed to their request() and not acked yet, as (response id, request id):
        # acked after the requester has its answer (`_settle`), off the round trip's path
        self._routed: list[tuple[str, str]] = []
        self._duplicates = 0
        self._closed = False
        self._commits = GroupCommit(self._commit)
        # leases that cannot be lost while this process lives need no fence on reads
        self._unfenced = store.lease_validity == math.inf

    async def open(self) -> None:
        """Take the member's lease (unless this process holds it already) and start reading
        from the committed cursor. `Mailboxes` opens the inboxes it makes."""
        store, name = self._store, self.name
        await self._fence.take()
        try:
            reader = store.reader(name)
            try:
                cursor = await reader.start()
            except BaseException:
                reader.close()
                raise
        except BaseException:
            await self._fence.release()
            raise
        self._reader = reader
        self._tracker = AckTracker(cursor)
        store.watch_inbox(name)

    @property
    def lease(self) -> Lease | None:
        """The member's lease as this inbox took it; None while it shares the one its store
        holds for another holder in this process (a Team), and once closed."""
        return self._fence.lease

    @property
    def _lease(self) -> Lease | None:
        """`lease`, under the name it had when the inbox kept it itself."""
        return self._fence.lease

    @property
    def _pending(self) -> dict[str, PendingReply]:
        """The replies awaited by this inbox's requests, by request id."""
        return self._replies.pending

    # -- receiving --

    @property
    def _reading(self) -> InboxReader:
        reader = self._reader
        if reader is None:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        return reader

    async def _check_lease(self) -> None:
        """Re-take the member's lease if the holder this inbox shared it with let it go (a
        Team between two incarnations); reload from the committed cursor if another consumer
        committed meanwhile."""
        await self._fence.take_back()
        if await self._reading.changed_elsewhere():
            self._restart(await self._reading.start())

    def _retake_lease(self) -> None:
        """`_check_lease` from synchronous code: local stores only (a network store's inbox
        takes it back in `receive`)."""
        if self._store.capabilities.opens_locally:
            run_local(self._check_lease(), f"taking {self.name}'s lease back")
        else:
            raise MailboxClosed(
                f"{self.name}'s inbox lost its lease holder in this process: "
                "use `await inbox.receive()`, which takes it back"
            )

    def _fenced(self) -> bool:
        """The read fence without asking the store: True if what is handed out now is handed
        out while the member's lease is known held, or needs no fence (a lease that cannot be
        lost while this process lives, a closed inbox, or none to check: the lease logic
        takes one first). False: ask the store (`InboxLease.confirm`) before handing
        anything out."""
        return self._unfenced or self._closed or self._fence.known_held()

    def _restart(self, cursor: Cursor) -> None:
        self._poked = True
        self._tracker = AckTracker(cursor)
        self._ready.clear()
        self._released.clear()
        self._entries.clear()
        self._rejects.clear()
        for _, request_id in self._routed:  # answered; the new cursor decides what is acked
            self._replies.answered.add(request_id)
        self._routed.clear()

    def receive_nowait(self) -> Envelope:
        """The next envelope, or raise `anyio.WouldBlock` if none is there yet."""
        if not self._fence.held():  # raises LeaseLost if the lease expired
            self._retake_lease()
        if not self._fenced():
            raise WouldBlock  # `receive` asks the store whether the lease is still held
        return self._take()

    def _take(self) -> Envelope:
        """The next envelope once the lease and the fence are checked (`WouldBlock` if none
        is there yet): what `receive_nowait` and `receive` hand out."""
        if self._ready:
            item = self._ready.popleft()
            return item.to_envelope() if type(item) is EnvelopeFields else item  # type: ignore[return-value]
        if self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        one = self._one
        self._fill(one, 1)
        if not one:
            raise WouldBlock
        return one.pop().to_envelope()

    async def receive(self, timeout: float | None = None) -> Envelope:
        """Wait for the next envelope; raise `ReceiveTimeout` after `timeout` seconds."""
        deadline = math.inf if timeout is None else deadline_after(timeout)
        while True:  # `receive_nowait`, with the lease and the fence asked of the store
            if not self._closed and not self._fence.held():  # LeaseLost if the lease expired
                await self._check_lease()
            if not self._fenced() and not await self._fence.confirm(deadline):
                continue  # no lease to check any more: the lease logic above takes it again
            if self._unread():
                try:
                    return self._take()
                except WouldBlock:
                    pass
            if not await self._wait(deadline, read=True):
                raise ReceiveTimeout(f"nothing arrived in {self.name}'s inbox within {timeout:g}s")

    def receive_batch_nowait(self, max: int = 64) -> list[Envelope]:
        """Up to `max` envelopes that are here now, in order; [] if none (for consumers that
        drain a backlog: one call instead of one per envelope). Keep batches modest: every
        envelope of a batch is alive until it is handled, and a thousand live envelopes make
        the garbage collector's passes cost more than the calls saved (measured: batches of
        16-64 drain as fast as one by one or a little faster, 1,000 a third slower). For
        throughput, `drain_nowait` hands out the same envelopes without a model each."""
        return [
            item.to_envelope() if type(item) is EnvelopeFields else item  # type: ignore[misc]
            for item in self._batch(max)
        ]

    async def receive_batch(
        self,
        max: int = 64,
        timeout: float | None = None,
    ) -> list[Envelope]:
        """Wait for at least one envelope (`ReceiveTimeout` after `timeout` seconds), then
        return it with up to `max - 1` more that are here, in order. Each is acked as usual."""
        if max < 1:
            raise UsageError(f"max must be at least 1, not {max}")
        first = await self.receive(timeout)
        return [first, *self.receive_batch_nowait(max - 1)] if max > 1 else [first]

    def drain_nowait(self, max: int = 256) -> list[EnvelopeFields]:
        """Up to `max` envelopes that are here now, in order, as `EnvelopeFields`: the bulk
        read path, for consumers that want throughput (no pydantic model is built; each line
        was checked by the same rules, and `.to_envelope()` builds the model when one is
        wanted). [] if none. They are acked, released and counted like received envelopes;
        responses to this process's own `request()` calls still go to those calls.

        Records are not tracked by the garbage collector, so large batches cost nothing
        extra (unlike `receive_batch_nowait`)."""
        return [
            item if type(item) is EnvelopeFields else EnvelopeFields.of(item)  # type: ignore[arg-type]
            for item in self._batch(max)
        ]

    async def drain(self, max: int = 256, timeout: float | None = None) -> list[EnvelopeFields]:
        """Wait for at least one envelope (`ReceiveTimeout` after `timeout` seconds), then
        return up to `max` that are here, as `drain_nowait` does."""
        if max < 1:
            raise UsageError(f"max must be at least 1, not {max}")
        deadline = deadline_after(timeout)
        while True:
            if not self._closed and not self._fence.held():
                await self._check_lease()
            if not self._fenced() and not await self._fence.confirm(deadline):
                continue
            batch = self.drain_nowait(max) if self._unread() else []
            if batch:
                return batch
            if not await self._wait(deadline, read=True):
                raise ReceiveTimeout(f"nothing arrived in {self.name}'s inbox within {timeout:g}s")

    def _batch(self, max: int) -> list[EnvelopeFields | Envelope]:
        if max < 1:
            raise UsageError(f"max must be at least 1, not {max}")
        if not self._fence.held():  # raises LeaseLost if the lease expired
            self._retake_lease()
        if not self._fenced():
            return []  # `receive` and `drain` ask the store whether the lease is still held
        batch: list[EnvelopeFields | Envelope] = []
        ready, append = self._ready, batch.append
        while ready and len(batch) < max:
            append(ready.popleft())
        if not batch and self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        if self._closed:
            return batch
        if len(batch) < max:
            self._fill(batch, max)  # type: ignore[arg-type]
        return batch

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Envelope:
        return await self.receive()

    async def ack(self, *envelopes: Envelope | EnvelopeFields) -> None:
        """Mark envelopes handled; return once the cursor that says so is committed.

        Concurrent acks share one commit. The commit runs in a worker thread, so the event loop
        is not blocked by the file system (a rename over a file can cost ~0.6 ms on ext4).
        """
        if self._mark(envelopes):
            await self._commits.wait(self._commits.ticket())

    def ack_nowait(self, *envelopes: Envelope | EnvelopeFields) -> None:
        """Mark envelopes handled; the cursor is committed in the background, soon.

        If the process dies before that commit, the envelopes are delivered again (delivery is
        at-least-once either way). `flush()` waits for the commit.
        """
        if self._mark(envelopes):
            self._commits.ticket()
            self._commit_soon()

    def release(self, *envelopes: Envelope | EnvelopeFields) -> None:
        """Hand back envelopes that were received but not acked: the next `receive` calls get
        them again, in the order given, before anything newer.

        This is redelivery within one process (a restart in another process gets every
        unacked envelope again from the committed cursor anyway). Releasing an acked envelope,
        or one already released and not received again, is a usage error: it would be handled
        twice. An envelope acked while it waits to come again is not handed out.
        """
        if self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        if self._routed:  # answers handed to their request() are handled: not releasable
            self._settle()
        waiting = {item.id for item in self._ready} if self._released else set()
        for envelope in envelopes:
            if not self._tracker.is_outstanding(envelope.id):
                raise UsageError(
                    f"envelope {envelope.id} is not received and unacked: it cannot be released"
                )
            if envelope.id in waiting:
                raise UsageError(
                    f"envelope {envelope.id} is released already and waits to be received "
                    "again: it would be handed out twice"
                )
            waiting.add(envelope.id)
        self._ready.extendleft(reversed(envelopes))
        self._released.update(envelope.id for envelope in envelopes)
        if envelopes:
            self.wake()

    async def flush(self) -> None:
        """Wait until every ack so far is in the committed cursor."""
        if self._routed:
            self._settle()
        await self._commits.wait(self._commits.requested)

    def _mark(self, envelopes: tuple[Envelope | EnvelopeFields, ...]) -> bool:
        if self._closed:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        changed = False
        for envelope in envelopes:
            changed = self._tracker.ack(envelope.id) or changed
        if self._released:  # an envelope acked while released is not handed out again
            acked = {envelope.id for envelope in envelopes} & self._released
            if acked:
                self._released -= acked
                kept = [item for item in self._ready if item.id not in acked]
                self._ready.clear()
                self._ready.extend(kept)
        return changed

    def statistics(self) -> InboxStatistics:
        if self._routed:
            self._settle()
        return InboxStatistics(
            self.name,
            len(self._ready) + len(self._entries),
            self._tracker.unacked,
            len(self._replies.pending),
            self._rejects.count,
            self._duplicates,
            self._replies.duplicates,
            self._replies.late,
            self._replies.rejected,
        )

    # -- internals shared with Mailboxes --

    async def _commit(self) -> None:
        if self._routed:
            self._settle()
        reader = self._reading
        await self._rejects.record(reader, self._riding_out)  # before the cursor passes them
        # the same cursor again is harmless, and a lost lease (LeaseLost) is final at once
        cursor = self._tracker.cursor()
        await self._riding_out(lambda: reader.commit(cursor), f"commit {self.name}'s cursor")

    def _unread(self) -> bool:
        """False when a read now would find nothing: the last read took all there was (the
        reader says it caught up) and nothing has signalled since. A write after that read
        signals (the store's notification, or `_wake` for a send from this process)."""
        return bool(
            self._ready
            or self._entries
            or self._poked
            or self._closed
            or not self._reading.caught_up
        )

    async def rescan(self, *, fetch: bool) -> None:
        """The safety net behind lost notifications: wake the tasks waiting on this inbox if
        its store has records they were not told of. `fetch`: also ask the store for records
        it has not pushed yet (a network store's watcher may have missed some); its
        `StoreError`s go to the caller."""
        reader = self._reader
        if not self._waiters or reader is None:
            return
        if reader.has_new():
            self.wake()
        elif fetch and not self._closed:
            entries = await reader.fetch()
            self._entries.extend(entries)
            if entries:
                self.wake()

    async def _wait(self, deadline: float, *, read: bool = False) -> bool:
        """Wait for a wake-up; False once `deadline` (monotonic) has passed.

        `read=True`: the caller has just read to the end of the inbox, in this same step (no
        await since), so what came before the wait need not be looked for again."""
        if self._routed:  # the wait runs while the other side works: off the round trip's path
            self._settle()
        if not read and (self._entries or self._reading.has_new()):  # came before this wait
            return True
        return await self._park(deadline)

    def _fill(
        self, out: list[EnvelopeFields] | deque[EnvelopeFields | Envelope], max: float
    ) -> None:
        """Decode records into `out` until it holds `max` envelopes for `receive` or nothing
        more is there.

        Records are decoded one at a time, as they are handed out, into `EnvelopeFields` (the
        model is built by whoever wants one). This is the receive hot path: it avoids
        intermediate objects for good records and keeps what it uses in locals.
        """
        entries, reader = self._entries, self._reader
        if reader is None:
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        deliver, append = self._tracker.deliver, out.append
        team, name, signer = self._team, self.name, self._signer
        read = False
        while len(out) < max:
            if not entries:
                if read and reader.caught_up:  # it read all there was a moment ago
                    return
                self._poked = False  # what signalled before this read, the read finds
                new = reader.read_nowait()
                if not new:
                    return
                read = True
                if len(new) == 1:  # the usual wake-up: one record, handled without the queue
                    entry = new[0]
                else:
                    entries.extend(new)
                    entry = entries.popleft()
            else:
                entry = entries.popleft()
            raw = entry.raw
            decoded = decode_fields(raw) if not entry.too_long else None
            if type(decoded) is not EnvelopeFields:
                reason = decoded or f"line longer than {self._max_line} bytes"
                self._quarantine(Corrupt(entry.at, entry.end, reason, raw))  # type: ignore[arg-type]
                continue
            if (
                decoded.team != team
                or (decoded.recipient != name and decoded.recipient != "*")
                or (signer is not None and not signer.verify(raw, team))
            ):
                self._quarantine(Corrupt(entry.at, entry.end, self._rejects.misfiled(decoded), raw))
                continue
            body = decoded.body
            if body.__class__ is dict and CLAIM in body:  # a claim check (claims.py)
                decoded = self._redeem(entry, decoded)
                if decoded is None:
                    continue
            if not deliver(decoded.id, entry.segment, entry.stop, decoded.seq):
                self._duplicates += 1
                continue
            if decoded.kind != "response" or self._route(decoded):
                append(decoded)

    def _redeem(self, entry: Entry, fields: EnvelopeFields) -> EnvelopeFields | None:
        """`fields` with its claim check's body, or None once quarantined (a missing or
        corrupt blob). If the store cannot be read, the record waits for the next read."""
        try:
            redeemed = redeem(self._store, fields)
        except BaseException:
            self._entries.appendleft(entry)
            raise
        if type(redeemed) is str:
            self._quarantine(Corrupt(entry.at, entry.end, redeemed, entry.raw))
            return None
        return redeemed  # type: ignore[return-value]

    def _quarantine(self, item: Corrupt) -> None:
        """Skip `item` (the cursor passes it) and quarantine it."""
        self._rejects.add(item)
        self._tracker.skipped(item.end)
        self._commits.ticket()  # recorded, and passed by the cursor, soon
        self._commit_soon()

    def _route(self, response: EnvelopeFields) -> bool:
        """Hand a response to the request awaiting it; True if it is for `receive` instead."""
        request_id: str = response.in_reply_to  # type: ignore[assignment]  # checked on decode
        pending = self._replies.pending
        reply = pending.get(request_id)
        if reply is not None and response.sender == reply.expected:
            del pending[request_id]
            reply.response = response.to_envelope()  # type: ignore[assignment]
            # acked by `_settle`, after the requester has its answer; the commit is asked for
            # now, so the cursor passes it soon even if nothing waits on this inbox again
            self._routed.append((response.id, request_id))
            self._commit_soon()
            if self._waiters:  # requesters waiting on this inbox check their replies
                self.wake()
            return False
        if reply is not None:  # not from the member that was asked: the real answer wins
            verdict = self._replies.reject()
        else:
            if self._routed:
                self._settle()  # a second answer to a request just answered is seen as one
            verdict = self._replies.unmatched(request_id, response.sender)
        if verdict is Unmatched.RECEIVE:
            return True
        self._tracker.ack(response.id)
        self._commits.ticket()  # committed soon: the next process must not receive it
        self._commit_soon()
        return False

    def _settle(self) -> None:
        """Ack the responses handed to their requests (`_route`), and remember what they
        answered: at the next wait, the next commit, or a response that is no request's."""
        routed, self._routed = self._routed, []
        ack, answered = self._tracker.ack, self._replies.answered
        for response_id, request_id in routed:
            ack(response_id)
            answered.add(request_id)
        self._commits.ticket()

    # -- request/response matching, for `Mailboxes.request` --

    def expect_reply(self, request_id: str, asked: str) -> PendingReply:
        """Route the answer to `request_id` from `asked` (the member the request went to) to
        the returned `PendingReply` instead of to `receive`; answers from anyone else are
        rejected. Call before the request is sent; `give_up_reply` once done with it."""
        return self._replies.expect(request_id, asked)

    async def wait_for_reply(self, reply: PendingReply, deadline: float) -> Response | None:
        """Read this inbox until `reply` has its response, and return it; None once
        `deadline` (monotonic) has passed. Envelopes read meanwhile wait in order for
        `receive`, and other requests' answers reach them."""
        read = False  # after _pump(), which reads to the end, _wait need not look again
        while reply.response is None:
            if not await self._wait(deadline, read=read):
                return reply.response
            self._pump()
            read = True
        return reply.response

    def give_up_reply(self, reply: PendingReply, *, timed_out: bool = False) -> None:
        """Stop routing the answer to `reply`'s request (nothing to do if it came). With
        `timed_out` (the request ran out of time, or its member is gone), an answer that
        still comes from the member asked is received and counted late, and one from anyone
        else is rejected; without, a later answer is received like any envelope."""
        self._replies.give_up(reply, timed_out=timed_out)

    def _pump(self) -> None:
        """Read everything there is, so that responses reach their requests; envelopes for
        `receive` wait in order in the ready queue."""
        if self._closed:  # (its lease is released: not to be taken again)
            raise MailboxClosed(f"{self.name}'s inbox is closed")
        if not self._fence.held():
            self._retake_lease()
        ready = self._ready
        queued = len(ready)
        self._fill(ready, math.inf)
        if len(ready) > queued:
            self.wake()  # a receiver waiting on this inbox has something now

    async def close(self) -> None:
        """Close the inbox to this process: wake its waiters (they raise `MailboxClosed`),
        stop reading, and release its lease. Acks not committed yet stay uncommitted:
        `Mailboxes` flushes each inbox before it closes it."""
        self._closed = True
        self._replies.pending.clear()
        self._stop_timer()
        if self._reader is not None:
            self._reader.close()
        await self._fence.release()
        self.wake()

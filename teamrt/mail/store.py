"""The store interface: the one seam between the mailbox logic and where inboxes live.

A store appends encoded envelopes to inboxes (assigning `seq`), hands an inbox's owner a reader
over its records, keeps the roster, leases, the budget ledger and task records (idempotent
asks), and tells the mailboxes when another process wrote. Everything above it (acks, dedup,
request/response, wake-ups within a process) is store-agnostic, and every store passes the
same conformance suite (`teamrt.testing.conformance`), with the parts that only some stores can
promise gated by their `Capabilities`.

The seam is shaped for a store that may be slow or unreachable as well as for local files:

- positions are opaque: a `Position` is an ordered pair that only its store interprets (a segment
  and byte offset for files, a stream position for Redis); the layers above compare and persist
  them, nothing more;
- records are whole: a reader hands out `Entry` objects (one stamped line each); framing, torn
  tails and the cursor's on-disk encoding stay inside the store;
- reading has two halves: `read_nowait()` returns what has already arrived and never waits or
  calls a server, `fetch()` may ask the store's server; commits, quarantine, leases and the
  ledger are async;
- an append fails cleanly (`StoreError`: nothing was written), with two errors a network store
  adds: `StoreUnavailable` (the store was not reached: not sent) and `OutcomeUnknown` (the request
  went out and no answer came: maybe sent). `Mailboxes.send` retries the second with the same
  envelope, which the receiver's dedup by id makes safe;
- a lease carries a fencing token and a `lost` event: a store whose leases expire sets it when
  another holder took over, commits with a stale token are refused (`LeaseLost`), and a `Team`
  stops that incarnation. Reads are fenced too: an inbox hands out an envelope only while its
  lease is known held (`LeaseRecord.known_held`: renewed or checked with the store within the
  store's `lease_validity`), and otherwise asks the store first (`Store.confirm_lease`), so a
  paused holder that resumes after losing its lease hands out nothing;
- tools (`inspect`, `replay`, `export`, the CLI) read through `TeamView`, a read-only synchronous
  view of a team; no code above the stores opens an inbox file or names a concrete store.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import anyio
from anyio.abc import TaskStatus

from teamrt.errors import LeaseLost, OutcomeUnknown, StoreUnavailable
from teamrt.mail.log import DEFAULT_MAX_LINE, Corrupt, Cursor, Entry, Position

log = logging.getLogger("teamrt.mail")

Durability = Literal["none", "fsync"]
T = TypeVar("T")

#: How often a process renews the leases it holds (and refreshes their heartbeat), and after how
#: long without one a holder counts as gone (a stopped or hung process).
HEARTBEAT_INTERVAL = 1.0
LEASE_STALE_AFTER = 5.0

#: Encoded envelopes larger than this are refused before anything is written.
DEFAULT_MAX_ENVELOPE = 1 << 20
#: A payload over `max_envelope` travels as a claim check (teamrt/mail/claims.py) up to this.
DEFAULT_MAX_BLOB = 64 << 20


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store can promise beyond the interface; the conformance suite runs the tests of
    a capability only on the stores that claim it."""

    #: Other processes (and, for a network store, other hosts) can open the same team.
    shared: bool = False
    #: Inboxes open without waiting on a server, so `Mailboxes.inbox(name)` works directly;
    #: otherwise `await mail.open_inbox(name)` opens one.
    opens_locally: bool = True
    #: A lease is released the moment its holder's process dies (an flock).
    leases_die_with_process: bool = False
    #: Leases expire unless renewed; a holder that stopped renewing loses its lease to the next
    #: claimant and is told so (`Lease.lost`, `LeaseLost` on commit).
    leases_expire: bool = False
    #: A broadcast reaches every other member or none (`append_broadcast`).
    atomic_broadcast: bool = False
    #: The store is reached over a network: appends can fail as `StoreUnavailable` or
    #: `OutcomeUnknown`.
    network: bool = False


class InboxReader(ABC):
    """The owner's view of one inbox: records from the committed cursor on, and commits.

    Entries come out in the inbox's order, each exactly once across `read_nowait` and `fetch`,
    until the reader is started again. A network store hands `read_nowait` what had arrived when
    the reader started and what its own store object appended since (so that a receive right
    after a send in one process finds it), besides what its watcher brought.
    """

    @abstractmethod
    async def start(self) -> Cursor:
        """Load the committed cursor (the start of the inbox if none was committed) and read
        from there; called again after another consumer committed (`changed_elsewhere`)."""

    #: True when the last `read_nowait` returned everything that was there when it read: a
    #: reader that read again at once would find nothing (unless a writer was quick), and may
    #: skip it. False (the default): read again.
    caught_up: bool = False

    @abstractmethod
    def read_nowait(self) -> list[Entry]:
        """Entries that have arrived since the last read, without waiting and without asking a
        server; [] when there is none. Never raises on bad data (a bad record is an `Entry`
        that fails to decode, or one marked `too_long`)."""

    async def fetch(self) -> list[Entry]:
        """Like `read_nowait`, but a network store may ask its server for what it has not
        pushed yet (the periodic rescan calls this)."""
        return self.read_nowait()

    @abstractmethod
    def has_new(self) -> bool:
        """True if `read_nowait` would return something (cheap, never raises). A receiver that
        waits checks it before sleeping, so it must not be true when `read_nowait` would return
        nothing (it would spin); what only `fetch` can find, the periodic rescan finds."""

    @abstractmethod
    async def commit(self, cursor: Cursor) -> None:
        """Make `cursor` the committed read position, atomically. A store whose leases expire
        refuses the commit of a holder that lost its lease (`LeaseLost`)."""

    @abstractmethod
    async def quarantine(self, item: Corrupt) -> None:
        """Record a record that could not be delivered (once, even if it is read again)."""

    async def changed_elsewhere(self) -> bool:
        """True if another consumer committed this inbox's cursor since this reader last
        started or committed."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Release what the reader holds locally (no I/O that can wait)."""


class TeamView(ABC):
    """A read-only, synchronous view of a team for tools (`inspect`, `replay`, `export`, the
    CLI): it takes no lease, writes nothing and may run while the team runs."""

    team: str
    locator: str  # what opened it: a directory, or a store URL
    #: The team's directory on this machine, where its agents' journals live (None for a team
    #: in a network store: each host keeps its agents' files where it runs them).
    directory: Path | None = None

    @abstractmethod
    def members(self) -> tuple[str, ...]: ...

    def created_at(self) -> float | None:
        return None

    def signing(self) -> str | None:
        """What the team records of its key (see `Store.signing`)."""
        return None

    @abstractmethod
    def scan(self, name: str, after: Position | None = None) -> Iterator[Entry]:
        """Every complete record of `name`'s inbox in order (from the start, or after the
        position `after`), streamed: memory stays bounded whatever the inbox's size."""

    @abstractmethod
    def end(self, name: str) -> Position:
        """The position after the last complete record now."""

    @abstractmethod
    def committed(self, name: str) -> Cursor:
        """The owner's committed cursor (the start if none)."""

    @abstractmethod
    def quarantined(self, name: str) -> Iterator[dict[str, Any]]:
        """The quarantine records of `name`'s inbox, oldest first, each a dict with `at` and
        `end` (the record's positions, as two-item lists), `reason`, `raw` (the record as
        text, undecodable bytes escaped) and `ts` (when it was quarantined)."""

    @abstractmethod
    def holder(self, name: str) -> str | None:
        """Who runs member `name` now (the lease holder's description), or None."""

    def blob(self, digest: str) -> bytes | None:
        """The bytes of the claim check blob `digest` (unverified), or None if it is missing."""
        raise NotImplementedError(f"{type(self).__name__} reads no blobs")

    def sizes(self, name: str) -> dict[str, int]:
        """Store-specific sizes of an inbox for `inspect` (segments and bytes for files)."""
        return {}

    def close(self) -> None:  # noqa: B027 -- nothing to release for most views
        """Release connections or descriptors."""

    def __enter__(self) -> TeamView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store(ABC):
    """Where inboxes live. Implementations: `FileStore`, `MemoryStore`, `RedisStore`."""

    team: str
    capabilities: ClassVar[Capabilities] = Capabilities()
    max_envelope: int = DEFAULT_MAX_ENVELOPE
    max_line: int = DEFAULT_MAX_LINE  # longer records are quarantined unread
    durability: Durability = "none"
    needs_polling: bool = False  # True where the store cannot tell this process of new records
    #: What the team records of its key, read by `open`: its fingerprint (teamrt.mail.signing)
    #: for a signed team, "" for an unsigned one, None for one made before teams recorded it.
    signing: str | None = None

    @abstractmethod
    async def open(self, members: Sequence[str], *, signing: str | None = None) -> None:
        """Create or open the team, registering `members` (idempotent).

        `signing` is the fingerprint of the key this opener signs with ("" for none): a team
        this call creates records it, and an existing team whose record differs is refused
        with `TeamKeyMismatch` before anything is written (`signing.check_key`). None: the
        opener does not sign or verify (a tool), and nothing is checked or recorded."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def members(self) -> tuple[str, ...]:
        """The roster as this store object last saw it (no I/O that can wait)."""

    async def members_now(self) -> tuple[str, ...]:
        """The roster now (another process may have added members)."""
        return self.members()

    @abstractmethod
    async def add_member(self, name: str) -> None:
        """Add `name` to the roster and create its inbox (idempotent)."""

    @abstractmethod
    async def append(self, recipient: str, encoded: bytes) -> int:
        """Append one encoded envelope (see `log.encode`) to `recipient`'s inbox; return its seq.

        When this returns, the envelope is in the inbox at the store's durability level. On
        failure, `StoreUnavailable` and other `StoreError`s mean nothing was written, and
        `OutcomeUnknown` means it may have been (a network store whose answer never came).
        """

    async def append_many(self, recipient: str, encoded: Sequence[bytes]) -> int:
        """Append several encoded envelopes in order, as one write where the store can; return
        the seq of the first."""
        seqs = [await self.append(recipient, item) for item in encoded]
        return seqs[0] if seqs else -1

    async def append_broadcast(self, sender: str, encoded: bytes) -> tuple[str, ...]:
        """Append one encoded broadcast to every member's inbox but `sender`'s, all or none;
        return the members it reached. Only for stores with `atomic_broadcast`."""
        raise NotImplementedError(f"{type(self).__name__} has no atomic broadcast")

    @abstractmethod
    def reader(self, name: str) -> InboxReader:
        """A reader over `name`'s inbox for its owner (not started: `await reader.start()`)."""

    async def tail_reader(self, name: str) -> InboxReader:
        """A reader over `name`'s inbox positioned at its end, for watching what comes next
        without consuming it (it takes no lease and must never commit or quarantine)."""
        raise NotImplementedError(f"{type(self).__name__} has no tail reader")

    @abstractmethod
    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        """Run until cancelled, calling `notify(name)` when another process writes to an inbox
        this process reads. Stores with nothing to watch return once started."""

    @abstractmethod
    def watch_inbox(self, name: str) -> None:
        """Start reporting writes to `name`'s inbox (called when a local reader opens)."""

    def changed_inboxes(self) -> set[str] | None:
        """For the safety rescan of a process that reads many inboxes: the inboxes this process
        reads that may have been written since the previous call, found by one check whose cost
        does not depend on how many inboxes there are, and independently of the notifications
        `watch` delivers (so that one they lost is still found). None when the store cannot
        tell: on the first call (which starts the tracking), after the tracking lost events
        itself, and always on a store without it; the rescan then checks every waiting
        inbox."""
        return None

    def view(self) -> TeamView:
        """A read-only view of this store's team for tools."""
        raise NotImplementedError(f"{type(self).__name__} has no view")

    async def destroy(self) -> None:
        """Delete this store's team and everything in it (inboxes, cursors, leases, ledger),
        on a store object that is not open; `MemberBusy` if a member runs. For demos and
        tests that start over."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete a team")

    # -- the team's budget ledger, shared by every process of the team --

    async def ledger_update(
        self, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply `change` to the team's budget ledger atomically (for every process of the
        team) and return the new ledger; `change` gets None when there is no ledger yet, and
        returning None leaves it as it was. `change` may be called more than once (a store
        with optimistic concurrency retries it)."""
        ledger = change(self._ledger)
        if ledger is not None:
            self._ledger = dict(ledger)
        return self._ledger

    async def ledger_read(self) -> dict[str, Any] | None:
        """The team's budget ledger (limits and spend), or None if there is none."""
        return self._ledger

    _ledger: dict[str, Any] | None = None

    # -- blobs: the bodies of claim checks, beside the inboxes (see teamrt/mail/claims.py) --

    max_blob: int = DEFAULT_MAX_BLOB

    async def blob_put(self, digest: str, data: bytes) -> None:
        """Keep `data` under `digest` (its SHA-256, in hex) at the store's durability level
        before returning. Idempotent: a digest names one content, so a second put of it may
        keep the first copy. Blobs are never deleted while the team exists (replay needs
        them)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no blobs")

    def blob_get_nowait(self, digest: str) -> bytes | None:
        """The bytes kept under `digest`, unverified (the caller checks them), or None if
        there are none. Called from the synchronous receive path: a local read, or on a network
        store one blocking round trip (blobs are rare, large payloads)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no blobs")

    # -- task records: idempotent asks (`Team.ask(..., key=)`), one record per request id --

    async def task_record_create(self, id_: str, record: dict[str, Any]) -> dict[str, Any]:
        """Write `record` for the request `id_` unless one is there (atomically, for every
        process of the team); return the record there now (`record` itself if it was written),
        with the `outcome` it was settled with, if any. Records are never changed otherwise."""
        current = self._task_records.setdefault(id_, dict(record))
        return dict(current)

    async def task_record_settle(self, id_: str, outcome: dict[str, Any]) -> dict[str, Any] | None:
        """Settle the record of request `id_` with `outcome` (JSON data) unless it has one:
        the first outcome wins. Return the record now, or None if `id_` has none (a request
        that was not an idempotent ask)."""
        current = self._task_records.get(id_)
        if current is None:
            return None
        current.setdefault("outcome", outcome)
        return dict(current)

    @property
    def _task_records(self) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] | None = self.__dict__.get("_task_records_held")
        if records is None:
            records = self.__dict__["_task_records_held"] = {}
        return records

    # -- liveness: is anybody running a member? --

    async def member_alive(self, name: str) -> bool | None:
        """Whether member `name` runs now: True if a live holder has its lease, False if its
        lease was held once and is not now (or its holder stopped renewing it for
        `LEASE_STALE_AFTER` seconds), None if the store cannot tell or the member never ran
        (a member nobody runs, such as a human answering with `teamrt send`)."""
        return None

    #: Seconds a lease is known held after the request that took, renewed or checked it was
    #: sent (a store whose leases expire: a little less than their time limit, so that a holder
    #: paused past it finds out before it acts). Infinite for leases that cannot be lost while
    #: their process lives: an flock (files) or a lease of this process (memory).
    lease_validity: float = math.inf

    async def confirm_lease(self, record: LeaseRecord) -> None:
        """A fresh check with the store that this store object still holds `record`, for a
        holder about to act (hand out mail, start a task, call a tool): raises `LeaseLost`
        (and marks the lease lost) if another holder has it; on success the lease is known held
        for `lease_validity` more seconds. A store whose leases cannot be lost while their
        process lives only looks at the local flag."""
        if record.expired:
            raise record.lost_error()

    async def renew_leases(self) -> None:  # noqa: B027 -- optional for stores without expiry
        """Renew every lease this store object holds (refresh its heartbeat; extend its time
        limit). A lease found taken over is marked lost. The mailboxes call this every
        `HEARTBEAT_INTERVAL` seconds; it never raises for a store that cannot be reached."""

    # -- leases: one live consumer per member; re-entrant within this store object --

    async def acquire_lease(self, name: str, holder: str) -> Lease:
        """Become the one live owner of member `name` (its inbox consumer), or raise
        `MemberBusy` naming the current holder. Released by `Lease.release()`, by the death of
        the holding process (`leases_die_with_process`) or by expiry (`leases_expire`).

        Re-entrant within this store object: while this store holds the lease, further
        acquisitions succeed and share it (a Team and an inbox of one process), and the lease
        is given up when the last of them releases it. Another store object, in this process
        or another, is refused.
        """
        records = self._lease_table()
        record = records.get(name)
        if record is None or record.expired:
            if record is not None:  # lost: its holders keep their (lost) handles
                del records[name]
            sent = time.monotonic()  # the lease's time limit runs from no earlier than this
            token, fence = await self._lock_member(name, holder)
            record = records[name] = LeaseRecord(name, token, fence)
            record.held_until(sent + self.lease_validity)
        else:
            await self._describe_holder(record, holder)
        record.holders.append(holder)
        return Lease(self, record, holder)

    def lease_held(self, name: str) -> bool:
        """True while this store object holds member `name`'s lease (and has not lost it)."""
        record = self._lease_table().get(name)
        return record is not None and not record.expired

    def lease_record(self, name: str) -> LeaseRecord | None:
        """This store object's live lease on `name` (shared by its holders), or None."""
        record = self._lease_table().get(name)
        return None if record is None or record.expired else record

    def fence(self, name: str) -> Fence:
        """The fence of this store object's live lease on `name` (`LeaseLost` if it holds
        none: it never took it, or lost it)."""
        record = self.lease_record(name)
        if record is None:
            raise LeaseLost(
                f"this process does not hold {name}'s lease (it never took it, or lost it to "
                "another holder): it may not act for the member"
            )
        return Fence(self, record)

    def held_leases(self) -> list[LeaseRecord]:
        return list(self._lease_table().values())

    def _lease_table(self) -> dict[str, LeaseRecord]:
        try:
            return self._lease_records
        except AttributeError:
            self._lease_records: dict[str, LeaseRecord] = {}
            return self._lease_records

    def mark_lease_lost(self, record: LeaseRecord) -> None:
        """Mark a lease lost (for stores whose leases expire): its holders are told through
        `Lease.lost`, and the next acquisition tries to take it afresh."""
        record.expire()

    async def release_lease(self, record: LeaseRecord, holder: str) -> None:
        """`holder` lets `record` go (`Lease.release`): the member's lock is given up once no
        holder in this store object keeps it, or the next remaining holder is described."""
        record.holders.remove(holder)
        if record.holders:
            await self._describe_holder(record, record.holders[-1])
            return
        if self._lease_table().get(record.name) is record:
            del self._lease_table()[record.name]
        if not record.expired:
            await self._unlock_member(record)

    @abstractmethod
    async def _lock_member(self, name: str, holder: str) -> tuple[object, int]:
        """Take member `name`'s lease for this store (not yet held by it), or raise
        `MemberBusy`; returns what `_unlock_member` needs and the fencing token (a number
        that grows with every acquisition of this member, where the store keeps one)."""

    async def _describe_holder(self, record: LeaseRecord, holder: str) -> None:  # noqa: B027
        """Record who holds the lease now (for the error the next claimant sees)."""

    @abstractmethod
    async def _unlock_member(self, record: LeaseRecord) -> None: ...


class LeaseRecord:
    """One lease a store object holds, shared by its holders in this process."""

    __slots__ = ("_lost", "expired", "fence", "holders", "name", "token", "valid_until")

    def __init__(self, name: str, token: object, fence: int) -> None:
        self.name = name
        self.token = token  # what the store needs to release it
        self.fence = fence  # the fencing token: grows with every acquisition of the member
        self.holders: list[str] = []
        self.expired = False  # the store found another holder: this one may no longer act
        # time.monotonic() until which the lease is known held: set from when the request that
        # took, renewed or checked it was sent (the server's time limit started no earlier)
        self.valid_until = -math.inf
        self._lost: anyio.Event | None = None  # made on first use, inside an event loop

    @property
    def lost(self) -> anyio.Event:
        """Set once `expired` turns True."""
        if self._lost is None:
            self._lost = anyio.Event()
            if self.expired:
                self._lost.set()
        return self._lost

    def expire(self) -> None:
        self.expired = True
        if self._lost is not None:
            self._lost.set()

    def held_until(self, until: float) -> None:
        """The store said the lease is held, in an answer to a request sent `lease_validity`
        seconds before `until`."""
        if until > self.valid_until:
            self.valid_until = until

    def known_held(self) -> bool:
        """The fence's fast path: True while the lease is known held without asking the store
        (not lost, and renewed or checked within the store's `lease_validity`). False means
        ask (`Store.confirm_lease`) before acting; it never means the lease is lost."""
        return not self.expired and time.monotonic() < self.valid_until

    def lost_error(self) -> LeaseLost:
        """The error for a holder that acts on this lease after it was lost."""
        return LeaseLost(
            f"{self.name}'s lease (fence {self.fence}) expired and another holder took it over; "
            "this process no longer owns the member and its incarnation must stop"
        )


class Lease:
    """Exclusive ownership of a member, held until released (or lost, for stores whose leases
    expire: `lost` is set when another holder took over)."""

    def __init__(self, store: Store, record: LeaseRecord, holder: str) -> None:
        self._store: Store | None = store
        self.record = record
        self._holder = holder

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def fence(self) -> int:
        """The fencing token of this acquisition."""
        return self.record.fence

    @property
    def lost(self) -> anyio.Event:
        """Set when the store found that this lease expired and another holder took it."""
        return self.record.lost

    async def release(self) -> None:
        """Give the lease up (once; again is harmless). A release cut short by cancellation
        leaves a lease that dies with its process or expires, as every lease does."""
        if self._store is not None:
            store, self._store = self._store, None
            await store.release_lease(self.record, self._holder)


class Fence:
    """What an agent acting for a member checks before each effect (a task started, a tool
    call): this store object's lease on the member, with its fencing token."""

    __slots__ = ("_store", "record")

    def __init__(self, store: Store, record: LeaseRecord) -> None:
        self._store = store
        self.record = record

    @property
    def token(self) -> int:
        """The fencing token: it grows with every acquisition of the member's lease."""
        return self.record.fence

    async def check(self) -> None:
        """A fresh check with the store (`Store.confirm_lease`): `LeaseLost` if the lease is
        lost, and the incarnation must not act. A store that cannot be reached is waited out
        (nothing acts meanwhile; a lease whose time limit passed in the outage is taken back
        if nobody took it, or found lost), never reported as a failure of the caller."""
        pause, warned = 0.05, False
        while True:
            try:
                await self._store.confirm_lease(self.record)
                return
            except (StoreUnavailable, OutcomeUnknown) as exc:
                if not warned:
                    warned = True
                    log.warning("teamrt: %s's lease cannot be checked (%s); waiting for the "
                                "store before acting", self.record.name, exc)  # fmt: skip
            await anyio.sleep(pause)
            pause = min(pause * 2, 1.0)


def run_local(coroutine: Coroutine[Any, Any, T], what: str) -> T:
    """Run a coroutine of a local store (one that never waits) to its end, synchronously.

    For the calls that must stay synchronous on local stores (`Mailboxes.inbox(name)`): a file
    or memory store's lease, cursor and quarantine calls complete without suspending. A store
    that would suspend is refused with a clear error instead of being run half way.
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    from teamrt.errors import UsageError

    raise UsageError(f"{what} must wait on this store: use `await mail.open_inbox(name)`")


__all__ = [
    "DEFAULT_MAX_BLOB",
    "DEFAULT_MAX_ENVELOPE",
    "HEARTBEAT_INTERVAL",
    "LEASE_STALE_AFTER",
    "Capabilities",
    "Corrupt",
    "Cursor",
    "Durability",
    "Entry",
    "Fence",
    "InboxReader",
    "Lease",
    "LeaseRecord",
    "Position",
    "Store",
    "TeamView",
    "run_local",
]

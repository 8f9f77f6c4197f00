"""The store interface: the one seam between the mailbox logic and where inbox bytes live.

A store appends encoded envelopes to inboxes (assigning `seq` under its lock), hands an inbox's
owner a reader over the log, keeps the roster, and tells the mailboxes when another process wrote.
Everything above it (acks, dedup, request/response, wake-ups in-process) is store-agnostic, and
every store passes the same conformance suite (`teamrt.testing.conformance`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Literal

from anyio.abc import TaskStatus

from teamrt.mail.log import DEFAULT_MAX_LINE, Corrupt, Cursor, Frame

Durability = Literal["none", "fsync"]

#: How often a process refreshes the heartbeat of the leases it holds, and after how long
#: without one a holder counts as gone (a stopped or hung process).
HEARTBEAT_INTERVAL = 1.0
LEASE_STALE_AFTER = 5.0

#: Encoded envelopes larger than this are refused before any lock is taken.
DEFAULT_MAX_ENVELOPE = 1 << 20


class InboxReader(ABC):
    """The owner's view of one inbox: new items from the cursor on, and cursor commits."""

    @abstractmethod
    def load_cursor(self) -> Cursor:
        """The committed cursor (the start of the log if none was committed)."""

    @abstractmethod
    def seek(self, cursor: Cursor) -> None:
        """Position the reader at `cursor`."""

    @abstractmethod
    def read(self) -> tuple[int, list[Frame]]:
        """Complete lines written since the last read, framed but not decoded, with the
        segment they are in (decoding is left to the caller, one line at a time).

        Returns `(segment, [])` when nothing new is there. Never blocks, never raises on bad data.
        """

    @abstractmethod
    def has_new(self) -> bool:
        """True if a `read()` might return something (cheap; used by the safety rescan)."""

    @abstractmethod
    def commit(self, cursor: Cursor) -> None:
        """Make `cursor` the committed read position, atomically."""

    @abstractmethod
    def quarantine(self, segment: int, item: Corrupt) -> None:
        """Record a line that could not be decoded (once, even if it is read again)."""

    def changed_elsewhere(self) -> bool:
        """True if another consumer committed this inbox's cursor since this reader last
        loaded or committed it."""
        return False

    @abstractmethod
    def close(self) -> None: ...


class Store(ABC):
    """Where inboxes live. Implementations: `FileStore`, `MemoryStore`."""

    team: str
    max_envelope: int = DEFAULT_MAX_ENVELOPE
    max_line: int = DEFAULT_MAX_LINE  # longer lines are quarantined unread
    durability: Durability = "none"
    needs_polling: bool = False  # True where no file notifications exist
    blocking_commits: bool = False  # True if cursor commits should run in a worker thread

    @abstractmethod
    async def open(self, members: Sequence[str]) -> None:
        """Create or open the team, registering `members` (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def members(self, *, refresh: bool = False) -> tuple[str, ...]:
        """The roster; `refresh=True` re-reads it (another process may have added members)."""

    @abstractmethod
    async def add_member(self, name: str) -> None:
        """Add `name` to the roster and create its inbox (idempotent)."""

    @abstractmethod
    async def append(self, recipient: str, encoded: bytes) -> int:
        """Append one encoded envelope (see `log.encode`) to `recipient`'s inbox; return its seq.

        When this returns, the envelope is in the log at the store's durability level. On any
        failure nothing partial stays in the log and a `StoreError` is raised.
        """

    async def append_many(self, recipient: str, encoded: Sequence[bytes]) -> int:
        """Append several encoded envelopes in order, as one write where the store can; return
        the seq of the first."""
        seqs = [await self.append(recipient, item) for item in encoded]
        return seqs[0] if seqs else -1

    @abstractmethod
    def reader(self, name: str) -> InboxReader:
        """A reader over `name`'s inbox, for its owner."""

    def tail_reader(self, name: str) -> InboxReader:
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

    # -- the team's budget ledger, shared by every process of the team --

    def ledger_update(
        self, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply `change` to the team's budget ledger atomically (under the store's lock, for
        every process of the team) and return the new ledger; `change` gets None when there
        is no ledger yet, and returning None leaves it as it was."""
        with self._ledger_lock:
            ledger = change(self._ledger)
            if ledger is not None:
                self._ledger = dict(ledger)
            return self._ledger

    def ledger_read(self) -> dict[str, Any] | None:
        """The team's budget ledger (limits and spend), or None if there is none."""
        return self._ledger

    _ledger: dict[str, Any] | None = None
    _ledger_lock: contextlib.nullcontext[None] = contextlib.nullcontext()

    # -- liveness: is anybody running a member? --

    def member_alive(self, name: str) -> bool | None:
        """Whether member `name` runs now: True if a live holder has its lease, False if its
        lease was held once and is not now (or its holder's heartbeat stopped for
        `LEASE_STALE_AFTER` seconds), None if the store cannot tell or the member never ran
        (a member nobody runs, such as a human answering with `teamrt send`)."""
        return None

    def heartbeat(self) -> None:  # noqa: B027 -- optional for stores without heartbeats
        """Refresh the heartbeat of every lease this store object holds (the mailboxes call
        this every `HEARTBEAT_INTERVAL` seconds)."""

    # -- leases: one live consumer per member; re-entrant within this store object --

    def acquire_lease(self, name: str, holder: str) -> Lease:
        """Become the one live owner of member `name` (its inbox consumer), or raise
        `MemberBusy` naming the current holder. Released by `Lease.release()` or by the death
        of the holding process.

        Re-entrant within this store object: while this store holds the lease, further
        acquisitions succeed (a Team and an inbox of one process share it), and the lease is
        given up when the last of them releases it. Another store object, in this process or
        another, is refused.
        """
        records = self._lease_table()
        record = records.get(name)
        if record is None:
            token = self._lock_member(name, holder)
            record = records[name] = _LeaseRecord(name, token)
        else:
            self._describe_holder(record.token, holder)
        record.holders.append(holder)
        return _SharedLease(self, record, holder)

    def lease_held(self, name: str) -> bool:
        """True while this store object holds member `name`'s lease."""
        return name in self._lease_table()

    def _lease_table(self) -> dict[str, _LeaseRecord]:
        try:
            return self._lease_records
        except AttributeError:
            self._lease_records: dict[str, _LeaseRecord] = {}
            return self._lease_records

    def _release(self, record: _LeaseRecord, holder: str) -> None:
        record.holders.remove(holder)
        if record.holders:
            self._describe_holder(record.token, record.holders[-1])
            return
        del self._lease_table()[record.name]
        self._unlock_member(record.token)

    @abstractmethod
    def _lock_member(self, name: str, holder: str) -> object:
        """Take member `name`'s lease for this store (not yet held by it), or raise
        `MemberBusy`; returns what `_unlock_member` needs."""

    def _describe_holder(self, token: object, holder: str) -> None:  # noqa: B027 -- optional
        """Record who holds the lease now (for the error the next claimant sees)."""

    @abstractmethod
    def _unlock_member(self, token: object) -> None: ...


class Lease(ABC):
    """Exclusive ownership of a member name, held until released."""

    @abstractmethod
    def release(self) -> None: ...


class _LeaseRecord:
    __slots__ = ("holders", "name", "token")

    def __init__(self, name: str, token: object) -> None:
        self.name = name
        self.token = token
        self.holders: list[str] = []


class _SharedLease(Lease):
    def __init__(self, store: Store, record: _LeaseRecord, holder: str) -> None:
        self._store: Store | None = store
        self._record = record
        self._holder = holder

    def release(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            store._release(self._record, self._holder)

"""The in-memory twin of the file store: the same interface and records, no files.

Each inbox is a list of the stamped lines the file store would write, so readers use the same
decoder and cursor arithmetic and the conformance suite holds it to the same behaviour. A position
is `(0, index)`. It is for tests and single-process teams that need no persistence; nothing
survives the process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from anyio.abc import TaskStatus

from teamrt.errors import MemberBusy, UnknownRecipient
from teamrt.mail.log import DEFAULT_MAX_LINE, Corrupt, Cursor, Entry, Position, stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.signing import check_key
from teamrt.mail.store import (
    DEFAULT_MAX_BLOB,
    DEFAULT_MAX_ENVELOPE,
    Capabilities,
    InboxReader,
    LeaseRecord,
    Store,
    TeamView,
)
from teamrt.names import validate_name


class _MemoryInbox:
    __slots__ = ("cursor", "lines", "next_seq", "partial", "quarantined")

    def __init__(self) -> None:
        self.lines: list[tuple[bytes, bool]] = []  # (stamped line, too long)
        self.partial = b""  # raw bytes written without their newline yet (write_raw)
        self.next_seq = 0
        self.cursor = Cursor()
        self.quarantined: list[Corrupt] = []

    def entry(self, index: int) -> Entry:
        raw, too_long = self.lines[index]
        return Entry(raw, 0, index, index + 1, too_long)


class MemoryReader(InboxReader):
    def __init__(self, inbox: _MemoryInbox) -> None:
        self._inbox = inbox
        self.next = 0  # index of the next record to hand out

    async def start(self) -> Cursor:
        cursor = self._inbox.cursor
        self.next = cursor.offset
        return cursor

    def read_nowait(self) -> list[Entry]:
        inbox, start = self._inbox, self.next
        end = len(inbox.lines)
        if start >= end:
            return []
        self.next = end
        return [inbox.entry(i) for i in range(start, end)]

    def has_new(self) -> bool:
        return len(self._inbox.lines) > self.next

    async def commit(self, cursor: Cursor) -> None:
        self._inbox.cursor = cursor

    async def quarantine(self, item: Corrupt) -> None:
        known = self._inbox.quarantined
        if not known or known[-1].at < item.at:
            known.append(item)

    def close(self) -> None:
        pass


class MemoryStore(Store):
    """Inboxes in memory, for tests and throwaway teams."""

    capabilities = Capabilities(opens_locally=True, atomic_broadcast=True)

    def __init__(
        self,
        team: str = "team",
        *,
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        max_blob: int = DEFAULT_MAX_BLOB,
    ) -> None:
        self.team = validate_name(team, what="team name")
        self._team_bytes = self.team.encode()
        self.max_envelope = max_envelope
        self.max_blob = max_blob
        self.blobs: dict[str, bytes] = {}  # claim check bodies by digest
        self.max_line = max(DEFAULT_MAX_LINE, max_envelope + 256)
        self.inboxes: dict[str, _MemoryInbox] = {}
        self._ran: set[str] = set()  # members whose lease was ever taken
        self._made = False  # the team's settings are fixed by its first opening

    async def open(self, members: Sequence[str], *, signing: str | None = None) -> None:
        if not self._made:
            self.signing, self._made = signing, True
        elif signing is not None:
            check_key(self.team, self.signing, signing)
        for name in members:
            await self.add_member(name)

    async def close(self) -> None:
        pass

    def members(self) -> tuple[str, ...]:
        return tuple(self.inboxes)

    async def add_member(self, name: str) -> None:
        self.inboxes.setdefault(validate_name(name), _MemoryInbox())

    def inbox_state(self, name: str) -> _MemoryInbox:
        """Member `name`'s lines, cursor and quarantine (`UnknownRecipient` if no member)."""
        inbox = self.inboxes.get(name)
        if inbox is None:
            validate_name(name, what="recipient")
            raise UnknownRecipient(
                f"no member {name!r} in team {self.team!r} "
                f"(members: {', '.join(self.inboxes) or 'none'})"
            )
        return inbox

    async def append(self, recipient: str, encoded: bytes) -> int:
        inbox = self.inbox_state(recipient)
        seq = inbox.next_seq
        inbox.lines.append((stamp(encoded, seq, self._team_bytes)[:-1], False))
        inbox.next_seq = seq + 1
        return seq

    async def append_broadcast(self, sender: str, encoded: bytes) -> tuple[str, ...]:
        reached = tuple(name for name in self.inboxes if name != sender)
        for name in reached:  # nothing between these appends can fail
            await self.append(name, encoded)
        return reached

    # -- blobs (claim checks) --

    async def blob_put(self, digest: str, data: bytes) -> None:
        self.blobs[digest] = data

    def blob_get_nowait(self, digest: str) -> bytes | None:
        return self.blobs.get(digest)

    def write_raw(self, name: str, data: bytes) -> None:
        """Append raw bytes to an inbox, bypassing encoding (for corruption tests); they are
        split into records at newlines, a last piece without one waiting for the rest."""
        inbox = self.inbox_state(name)
        *complete, inbox.partial = (inbox.partial + data).split(b"\n")
        for line in complete:
            if line.strip():
                too_long = len(line) > self.max_line
                inbox.lines.append((line[: self.max_line] if too_long else line, too_long))

    def reader(self, name: str) -> MemoryReader:
        return MemoryReader(self.inbox_state(name))

    async def tail_reader(self, name: str) -> MemoryReader:
        reader = self.reader(name)
        reader.next = len(self.inbox_state(name).lines)
        return reader

    def quarantined(self, name: str) -> list[Corrupt]:
        return list(self.inbox_state(name).quarantined)

    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        task_status.started()  # one process: sends wake their receivers directly

    def watch_inbox(self, name: str) -> None:
        pass

    def view(self) -> TeamView:
        return MemoryView(self)

    async def destroy(self) -> None:
        if self.held_leases():
            raise MemberBusy(f"a member of team {self.team!r} is running")
        self.inboxes.clear()
        self._ran.clear()
        self._ledger = None
        self._task_records.clear()
        self.signing, self._made = None, False

    async def _lock_member(self, name: str, holder: str) -> tuple[object, int]:
        self.inbox_state(name)  # one store object is the whole team: nobody else can hold it
        self._ran.add(name)
        return None, 0

    async def member_alive(self, name: str) -> bool | None:
        if self.lease_held(name):
            return True
        return False if name in self._ran else None

    async def _unlock_member(self, record: LeaseRecord) -> None:
        pass


class MemoryView(TeamView):
    """A read-only view of a `MemoryStore`'s team."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.team = store.team
        self.locator = f"memory:{store.team}"

    def signing(self) -> str | None:
        return self._store.signing

    def members(self) -> tuple[str, ...]:
        return self._store.members()

    def scan(self, name: str, after: Position | None = None) -> Iterator[Entry]:
        inbox = self._store.inbox_state(name)
        start = 0 if after is None else after[1]
        return (inbox.entry(i) for i in range(start, len(inbox.lines)))

    def end(self, name: str) -> Position:
        return (0, len(self._store.inbox_state(name).lines))

    def committed(self, name: str) -> Cursor:
        return self._store.inbox_state(name).cursor

    def quarantined(self, name: str) -> Iterator[dict[str, Any]]:
        for item in self._store.inbox_state(name).quarantined:
            yield {"at": list(item.at), "end": list(item.end), "reason": item.reason,
                   "raw": item.raw.decode("utf-8", "backslashreplace")}  # fmt: skip

    def blob(self, digest: str) -> bytes | None:
        return self._store.blobs.get(digest)

    def holder(self, name: str) -> str | None:
        record = {r.name: r for r in self._store.held_leases()}.get(name)
        return record.holders[-1] if record is not None and record.holders else None


class MemoryMailboxes(Mailboxes):
    """Mailboxes in memory: the same behaviour as `FileMailboxes`, nothing on disk."""

    def __init__(
        self,
        team: str = "team",
        *,
        members: Iterable[str] = (),
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        max_blob: int = DEFAULT_MAX_BLOB,
        key: str | bytes | None = None,
    ) -> None:
        store = MemoryStore(team, max_envelope=max_envelope, max_blob=max_blob)
        super().__init__(store, members=members, key=key)

"""The in-memory twin of the file store: same interface, same log bytes, no files.

Inboxes are byte buffers holding exactly the lines the file store would write, so readers use the
same decoder and cursor arithmetic and the conformance suite holds it to the same behaviour. It is
for tests and single-process teams that need no persistence; nothing survives the process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from anyio.abc import TaskStatus

from teamrt.errors import UnknownRecipient
from teamrt.mail.log import DEFAULT_MAX_LINE, Corrupt, Cursor, Frame, LineSplitter, stamp
from teamrt.mail.store import DEFAULT_MAX_ENVELOPE, InboxReader, Store
from teamrt.names import validate_name


class _MemoryInbox:
    __slots__ = ("cursor", "data", "next_seq", "quarantined")

    def __init__(self) -> None:
        self.data = bytearray()
        self.next_seq = 0
        self.cursor = Cursor()
        self.quarantined: list[tuple[int, Corrupt]] = []


class MemoryReader(InboxReader):
    def __init__(self, inbox: _MemoryInbox, max_line: int) -> None:
        self._inbox = inbox
        self._max_line = max_line
        self.decoder = LineSplitter(max_line=max_line)

    def load_cursor(self) -> Cursor:
        return self._inbox.cursor

    def seek(self, cursor: Cursor) -> None:
        self.decoder = LineSplitter(cursor.offset, max_line=self._max_line)

    def read(self) -> tuple[int, list[Frame]]:
        offset = self.decoder.offset
        data = self._inbox.data
        if len(data) <= offset:
            return 0, []
        return 0, self.decoder.feed(bytes(data[offset:]))

    def has_new(self) -> bool:
        return len(self._inbox.data) > self.decoder.offset

    def commit(self, cursor: Cursor) -> None:
        self._inbox.cursor = cursor

    def quarantine(self, segment: int, item: Corrupt) -> None:
        known = self._inbox.quarantined
        if not known or (known[-1][0], known[-1][1].offset) < (segment, item.offset):
            known.append((segment, item))

    def close(self) -> None:
        pass


class MemoryStore(Store):
    """Inboxes in memory, for tests and throwaway teams."""

    def __init__(self, team: str = "team", *, max_envelope: int = DEFAULT_MAX_ENVELOPE) -> None:
        self.team = validate_name(team, what="team name")
        self._team_bytes = self.team.encode()
        self.max_envelope = max_envelope
        self.max_line = max(DEFAULT_MAX_LINE, max_envelope + 256)
        self.inboxes: dict[str, _MemoryInbox] = {}
        self._ran: set[str] = set()  # members whose lease was ever taken

    async def open(self, members: Sequence[str]) -> None:
        for name in members:
            await self.add_member(name)

    async def close(self) -> None:
        pass

    def members(self, *, refresh: bool = False) -> tuple[str, ...]:
        return tuple(self.inboxes)

    async def add_member(self, name: str) -> None:
        self.inboxes.setdefault(validate_name(name), _MemoryInbox())

    def _inbox(self, name: str) -> _MemoryInbox:
        inbox = self.inboxes.get(name)
        if inbox is None:
            validate_name(name, what="recipient")
            raise UnknownRecipient(
                f"no member {name!r} in team {self.team!r} "
                f"(members: {', '.join(self.inboxes) or 'none'})"
            )
        return inbox

    async def append(self, recipient: str, encoded: bytes) -> int:
        inbox = self._inbox(recipient)
        seq = inbox.next_seq
        inbox.data += stamp(encoded, seq, self._team_bytes)
        inbox.next_seq = seq + 1
        return seq

    def write_raw(self, name: str, data: bytes) -> None:
        """Append raw bytes to an inbox, bypassing encoding (for corruption tests)."""
        self._inbox(name).data += data

    def reader(self, name: str) -> MemoryReader:
        return MemoryReader(self._inbox(name), self.max_line)

    def quarantined(self, name: str) -> list[Corrupt]:
        return [item for _, item in self._inbox(name).quarantined]

    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        task_status.started()  # one process: sends wake their receivers directly

    def watch_inbox(self, name: str) -> None:
        pass

    def _lock_member(self, name: str, holder: str) -> object:
        self._inbox(name)  # one store object is the whole team: nobody else can hold it
        self._ran.add(name)
        return None

    def member_alive(self, name: str) -> bool | None:
        if self.lease_held(name):
            return True
        return False if name in self._ran else None

    def _unlock_member(self, token: object) -> None:
        pass

    def tail_reader(self, name: str) -> MemoryReader:
        reader = self.reader(name)
        reader.seek(Cursor(0, len(self._inbox(name).data)))
        return reader

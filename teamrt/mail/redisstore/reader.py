"""The owner's reader over one inbox stream, and the tail reader for tools.

Theory of operation. Positions are `(0, n)`: n records of the inbox lie before it, and the record
with seq n has stream id `0-<n+1>`, so a position is a number and the next read is an XRANGE from
one id. A reader hands out entries from its buffer, which the process's watcher (watcher.py)
fills from its one blocking XREAD; `read_nowait` never touches the network. `fetch` asks the
server itself (an XRANGE from the reader's end, pipelined behind the team's epoch) when the buffer
is empty or the watcher skipped entries for this reader (a full buffer: at most
`MAX_BUFFERED` entries or `MAX_BUFFERED_BYTES` wait in it). Each reader tracks the seq after the
last entry it took (`_end`); whatever is older is dropped, so an entry is handed out once however
it arrived.

The committed cursor is in the `cursor:<name>` hash, written by a script that checks the lease's
fencing token (a holder that lost its lease gets `LeaseLost`). The cursor's `tail` is the team's
epoch: a cursor from another incarnation of the team, or one past the inbox's end, is refused
loudly as `StoreCorrupt` rather than silently skipping or re-reading mail.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from teamrt.errors import LeaseLost, StoreCorrupt, UsageError
from teamrt.mail.log import Corrupt, Cursor, Entry
from teamrt.mail.redisstore import scripts
from teamrt.mail.redisstore.keys import seq_of, stream_id
from teamrt.mail.store import InboxReader

if TYPE_CHECKING:
    from teamrt.mail.redisstore.store import RedisStore

#: Entries (and bytes) the watcher may buffer for one reader before it leaves the rest to fetch.
MAX_BUFFERED = 4096
MAX_BUFFERED_BYTES = 8 << 20
#: Entries one fetch asks for.
FETCH_PAGE = 1000


def make_entry(item: Sequence[Any], max_line: int) -> tuple[int, Entry]:
    """A stream entry ([id, [field, value, ...]]) as (seq, `Entry`). The record is field `d`;
    an entry written by another program without one becomes a record that fails to decode."""
    seq = seq_of(item[0])
    if seq < 0:
        raise StoreCorrupt(
            f"a stream entry with id {item[0]!r} that teamrt never writes (another program "
            "added to the inbox with an automatic id); export the team and start a new one"
        )
    fields = item[1]
    if len(fields) >= 2 and fields[0] == b"d":
        raw = fields[1]
    else:
        raw = b"<stream entry without a 'd' field: " + b" ".join(fields)[:200] + b">"
    if len(raw) > max_line:
        return seq, Entry(raw[:max_line], 0, seq, seq + 1, True)
    return seq, Entry(raw, 0, seq, seq + 1)


class RedisReader(InboxReader):
    """A reader over `name`'s inbox stream: the owner's (`store.reader`), or a tail reader
    (`await store.tail_reader(name)`) that never commits or quarantines."""

    def __init__(self, store: RedisStore, name: str, *, tail: bool = False) -> None:
        self._store = store
        self.name = name
        self.tail = tail
        self._key = store.keys.inbox(name)
        self._buffer: deque[Entry] = deque()
        self._buffered_bytes = 0
        self._end = 0  # seq after the last entry taken into the buffer or handed out
        self._gap = False  # the watcher has entries past `_end` this reader did not take
        self._gen: int | None = None  # the cursor's generation at start or at our last commit
        self._started = False
        self._closed = False

    @property
    def next_seq(self) -> int:
        """The seq after the last entry this reader took in or handed out: where its stream
        is read from next."""
        return self._end

    # -- starting --

    async def start(self) -> Cursor:
        store = self._store
        keys = store.keys
        replies = await store.client.pipeline(
            [
                ("HGET", keys.meta, "epoch"),
                ("HMGET", keys.cursor(self.name), "c", "gen"),
                ("HGET", keys.next, self.name),
            ],
            f"read {self.name}'s cursor",
            change=False,
        )
        store.check_epoch(replies[0])
        raw_cursor, gen = replies[1]
        if replies[2] is None:
            raise store.unknown_recipient(self.name)
        end = int(replies[2])
        if self.tail:
            cursor = Cursor(0, end, end - 1, tail=store.epoch)
        else:
            cursor = self._parse_cursor(raw_cursor, end)
        self._gen = None if gen is None else int(gen)
        self._buffer.clear()
        self._buffered_bytes = 0
        self._end = cursor.offset
        self._gap = False
        self._started = True
        if end > cursor.offset:  # what has arrived already is there for read_nowait
            self._buffer.extend(await self._read_page())
            self._buffered_bytes = sum(len(entry.raw) for entry in self._buffer)
        store.watcher.attach(self)
        return cursor

    def _parse_cursor(self, raw: bytes | None, end: int) -> Cursor:
        if raw is None:
            return Cursor()
        where = f"{self.name}'s cursor in team {self._store.team!r} at {self._store.shown}"
        try:
            cursor = Cursor.from_json_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            key = self._store.keys.cursor(self.name)
            raise StoreCorrupt(
                f"{where} is not a cursor ({exc}); delete the key {key} to read the inbox again "
                "from its start"
            ) from None
        if cursor.tail is not None and cursor.tail != self._store.epoch:
            raise StoreCorrupt(
                f"{where} belongs to another incarnation of the team (epoch {cursor.tail}, the "
                f"team's is {self._store.epoch}): the team was lost and created again; refusing "
                "to read with it"
            )
        if cursor.segment != 0 or cursor.offset > end:
            raise StoreCorrupt(
                f"{where} says {cursor.offset} records were handled, but the inbox has only "
                f"{end}: the server lost records (restored from an older snapshot?); refusing "
                "to skip mail that would arrive under the cursor"
            )
        return cursor

    # -- reading --

    def push_local(self, seq: int, entry: Entry) -> None:
        """An entry this store object appended: taken if it is the next one (read your own
        writes at once; anything else the watcher brings in order)."""
        if (
            seq == self._end
            and not self._closed
            and len(self._buffer) < MAX_BUFFERED
            and self._buffered_bytes < MAX_BUFFERED_BYTES
        ):
            self._buffer.append(entry)
            self._buffered_bytes += len(entry.raw)
            self._end = seq + 1

    def push(self, seq: int, entry: Entry) -> None:
        """Called by the watcher with each entry it read, in order."""
        if seq < self._end or self._closed:
            return  # taken already (by a fetch)
        if (
            seq > self._end
            or len(self._buffer) >= MAX_BUFFERED
            or self._buffered_bytes >= MAX_BUFFERED_BYTES
        ):
            self._gap = True  # left for fetch (or for the watcher, once the buffer drains)
            return
        self._buffer.append(entry)
        self._buffered_bytes += len(entry.raw)
        self._end = seq + 1

    def read_nowait(self) -> list[Entry]:
        if not self._buffer:
            if self._gap:
                self._store.watcher.rewind(self)
            return []
        out = list(self._buffer)
        self._buffer.clear()
        self._buffered_bytes = 0
        if self._gap:  # the buffer was full: have the watcher read on from here
            self._gap = False
            self._store.watcher.rewind(self)
        return out

    async def fetch(self) -> list[Entry]:
        if self._buffer and not self._gap:
            return self.read_nowait()
        page = await self._read_page()
        out = list(self._buffer)
        out += page
        self._buffer.clear()
        self._buffered_bytes = 0
        if self._gap:
            self._gap = False
            self._store.watcher.rewind(self)
        return out

    async def _read_page(self) -> list[Entry]:
        """The next page of entries after `_end` (XRANGE behind the epoch); moves `_end`."""
        store = self._store
        replies = await store.client.pipeline(
            [
                ("HGET", store.keys.meta, "epoch"),
                ("XRANGE", self._key, stream_id(self._end), "+", "COUNT", FETCH_PAGE),
            ],
            f"read {self.name}'s inbox",
            change=False,
        )
        store.check_epoch(replies[0])
        out = []
        max_line = store.max_line
        for item in replies[1]:
            seq, entry = make_entry(item, max_line)
            if seq >= self._end:
                out.append(entry)
                self._end = seq + 1
        return out

    def has_new(self) -> bool:
        # only what read_nowait would return: the rescan fetches for a network store anyway
        # (a reader the watcher skipped is read on by the watcher once it drains)
        return bool(self._buffer)

    # -- the owner's commits --

    async def commit(self, cursor: Cursor) -> None:
        if self.tail:
            raise UsageError(f"a tail reader of {self.name}'s inbox cannot commit a cursor")
        store = self._store
        record = store.lease_record(self.name)
        # a lease this store object released (a Team that stopped before its mailboxes flushed
        # their last acks) still fences the commit: it passes while nobody took the lease since
        fence = record.fence if record is not None else store.released_fence(self.name)
        if fence is None:
            raise LeaseLost(
                f"{self.name}'s cursor cannot be committed: this process does not hold its "
                "lease (it never took it, or lost it to another holder)"
            )
        cursor = dataclasses.replace(cursor, tail=store.epoch)
        data = json.dumps(cursor.to_json_dict(), separators=(",", ":"))
        keys = store.keys
        try:
            gen = await store.client.script(
                scripts.COMMIT,
                [keys.meta, keys.fences, keys.lease(self.name), keys.cursor(self.name)],
                [
                    store.epoch,
                    self.name,
                    fence,
                    store.holder_text(record) if record is not None else "",
                    store.lease_ttl_ms if record is not None else 0,
                    data,
                ],
                f"commit {self.name}'s cursor",
            )
        except ResponseError as exc:
            raise store.script_error(exc, self.name, "commit a cursor", record) from None
        self._gen = int(gen)

    async def quarantine(self, item: Corrupt) -> None:
        if self.tail:
            raise UsageError(f"a tail reader of {self.name}'s inbox cannot quarantine")
        store = self._store
        seq = item.at[1]
        record = {
            "at": list(item.at),
            "end": list(item.end),
            "seq": seq,
            "reason": item.reason,
            "ts": time.time(),
            "raw": item.raw.decode("utf-8", "backslashreplace"),
        }
        keys = store.keys
        try:
            await store.client.script(
                scripts.QUARANTINE,
                [keys.meta, keys.qupto, keys.quarantine(self.name)],
                [store.epoch, self.name, seq, json.dumps(record, separators=(",", ":"))],
                f"quarantine a record of {self.name}'s inbox",
            )
        except ResponseError as exc:
            raise store.script_error(exc, self.name) from None

    async def changed_elsewhere(self) -> bool:
        if self.tail:
            return False
        gen = await self._store.client.call(
            "HGET",
            self._store.keys.cursor(self.name),
            "gen",
            what=f"read {self.name}'s cursor",
            change=False,
        )
        return (None if gen is None else int(gen)) != self._gen

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._buffer.clear()
            self._store.watcher.detach(self)

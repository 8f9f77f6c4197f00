"""Cursor arithmetic, with no I/O: what an inbox's owner has handled, and acks in any order.

Theory of operation. A `Cursor` is the committed position: everything before it is handled, plus
runs of records handled beyond it (`ahead`), the recently handled ids (to drop a retried sender's
duplicates) and a check the store writes of what lies before the position (so a store can notice
an inbox that changed under it). Positions are opaque pairs that only the store interprets (for
the file store a segment and a byte offset); here they are only compared. An `AckTracker` turns
deliveries (in log order) and acks (in any order) into the next cursor to commit, at a cost per
ack that does not grow with the number of acks waiting behind an unacked envelope.

Nothing here may touch a file, a lock or the event loop; everything is tested in memory.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Any

#: How many recently handled ids the committed cursor keeps for dropping duplicates.
RECENT_IDS_PERSISTED = 64  # keeps a cursor slot within one 4 KiB page


#: A place in an inbox, owned by its store: ordered, and opaque to everything above the store.
#: The file store's is (segment number, byte offset within it).
Position = tuple[int, int]
#: A run of handled records beyond the cursor: every record whose end lies in (from, to], as
#: the two positions' parts (from[0], from[1], to[0], to[1]).
Range = tuple[int, int, int, int]
#: Out-of-order ack runs persisted in the cursor; runs past this stay in memory only (their
#: envelopes are delivered again after a restart) until the owner acks its oldest gap.
MAX_PERSISTED_RUNS = 256


@dataclass(frozen=True, slots=True)
class Cursor:
    """What an inbox's owner has handled: everything before the position `(segment, offset)`,
    plus the runs of records handled beyond it (`ahead`, acks in any order).

    The position's two parts belong to the store (the names are the file store's: a segment
    number and a byte offset). `seq` is the seq of the last envelope before the position (-1 if
    none), used to report lag. `recent` holds the most recently handled ids; an envelope carrying
    one of them again (a sender that retried after a crash) is a duplicate and is dropped. `tail`
    is the store's check of what lies before the position (the file store's CRC-32 of the 256
    bytes before the offset), so that an inbox truncated or replaced under the cursor is noticed;
    `head`, `ino`, `born` and `igen` are the file store's further marks of the file the position
    is in (the CRC of its first 256 bytes, its inode number, birth time and inode generation; 0
    where not known).
    `acked` is the format's older way of saying what was handled ahead (ids); it is read, never
    written.
    """

    segment: int = 0
    offset: int = 0
    seq: int = -1
    acked: tuple[str, ...] = ()
    recent: tuple[str, ...] = ()
    ahead: tuple[Range, ...] = ()
    tail: str | None = None
    head: str | None = None
    ino: int = 0
    born: int = 0
    igen: int = 0

    def to_json_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": 1,
            "segment": self.segment,
            "offset": self.offset,
            "seq": self.seq,
            "ahead": [list(r) for r in self.ahead],
            "recent": list(self.recent),
        }
        if self.acked:
            data["acked"] = list(self.acked)
        if self.tail is not None:
            data["tail"] = self.tail
        if self.head is not None:
            data["head"] = self.head
        if self.ino:
            data["ino"], data["born"], data["igen"] = self.ino, self.born, self.igen
        return data

    @property
    def position(self) -> Position:
        return (self.segment, self.offset)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> Cursor:
        """The cursor `to_json_dict` wrote. `ValueError` (as for a missing or mistyped field)
        for positions no store writes: a negative segment, offset or seq below -1, or a run
        ahead that is negative or ends where it starts (each store says which cursor, and what
        to do)."""
        ahead = tuple((int(a), int(b), int(c), int(d)) for a, b, c, d in data.get("ahead", ()))
        tail = data.get("tail")
        cursor = cls(
            int(data["segment"]),
            int(data["offset"]),
            int(data.get("seq", -1)),
            tuple(str(x) for x in data.get("acked", ())),
            tuple(str(x) for x in data.get("recent", ())),
            ahead,
            None if tail is None else str(tail),
            None if data.get("head") is None else str(data["head"]),
            int(data.get("ino", 0)),
            int(data.get("born", 0)),
            int(data.get("igen", 0)),
        )
        if cursor.segment < 0 or cursor.offset < 0 or cursor.seq < -1:
            raise ValueError(
                f"a negative position (segment {cursor.segment}, offset {cursor.offset}, "
                f"seq {cursor.seq}), which no store writes"
            )
        for a, b, c, d in ahead:
            if min(a, b, c, d) < 0 or (a, b) >= (c, d):
                raise ValueError(f"a run ahead {[a, b, c, d]} that is negative or empty")
        return cursor


class AckTracker:
    """Turns deliveries and acks (in any order) into the cursor to commit, at a cost per ack
    that does not grow with the number of acks held behind an unacked envelope.

    Every item read from the log must pass through it in log order, as `deliver` (an envelope
    the owner will ack) or `skipped` (a corrupt line or a duplicate, handled at once). Items get
    consecutive indexes; handled items beyond the first unhandled one form runs of indexes,
    merged with their neighbours in O(1) per ack (two dicts keyed by each run's first and last
    index), and the cursor persists the runs as byte ranges.
    """

    def __init__(
        self,
        committed: Cursor | None = None,
        memory: int = 4096,
        max_runs: int = MAX_PERSISTED_RUNS,
    ) -> None:
        self.committed = committed = committed or Cursor()
        self.memory = memory  # ids remembered in-process for dedup (the cursor persists fewer)
        self.max_runs = max_runs
        self._base = 0  # index of the first item not yet passed by the cursor
        self._next = 0
        # index -> (the two parts of the end position, seq) of items not yet passed
        self._items: dict[int, tuple[int, int, int]] = {}
        self._outstanding: dict[str, int] = {}  # delivered, not acked: id -> index
        self._by_first: dict[int, int] = {}  # handled runs: first index -> last index
        self._by_last: dict[int, int] = {}  # and last index -> first index
        self._firsts: list[int] = []  # every run's first index, sorted (bisect: C speed)
        self._recent: deque[str] = deque()
        self._persisted: deque[str] = deque(maxlen=RECENT_IDS_PERSISTED)
        self._recent_set: set[str] = set()
        self._legacy_acked = set(committed.acked)  # from a cursor in the older format
        self._restart_runs = sorted(committed.ahead)  # handled before a restart
        self._restart_i = 0
        for id_ in committed.recent:
            self._remember(id_)

    def deliver(self, id_: str, segment: int, end: int, seq: int | None) -> bool:
        """Record a delivery in log order; False (the line is then skipped) if `id_` was
        handled already: recently, ahead of the cursor before a restart, or delivered and not
        yet acked."""
        seq = -1 if seq is None else seq
        if (
            id_ in self._recent_set
            or id_ in self._outstanding
            or (self._restart_runs and self._handled_before_restart(segment, end))
            or (self._legacy_acked and self._legacy_acked_once(id_))
        ):
            self._mark(self._add(segment, end, seq))
            return False
        self._outstanding[id_] = self._add(segment, end, seq)
        return True

    def skipped(self, end: Position, seq: int | None = None, id_: str | None = None) -> None:
        """An item handled without the owner's ack: a corrupt line, a duplicate, an acked id."""
        self._mark(self._add(end[0], end[1], -1 if seq is None else seq))

    def ack(self, id_: str) -> bool:
        """Mark `id_` handled; False if it was not delivered or is already acked."""
        index = self._outstanding.pop(id_, None)
        if index is None:
            return False
        self._mark(index)
        self._remember(id_)
        return True

    def cursor(self) -> Cursor:
        """Advance over the handled prefix and return the cursor to commit."""
        committed = self.committed
        segment, offset, seq = committed.segment, committed.offset, committed.seq
        items = self._items
        last = self._by_first.pop(self._base, None)
        if last is not None:
            del self._by_last[last]
            del self._firsts[0]  # the smallest first index is the base
            for index in range(self._base, last + 1):
                entry_segment, end, entry_seq = items.pop(index)
                if entry_seq >= 0:
                    seq = entry_seq
            segment, offset = entry_segment, end
            self._base = last + 1
        runs = self._by_first
        ahead = tuple(
            items[first - 1][:2] + items[runs[first]][:2] for first in self._firsts[: self.max_runs]
        )
        self.committed = Cursor(segment, offset, seq, (), tuple(self._persisted), ahead)
        return self.committed

    @property
    def unacked(self) -> int:
        return len(self._outstanding)

    def is_outstanding(self, id_: str) -> bool:
        """True if `id_` was delivered and is not acked yet."""
        return id_ in self._outstanding

    def _add(self, segment: int, end: int, seq: int) -> int:
        """The next item in log order, ending at `(segment, end)`: its index."""
        index = self._next
        self._next = index + 1
        self._items[index] = (segment, end, seq)
        return index

    def _mark(self, index: int) -> None:
        first = last = index
        before = self._by_last.pop(index - 1, None)
        if before is not None:
            del self._by_first[before]
            first = before
        after = self._by_first.pop(index + 1, None)
        if after is not None:
            del self._by_last[after]
            last = after
        self._by_first[first] = last
        self._by_last[last] = first
        firsts = self._firsts
        if after is None:
            if before is None:  # a new run (appending, in the usual case)
                if not firsts or firsts[-1] < index:
                    firsts.append(index)
                else:
                    bisect.insort(firsts, index)
        elif before is None:  # the run that started at index + 1 now starts at index
            firsts[bisect.bisect_left(firsts, index + 1)] = index
        else:  # two runs became one: the later one's first index goes
            del firsts[bisect.bisect_left(firsts, index + 1)]

    def _handled_before_restart(self, segment: int, end: int) -> bool:
        runs, position = self._restart_runs, (segment, end)
        while self._restart_i < len(runs) and position > runs[self._restart_i][2:]:
            self._restart_i += 1
        if self._restart_i == len(runs):
            self._restart_runs = []
            return False
        return position > runs[self._restart_i][:2]

    def _legacy_acked_once(self, id_: str) -> bool:
        if id_ in self._legacy_acked:
            self._legacy_acked.discard(id_)
            return True
        return False

    def _remember(self, id_: str) -> None:
        if id_ in self._recent_set:
            return
        self._recent.append(id_)
        self._persisted.append(id_)
        self._recent_set.add(id_)
        if len(self._recent) > self.memory:
            self._recent_set.discard(self._recent.popleft())

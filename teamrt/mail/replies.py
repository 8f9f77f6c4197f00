"""The answers one inbox's requests wait for, and what it knows of the requests already done.

An inbox hands a response to the `request()` awaiting it (`Inbox.expect_reply`) only if it
comes from the member that was asked. `Replies` keeps those requests, and remembers the last
requests answered (a second answer to one is dropped) and timed out (an answer still coming
from the member asked is received and counted late; one from anyone else is rejected).

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

from collections import deque
from enum import Enum

import msgspec

from teamrt.envelopes import Response

_REMEMBERED_REQUESTS = 4096


class _Recent:
    """Remembers the most recent `size` keys, each with a value (None if not given)."""

    __slots__ = ("_items", "_order", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: dict[str, str | None] = {}
        self._order: deque[str] = deque()  # oldest first

    def add(self, key: str, value: str | None = None) -> None:
        items = self._items
        if key in items:
            return
        items[key] = value
        order = self._order
        order.append(key)
        if len(order) > self._size:
            del items[order.popleft()]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> str | None:
        return self._items.get(key)


class PendingReply(msgspec.Struct, gc=False):
    """What a `request()` waits for (`Inbox.expect_reply`): the answer to `request_id` from
    `expected`, the member that was asked; `response` once it came.

    A msgspec struct, not tracked by the garbage collector: one is made per request, and
    nothing it holds refers back to it."""

    request_id: str
    expected: str
    response: Response | None = None


class Unmatched(Enum):
    """What becomes of a response that no pending request takes (`Replies.unmatched`)."""

    RECEIVE = "receive"  # an envelope like any other (perhaps a late answer, counted)
    DROP = "drop"  # acked and dropped: a second answer, or one from a member not asked


class Replies:
    """The pending requests of one inbox by request id, and the requests done lately."""

    __slots__ = ("answered", "duplicates", "late", "pending", "rejected", "timed_out")

    def __init__(self) -> None:
        self.pending: dict[str, PendingReply] = {}  # request id: what its request() awaits
        self.answered = _Recent(_REMEMBERED_REQUESTS)
        self.timed_out = _Recent(_REMEMBERED_REQUESTS)  # request id: the member asked
        self.duplicates = 0  # second answers to a request already answered
        self.late = 0  # answers that came after their request timed out
        self.rejected = 0  # answers from a member the request did not ask

    def expect(self, request_id: str, asked: str) -> PendingReply:
        """Wait for the answer to `request_id` from `asked`."""
        reply = PendingReply(request_id, asked)
        self.pending[request_id] = reply
        return reply

    def give_up(self, reply: PendingReply, *, timed_out: bool) -> None:
        """Stop waiting for `reply` (see `Inbox.give_up_reply`)."""
        self.pending.pop(reply.request_id, None)
        if timed_out and reply.response is None:
            self.timed_out.add(reply.request_id, reply.expected)

    def reject(self) -> Unmatched:
        """An answer to a pending request from a member it did not ask: counted, dropped."""
        self.rejected += 1
        return Unmatched.DROP

    def unmatched(self, request_id: str, sender: str) -> Unmatched:
        """What to do with an answer to `request_id` from `sender` that no pending request
        takes: drop a second answer, or a late one from a member not asked; receive the rest
        (a late answer from the member asked is counted)."""
        if request_id in self.answered:
            self.duplicates += 1
            return Unmatched.DROP
        if request_id in self.timed_out:
            if sender != self.timed_out.get(request_id):  # not from the member asked
                return self.reject()
            self.late += 1
        return Unmatched.RECEIVE

"""What an inbox does with an answer no pending request takes (`Replies`), as a table: a
second answer is dropped, a late one from the member asked is received and counted late, one
from anyone else is rejected. No event loop: `Replies` is plain bookkeeping."""

from __future__ import annotations

import pytest

from teamrt.mail.inbox import PendingReply as OldPlace
from teamrt.mail.replies import PendingReply, Replies, Unmatched


def test_pending_reply_keeps_its_old_import_path() -> None:
    assert OldPlace is PendingReply


def _replies_with(history: str) -> Replies:
    """Replies that have seen request "r1" (asked of "worker") end as `history` says."""
    replies = Replies()
    reply = replies.expect("r1", "worker")
    if history == "answered":
        replies.pending.pop("r1")
        replies.answered.add("r1")
    elif history == "timed out":
        replies.give_up(reply, timed_out=True)
    elif history == "given up":
        replies.give_up(reply, timed_out=False)
    return replies


@pytest.mark.parametrize(
    ("history", "sender", "verdict", "duplicates", "late", "rejected"),
    [
        ("answered", "worker", Unmatched.DROP, 1, 0, 0),
        ("answered", "intruder", Unmatched.DROP, 1, 0, 0),
        ("timed out", "worker", Unmatched.RECEIVE, 0, 1, 0),
        ("timed out", "intruder", Unmatched.DROP, 0, 0, 1),
        ("given up", "worker", Unmatched.RECEIVE, 0, 0, 0),
        ("given up", "intruder", Unmatched.RECEIVE, 0, 0, 0),
    ],
)
def test_an_unmatched_answer(
    history: str, sender: str, verdict: Unmatched, duplicates: int, late: int, rejected: int
) -> None:
    replies = _replies_with(history)
    assert replies.unmatched("r1", sender) is verdict
    assert (replies.duplicates, replies.late, replies.rejected) == (duplicates, late, rejected)
    assert replies.pending == {}


def test_an_answer_to_a_request_never_made_is_received() -> None:
    replies = Replies()
    assert replies.unmatched("never", "worker") is Unmatched.RECEIVE
    assert (replies.duplicates, replies.late, replies.rejected) == (0, 0, 0)


def test_a_reply_that_came_is_not_remembered_as_timed_out() -> None:
    replies = Replies()
    reply = replies.expect("r1", "worker")
    reply.response = object()  # type: ignore[assignment]  # (only its presence matters)
    replies.give_up(reply, timed_out=True)
    assert "r1" not in replies.timed_out


def test_a_rejected_answer_to_a_pending_request_is_counted() -> None:
    replies = Replies()
    replies.expect("r1", "worker")
    assert replies.reject() is Unmatched.DROP
    assert replies.rejected == 1
    assert "r1" in replies.pending  # the real answer may still come

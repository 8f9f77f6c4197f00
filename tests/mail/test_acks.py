"""Acks in any order: the cursor stays bounded and each ack costs the same however many acks
wait behind an unacked envelope; after a restart exactly the unacked envelopes come again."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrt import Envelope, FileMailboxes
from teamrt.mail.filestore import read_cursor
from teamrt.mail.log import AckTracker, Cursor
from tests.support.hypothesis_profiles import examples

MEMBERS = ("lead", "worker")


async def test_twenty_thousand_acks_behind_one_unacked_envelope(
    tmp_path: Path, stress: bool
) -> None:
    held = 100_000 if stress else 20_000
    team = tmp_path / "t"
    cursor_path = team / "inboxes" / "worker.cursor.json"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send_many([Envelope.message("lead", "worker", i) for i in range(held + 1)])
        inbox = mail.inbox("worker")
        got = [inbox.receive_nowait() for _ in range(held + 1)]
        for envelope in got[1:]:
            inbox.ack_nowait(envelope)
        await inbox.flush()
        cursor = read_cursor(cursor_path)[0]
        assert len(cursor.ahead) == 1 and cursor.offset == 0  # one run, one page
        assert cursor_path.stat().st_size == 8192
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("worker")
        first = inbox.receive_nowait()
        assert first.body == 0
        with pytest.raises(anyio.WouldBlock):
            inbox.receive_nowait()  # nothing else comes again
        await inbox.ack(first)
    assert read_cursor(cursor_path)[0].ahead == ()


def _restart_delivers(tracker: AckTracker, ids: list[str]) -> list[str]:
    """What a new owner gets again from the committed cursor (ends at 10, 20, ...)."""
    cursor = Cursor.from_json_dict(tracker.cursor().to_json_dict())
    again = AckTracker(Cursor(cursor.segment, cursor.offset, cursor.seq, (), (), cursor.ahead))
    out = []
    for i, id_ in enumerate(ids):
        end = (i + 1) * 10
        if (0, end) <= (cursor.segment, cursor.offset):
            continue
        if again.deliver(id_, 0, end, i):
            out.append(id_)
    return out


@settings(max_examples=examples(200))
@given(st.data())
def test_any_ack_order_redelivers_exactly_the_unacked(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 60))
    ids = [f"id{i}" for i in range(n)]
    tracker = AckTracker(Cursor(), max_runs=data.draw(st.integers(1, 8)))
    for i, id_ in enumerate(ids):
        assert tracker.deliver(id_, 0, (i + 1) * 10, i)
    acked = data.draw(st.lists(st.sampled_from(ids), unique=True))
    for id_ in acked:
        assert tracker.ack(id_)
        tracker.cursor()  # a commit after every ack, as ack() does
        assert tracker._firsts == sorted(tracker._by_first)  # the runs' index stays exact
    again = _restart_delivers(tracker, ids)
    unacked = [id_ for id_ in ids if id_ not in acked]
    # never lost: every unacked envelope comes again; past the run cap an acked one may too
    assert [id_ for id_ in again if id_ not in acked] == unacked
    if len(tracker.cursor().ahead) < tracker.max_runs:
        assert again == unacked
    assert len(tracker.cursor().ahead) <= tracker.max_runs

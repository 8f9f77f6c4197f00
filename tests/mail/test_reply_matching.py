"""The inbox's request/response matching through its public interface (`expect_reply`,
`wait_for_reply`, `give_up_reply`), the commit callback an inbox is made with, and the named
fast paths of the mail layer held to their plain paths."""

from __future__ import annotations

import math
import time

import pytest
from pydantic import BaseModel

from teamrt.envelopes import Envelope, payload_model, register_payload, registered_payload
from teamrt.mail import MemoryMailboxes
from teamrt.mail.inbox import Inbox, deadline_after
from teamrt.mail.log import stamp, stamp_many


async def test_a_reply_expected_from_the_member_asked_reaches_its_waiter() -> None:
    async with MemoryMailboxes(members=["lead", "worker", "other"]) as mail:
        lead = await mail.open_inbox("lead")
        request = Envelope.request("lead", "worker", "ping")
        reply = lead.expect_reply(request.id, "worker")
        assert lead.statistics().pending_requests == 1
        await mail.send(Envelope.response(request, "from other").model_copy(
            update={"sender": "other"}
        ))  # fmt: skip
        await mail.send(Envelope.response(request, "pong"))
        response = await lead.wait_for_reply(reply, deadline_after(5))
        assert response is not None and response.body == "pong"
        assert reply.response is response
        lead.give_up_reply(reply)  # answered: nothing to give up
        stats = lead.statistics()
        assert stats.pending_requests == 0 and stats.rejected_responses == 1
        assert stats.late_responses == 0


async def test_waiting_for_a_reply_that_does_not_come_ends_at_the_deadline() -> None:
    async with MemoryMailboxes(members=["lead", "worker"]) as mail:
        lead = await mail.open_inbox("lead")
        reply = lead.expect_reply("r" * 30, "worker")
        assert await lead.wait_for_reply(reply, time.monotonic() + 0.01) is None
        assert reply.response is None
        lead.give_up_reply(reply)
        assert lead.statistics().pending_requests == 0


@pytest.mark.parametrize("timed_out", [True, False])
async def test_an_answer_after_the_reply_was_given_up_is_received(timed_out: bool) -> None:
    async with MemoryMailboxes(members=["lead", "worker"]) as mail:
        lead = await mail.open_inbox("lead")
        request = Envelope.request("lead", "worker", "ping")
        reply = lead.expect_reply(request.id, "worker")
        lead.give_up_reply(reply, timed_out=timed_out)
        await mail.send(Envelope.response(request, "late"))
        got = await lead.receive(timeout=5)
        assert got.body == "late" and reply.response is None
        assert lead.statistics().late_responses == (1 if timed_out else 0)


async def test_an_inbox_asks_for_its_commit_through_the_callback_it_was_made_with() -> None:
    async with MemoryMailboxes(members=["lead", "worker"]) as mail:
        asked: list[str] = []
        inbox = Inbox(
            mail.store,
            "worker",
            commit_soon=lambda: asked.append("commit"),
            riding_out=mail.riding_out,
        )
        await inbox.open()
        try:
            await mail.send(Envelope.message("lead", "worker", "hello"))
            got = await inbox.receive(timeout=5)
            assert asked == []
            inbox.ack_nowait(got)
            assert asked == ["commit"]
            await inbox.flush()  # the committer's work, done here
            assert inbox.statistics().unacked == 0
        finally:
            await inbox.close()


@pytest.mark.parametrize("first", [0, 1, 7, 2**40])
@pytest.mark.parametrize("line", [b'"id":"x"}', b'"kind":"message","body":"' + b"y" * 300 + b'"}'])
def test_a_single_line_is_stamped_as_a_batch_of_one_is(first: int, line: bytes) -> None:
    """The appender stamps one line with `stamp` and a batch with `stamp_many`."""
    assert stamp_many([line], first, b"team") == stamp(line, first, b"team")
    two = stamp_many([line, line], first, b"team")
    assert two == stamp(line, first, b"team") + stamp(line, first + 1, b"team")


def test_registered_payload_is_payload_model_for_a_type_name() -> None:
    class Probe(BaseModel):
        n: int

    register_payload("reply-matching-probe", Probe)
    for name in ["reply-matching-probe", "message", "", "unregistered" * 3]:
        assert registered_payload(name) is payload_model(name)
    assert registered_payload("reply-matching-probe") is Probe


def test_no_deadline_is_infinite() -> None:
    assert deadline_after(None) == math.inf

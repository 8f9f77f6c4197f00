"""One conformance suite that every mailbox store must pass.

To run it against a store, subclass `MailboxConformance` in a test module and provide a `harness`
fixture returning a `StoreHarness` for your store:

    class TestMyStore(MailboxConformance):
        @pytest.fixture
        def harness(self, tmp_path):
            return StoreHarness(lambda: MyStore(...), write_raw=my_raw_writer)

`make_store()` must return a new store object over the *same* storage each time it is called, so
the suite can close and reopen mailboxes to check what survives (a store that keeps a team in
one object, like `MemoryStore`, returns that object). `write_raw(name, data)` appends raw bytes
to an inbox, bypassing the store (to test corrupt input).

Tests of what only some stores promise run where the store's `Capabilities` claim it: two store
objects on one team (`shared`), leases that expire (`leases_expire`, with the harness's
`expire_lease(name)` making a held lease lapse as if its holder had stopped renewing it), and
outages (`network`, with the harness's `outage()`: a context manager during which the store's
server does not answer).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import anyio
import pytest
from pydantic import BaseModel

from teamrt.codec import EnvelopeFields, decode_fields
from teamrt.envelopes import Envelope, Request, register_payload
from teamrt.errors import (
    BlobTooLarge,
    EnvelopeTooLarge,
    InvalidEnvelope,
    InvalidName,
    LeaseLost,
    MailboxClosed,
    MemberBusy,
    OutcomeUnknown,
    PayloadError,
    ReceiveTimeout,
    RemoteError,
    RequestTimeout,
    StoreUnavailable,
    TeamKeyMismatch,
    UnknownRecipient,
    UsageError,
)
from teamrt.mail.claims import Claim, claim_of
from teamrt.mail.log import encode, stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.store import Store


@dataclass
class StoreHarness:
    make_store: Callable[[], Store]
    write_raw: Callable[[str, bytes], None]
    expire_lease: Callable[[str], None] | None = None
    outage: Callable[[], AbstractContextManager[None]] | None = None
    #: a store for the outage test, with timeouts short enough to see an outage quickly; the
    #: others use `make_store`, whose timeouts no load should reach
    make_outage_store: Callable[[], Store] | None = None

    def open(self, members: Iterable[str] = ("lead", "worker", "writer")) -> Mailboxes:
        return Mailboxes(self.make_store(), members=members)


class ConformancePayload(BaseModel):
    topic: str
    pages: int


register_payload("conformance_task", ConformancePayload)


async def _drain(mail: Mailboxes, name: str) -> list[Envelope]:
    inbox = await mail.open_inbox(name)
    out = []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except anyio.WouldBlock:
            return out


class MailboxConformance:
    """Behaviour every store must show through the `Mailboxes` API."""

    @pytest.fixture
    def harness(self) -> StoreHarness:  # pragma: no cover - overridden by each store's tests
        raise NotImplementedError

    async def test_round_trip_assigns_seq_and_team(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            sent = Envelope.message("lead", "worker", {"text": "hi"}, trace_id="t1")
            await mail.send(sent)
            got = await (await mail.open_inbox("worker")).receive(timeout=5)
            assert got.id == sent.id
            assert got.seq == 0
            assert got.team == mail.team
            assert got.body == {"text": "hi"}
            assert got.trace_id == "t1"
            assert got.model_copy(update={"seq": None, "team": None}) == sent

    async def test_order_and_dense_seq_per_inbox(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            sent = [Envelope.message("lead", "worker", i) for i in range(50)]
            for envelope in sent:
                await mail.send(envelope)
            got = await _drain(mail, "worker")
            assert [e.id for e in got] == [e.id for e in sent]
            assert [e.seq for e in got] == list(range(50))

    async def test_seq_never_goes_backwards(self, harness: StoreHarness) -> None:
        """Not after records the store did not write (seq 0, a huge seq), nor after a reopen."""
        async with harness.open() as mail:
            for i in range(3):
                await mail.send(Envelope.message("lead", "worker", i))
            team = mail.team.encode()
            for body, seq in (("forged-huge", 2**62), ("forged-0", 0)):
                harness.write_raw(
                    "worker", stamp(encode(Envelope.message("lead", "worker", body)), seq, team)
                )
            await mail.send(Envelope.message("lead", "worker", "after"))
        async with harness.open() as mail:
            await mail.send(Envelope.message("lead", "worker", "reopened"))
            got = [e for e in await _drain(mail, "worker") if not str(e.body).startswith("forged")]
        assert [e.body for e in got] == [0, 1, 2, "after", "reopened"]
        seqs = [e.seq or 0 for e in got]
        assert seqs == sorted(set(seqs)), seqs  # strictly increasing
        assert seqs[-1] < 2**62, seqs  # and not dragged up by a record the store did not write

    async def test_concurrent_senders_lose_nothing(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:

            async def sender(name: str) -> None:
                for i in range(40):
                    await mail.send(Envelope.message(name, "worker", i))

            async with anyio.create_task_group() as tg:
                for name in ("lead", "writer", "w3", "w4"):
                    tg.start_soon(sender, name)
            got = await _drain(mail, "worker")
            assert sorted(e.seq for e in got) == list(range(160))  # type: ignore[type-var]
            for name in ("lead", "writer", "w3", "w4"):
                assert [e.body for e in got if e.sender == name] == list(range(40))

    async def test_receive_batch_drains_in_order(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            assert inbox.receive_batch_nowait() == []
            await mail.send_many([Envelope.message("lead", "worker", i) for i in range(25)])
            first = await inbox.receive_batch(max=10, timeout=5)
            rest = inbox.receive_batch_nowait(max=100)
            assert [e.body for e in first + rest] == list(range(25))
            assert len(first) == 10
            with pytest.raises(ReceiveTimeout):
                await inbox.receive_batch(timeout=0.05)
            with pytest.raises(UsageError):
                inbox.receive_batch_nowait(max=0)
            await inbox.ack(*first, *rest)
            assert inbox.statistics().unacked == 0

    async def test_drain_hands_out_checked_fields_without_models(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            assert inbox.drain_nowait() == []
            sent = [Envelope.message("lead", "worker", {"i": i}) for i in range(30)]
            await mail.send_many(sent)
            # a line that does not decode is quarantined on this path too
            harness.write_raw("worker", b'{"seq": 99, "kind": "message", oops\n')
            await mail.send(Envelope.message("lead", "worker", {"i": 30}))
            first = await inbox.drain(max=10, timeout=5)
            assert len(first) == 10
            got = first + inbox.drain_nowait(max=1000)
            while len(got) < 31:  # a network store hands out what it has fetched
                got += await inbox.drain(max=1000, timeout=5)
            assert all(isinstance(f, EnvelopeFields) for f in got)
            assert [f.body for f in got] == [{"i": i} for i in range(31)]
            # each record builds the envelope that was sent, stamped with seq and team
            assert [f.to_envelope() for f in got[:30]] == [
                e.model_copy(update={"seq": f.seq, "team": mail.team})
                for e, f in zip(sent, got, strict=False)
            ]
            assert inbox.statistics().quarantined == 1
            with pytest.raises(ReceiveTimeout):
                await inbox.drain(timeout=0.05)
            with pytest.raises(UsageError):
                inbox.drain_nowait(max=0)
            # released records come back first, to receive() as envelopes
            inbox.release(got[5])
            again = inbox.receive_nowait()
            assert again == got[5].to_envelope()
            await inbox.ack(*got[:20])  # the last eleven stay unacked
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            assert [f.body["i"] for f in inbox.drain_nowait()] == list(range(20, 31))

    async def test_drain_leaves_answers_to_the_requests_awaiting_them(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            lead = await mail.open_inbox("lead")
            worker = await mail.open_inbox("worker")

            async def answer() -> None:
                request = await worker.receive(timeout=5)
                await mail.send(Envelope.message("worker", "lead", "before the answer"))
                await mail.send(Envelope.response(request, "done", type="result"))
                await worker.ack(request)

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer)
                ask = Envelope.request("lead", "worker", "go", type="task", timeout=5)
                response = await mail.request(ask)
            assert response.body == "done"
            got = lead.drain_nowait()
            assert [f.body for f in got] == ["before the answer"]

    async def test_a_release_hands_an_envelope_out_once_and_never_after_its_ack(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            await mail.send_many([Envelope.message("lead", "worker", i) for i in range(3)])
            got = await inbox.receive_batch(max=3, timeout=5)
            while len(got) < 3:
                got += await inbox.receive_batch(max=3, timeout=5)
            inbox.release(got[0])
            with pytest.raises(UsageError, match="released already"):
                inbox.release(got[0])
            with pytest.raises(UsageError, match="released already"):
                inbox.release(got[1], got[1])
            inbox.release(got[1])
            await inbox.ack(got[0])  # handled after all, while it waited to come again
            assert [e.body for e in inbox.receive_batch_nowait()] == [1]
            await inbox.ack(got[1], got[2])
            assert inbox.drain_nowait() == []
            assert inbox.statistics().unacked == 0

    async def test_receive_nowait_and_timeout(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            with pytest.raises(anyio.WouldBlock):
                inbox.receive_nowait()
            with pytest.raises(ReceiveTimeout, match="nothing arrived in worker's inbox"):
                await inbox.receive(timeout=0.05)

    async def test_blocked_receiver_wakes_on_send(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            got: list[Envelope] = []

            async def receiver() -> None:
                got.append(await (await mail.open_inbox("worker")).receive(timeout=10))

            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver)
                await anyio.sleep(0.01)
                await mail.send(Envelope.message("lead", "worker", "wake"))
            assert [e.body for e in got] == ["wake"]

    async def test_unacked_envelopes_come_again_after_reopen(self, harness: StoreHarness) -> None:
        sent = [Envelope.message("lead", "worker", i) for i in range(5)]
        async with harness.open() as mail:
            for envelope in sent:
                await mail.send(envelope)
            inbox = await mail.open_inbox("worker")
            got = await _drain(mail, "worker")
            await inbox.ack(got[0], got[1], got[3])  # out of order: 2 and 4 stay unacked
        async with harness.open() as mail:
            again = await _drain(mail, "worker")
            assert [e.body for e in again] == [2, 4]
            await (await mail.open_inbox("worker")).ack(*again)
        async with harness.open() as mail:
            assert await _drain(mail, "worker") == []

    async def test_a_signed_team_refuses_a_missing_or_another_key(
        self, harness: StoreHarness
    ) -> None:
        """A team created with a key records it: an opening without it, or with another key,
        is refused before it writes anything (the roster is unchanged)."""
        key, other = "conformance team key, 32 bytes.", "another key, not the team's one."
        async with Mailboxes(harness.make_store(), members=["lead", "worker"], key=key) as mail:
            await mail.send(Envelope.message("lead", "worker", "signed"))
        for wrong in (None, other):
            with pytest.raises(TeamKeyMismatch):
                async with Mailboxes(harness.make_store(), members=["intruder"], key=wrong):
                    pass
        async with Mailboxes(harness.make_store(), key=key) as mail:
            assert await mail.members_now() == ("lead", "worker")
            assert [e.body for e in await _drain(mail, "worker")] == ["signed"]

    async def test_duplicate_ids_are_dropped(self, harness: StoreHarness) -> None:
        envelope = Envelope.message("lead", "worker", "once")
        async with harness.open() as mail:
            await mail.send(envelope)
            inbox = await mail.open_inbox("worker")
            first = await inbox.receive(timeout=5)
            await inbox.ack(first)
            await mail.send(envelope)  # a sender retrying after a crash
            await mail.send(Envelope.message("lead", "worker", "next"))
            assert [e.body for e in await _drain(mail, "worker")] == ["next"]
            assert inbox.statistics().duplicates_dropped == 1
        async with harness.open() as mail:  # the dedup window survives a restart
            await mail.send(envelope)
            got = await _drain(mail, "worker")
            assert [e.body for e in got] == ["next"]

    async def test_unknown_recipient_and_bad_names(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            with pytest.raises(UnknownRecipient, match="no member 'nobody'"):
                await mail.send(Envelope.message("lead", "nobody", "x"))
            for bad in ("../x", "..", "a/b", "", ".hidden", "a b", "x" * 65, "ü"):
                with pytest.raises((InvalidName, ValueError)):
                    await mail.send(Envelope.message("lead", bad, "x"))
                with pytest.raises(InvalidName):
                    await mail.add_member(bad)
            assert "nobody" not in mail.members

    # -- claim checks: payloads over max_envelope travel as blobs (teamrt/mail/claims.py) --

    async def test_blobs_are_kept_by_digest(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            claim, data = Claim.of("a blob's bytes " * 1000)
            assert mail.store.blob_get_nowait(claim.sha256) is None
            await mail.store.blob_put(claim.sha256, data)
            await mail.store.blob_put(claim.sha256, data)  # idempotent
            assert mail.store.blob_get_nowait(claim.sha256) == data
            with mail.store.view() as view:
                assert view.blob(claim.sha256) == data
                assert view.blob("0" * 64) is None

    async def test_an_oversized_payload_travels_as_a_claim_check(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            limit = mail.store.max_envelope
            text = Envelope.message("lead", "worker", "x" * limit)
            typed = Envelope.message(
                "lead", "worker", ConformancePayload(topic="y" * limit, pages=3)
            )
            await mail.send(text)
            await mail.send(typed)
            await mail.send(Envelope.message("lead", "worker", "small"))
            got = await _drain(mail, "worker")
            assert [e.id for e in got[:2]] == [text.id, typed.id]
            assert got[0].body == text.body
            assert got[2].body == "small"
            assert got[1].payload() == ConformancePayload(topic="y" * limit, pages=3)
            with mail.store.view() as view:
                references = [claim_of(decode_fields(e.raw).body) for e in view.scan("worker")]  # type: ignore[union-attr]
                assert [r is not None for r in references] == [True, True, False]
                assert all(view.blob(r.sha256) is not None for r in references if r is not None)

    async def test_over_max_blob_or_with_claim_checks_off_nothing_is_sent(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            limit = mail.store.max_envelope
            mail.store.max_blob = 2 * limit
            with pytest.raises(BlobTooLarge, match="over max_blob"):
                await mail.send(Envelope.message("lead", "worker", "x" * (3 * limit)))
            mail.store.max_blob = 0  # claim checks off: the envelope limit is the limit
            with pytest.raises(EnvelopeTooLarge, match="over the limit"):
                await mail.send(Envelope.message("lead", "worker", "x" * limit))
            await mail.send(Envelope.message("lead", "worker", "small"))
            assert [e.body for e in await _drain(mail, "worker")] == ["small"]

    async def test_a_claim_check_whose_blob_is_wrong_is_quarantined(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            team = mail.team.encode()
            good, _ = Claim.of("the real payload " * 100_000)
            await mail.store.blob_put(good.sha256, b"something else")  # a corrupt copy
            lying = Envelope.message("lead", "worker", good.body())
            harness.write_raw("worker", stamp(encode(lying), 0, team))
            invalid, bad_data = Claim.of({"topic": 1})  # intact, but not a ConformancePayload
            await mail.store.blob_put(invalid.sha256, bad_data)
            typed = Envelope.message("lead", "worker", invalid.body(), type="conformance_task")
            harness.write_raw("worker", stamp(encode(typed), 1, team))
            await mail.send(Envelope.message("lead", "worker", "after"))
            assert [e.body for e in await _drain(mail, "worker")] == ["after"]
            inbox = await mail.open_inbox("worker")
            assert inbox.statistics().quarantined == 2
            await inbox.flush()
            with mail.store.view() as view:
                reasons = [q["reason"] for q in view.quarantined("worker")]
            assert f"claim check blob {good.sha256} has 14 bytes" in reasons[0]
            assert "payload (from claim check blob" in reasons[1]

    async def test_payload_validated_on_send_and_receive(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            with pytest.raises(PayloadError, match="pages"):
                await mail.send(
                    Envelope.message("lead", "worker", {"topic": "x"}, type="conformance_task")
                )
            good = Envelope.message("lead", "worker", ConformancePayload(topic="x", pages=2))
            assert good.type == "conformance_task"
            await mail.send(good)
            # a line written by another program that does not fit the registered model
            bad = Envelope.message("lead", "worker", {"topic": 1}, type="conformance_task")
            harness.write_raw("worker", stamp(encode(bad), 99, mail.team.encode()))
            got = await _drain(mail, "worker")
            assert [e.id for e in got] == [good.id]
            assert got[0].payload() == ConformancePayload(topic="x", pages=2)
            assert (await mail.open_inbox("worker")).statistics().quarantined == 1

    async def test_corrupt_lines_are_quarantined_and_never_block(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            await mail.send(Envelope.message("lead", "worker", 1))
            team = mail.team.encode()
            harness.write_raw("worker", b"\x00\xff garbage\n")
            harness.write_raw("worker", b'{"seq": 5, "kind": "message", oops\n')
            harness.write_raw(
                "worker",
                stamp(encode(Envelope.message("lead", "worker", 2)), 7, team).replace(
                    b'"message"', b'"telegram"'
                ),
            )
            harness.write_raw("worker", b'{"kind":"message","sender":"lead"}\n')
            await mail.send(Envelope.message("lead", "worker", 3))
            got = await _drain(mail, "worker")
            assert [e.body for e in got] == [1, 3]
            assert (await mail.open_inbox("worker")).statistics().quarantined == 4
            await (await mail.open_inbox("worker")).ack(*got)
        async with harness.open() as mail:  # nothing comes back, nothing quarantined twice
            assert await _drain(mail, "worker") == []

    async def test_lines_read_two_ways_are_quarantined(self, harness: StoreHarness) -> None:
        """NaN (not JSON) and a key given twice (one reader keeps the first value, another
        the last) are quarantined on the owner's path and left out by the view's."""
        async with harness.open() as mail:
            team = mail.team.encode()
            line = stamp(encode(Envelope.message("lead", "worker", None)), 7, team)
            for old, new in [
                (b'"body":null', b'"body":NaN'),
                (b'"body":null', b'"body":{"a":[1,-Infinity]}'),
                (b'"sender":"lead"', b'"sender":"writer","sender":"lead"'),
                (b'"body":null', b'"body":{"to":"writer","to":"lead"}'),
            ]:
                harness.write_raw("worker", line.replace(old, new))
            await mail.send(Envelope.message("lead", "worker", "after"))
            got = await _drain(mail, "worker")
            assert [e.body for e in got] == ["after"]
            assert (await mail.open_inbox("worker")).statistics().quarantined == 4
            with mail.store.view() as view:
                scanned = [decode_fields(e.raw) for e in view.scan("worker")]
            assert [f.body for f in scanned if isinstance(f, EnvelopeFields)] == ["after"]

    async def test_unterminated_tail_is_not_corrupt(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            line = stamp(encode(Envelope.message("lead", "worker", "slow")), 0, mail.team.encode())
            harness.write_raw("worker", line[:20])  # a write in progress
            inbox = await mail.open_inbox("worker")
            with pytest.raises(anyio.WouldBlock):
                inbox.receive_nowait()
            harness.write_raw("worker", line[20:])
            assert (await inbox.receive(timeout=5)).body == "slow"
            assert inbox.statistics().quarantined == 0

    async def test_request_response(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:

            async def worker() -> None:
                inbox = await mail.open_inbox("worker")
                request = await inbox.receive(timeout=5)
                await mail.send(Envelope.response(request, {"sum": sum(request.body)}))
                await inbox.ack(request)

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                request = Envelope.request("lead", "worker", [1, 2, 3], type="add")
                response = await mail.request(request, timeout=5)
            assert response.body == {"sum": 6}
            assert response.in_reply_to == request.id
            assert response.sender == "worker"
            # the routed response was consumed: nothing left in lead's inbox
            assert await _drain(mail, "lead") == []

    async def test_request_while_other_mail_waits_in_the_inbox(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            await mail.send(Envelope.message("writer", "lead", "unrelated, unread"))

            async def worker() -> None:
                request = await (await mail.open_inbox("worker")).receive(timeout=5)
                await anyio.sleep(0.05)  # the requester waits meanwhile, and must not spin
                await mail.send(Envelope.response(request, "done"))

            got: list[Envelope] = []

            async def lead_receiver() -> None:
                got.append(await (await mail.open_inbox("lead")).receive(timeout=5))

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker)
                    response = await mail.request(
                        Envelope.request("lead", "worker", "q"), timeout=5
                    )
                    tg.start_soon(lead_receiver)
            assert response.body == "done"
            assert [e.body for e in got] == ["unrelated, unread"]

    async def test_error_response_raises_remote_error(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:

            async def worker() -> None:
                request = await (await mail.open_inbox("worker")).receive(timeout=5)
                await mail.send(Envelope.error(request, KeyError("no such page")))

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                with pytest.raises(RemoteError, match="worker failed: KeyError") as info:
                    await mail.request(Envelope.request("lead", "worker", "p9"), timeout=5)
            assert info.value.error_type == "KeyError"

    async def test_timeout_then_late_response_is_delivered(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            request = Envelope.request("lead", "worker", "slow job")
            with pytest.raises(RequestTimeout, match="late response will be delivered") as info:
                await mail.request(request, timeout=0.05)
            assert info.value.request.id == request.id
            received = await (await mail.open_inbox("worker")).receive(timeout=5)
            assert received.deadline is not None
            await mail.send(Envelope.response(received, "done at last"))
            late = await (await mail.open_inbox("lead")).receive(timeout=5)
            assert late.in_reply_to == request.id
            assert (await mail.open_inbox("lead")).statistics().late_responses == 1

    async def test_duplicate_responses_are_dropped(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:

            async def worker() -> None:
                request = await (await mail.open_inbox("worker")).receive(timeout=5)
                await mail.send(Envelope.response(request, "first"))
                await mail.send(Envelope.response(request, "second"))
                await mail.send(Envelope.message("worker", "lead", "after"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                response = await mail.request(Envelope.request("lead", "worker", "q"), timeout=5)
            assert response.body == "first"
            assert [e.body for e in await _drain(mail, "lead")] == ["after"]
            assert (await mail.open_inbox("lead")).statistics().duplicate_responses == 1

    async def test_request_requires_request_kind(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            with pytest.raises(ValueError, match="takes a request envelope"):
                await mail.request(Envelope.message("lead", "worker", "x"))  # type: ignore[arg-type]
            assert isinstance(Envelope.request("lead", "worker"), Request)

    async def test_broadcast_reaches_every_other_member(self, harness: StoreHarness) -> None:
        async with harness.open(["lead", "worker", "writer", "critic"]) as mail:
            broadcast = Envelope.broadcast("lead", "stand down", type="announcement")
            await mail.send(broadcast)
            for name in ("worker", "writer", "critic"):
                (got,) = await _drain(mail, name)
                assert (got.id, got.kind, got.recipient) == (broadcast.id, "broadcast", "*")
            assert await _drain(mail, "lead") == []

    async def test_send_many_keeps_order(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            batch = [
                Envelope.message("lead", "worker" if i % 3 else "writer", i) for i in range(30)
            ]
            await mail.send_many(batch)
            got = await _drain(mail, "worker")
            assert [e.body for e in got] == [i for i in range(30) if i % 3]
            assert [e.seq for e in got] == list(range(20))

    async def test_closed_mailboxes_refuse_use(self, harness: StoreHarness) -> None:
        mail = harness.open()
        async with mail:
            inbox = await mail.open_inbox("worker")
        with pytest.raises(MailboxClosed):
            await mail.send(Envelope.message("lead", "worker", "late"))
        with pytest.raises(MailboxClosed):
            inbox.receive_nowait()

    # -- trust and values (every store must hold these too) --

    async def test_request_takes_its_answer_only_from_the_member_asked(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail, anyio.create_task_group() as tg:

            async def forge_then_answer() -> None:
                request = await (await mail.open_inbox("worker")).receive(timeout=5)
                forged = Envelope.response(request, "forged").model_copy(
                    update={"sender": "writer"}
                )
                await mail.send(forged)
                await mail.send(Envelope.response(request, "real"))

            tg.start_soon(forge_then_answer)
            response = await mail.request(Envelope.request("lead", "worker", "q"), timeout=5)
            assert (response.sender, response.body) == ("worker", "real")
            assert (await mail.open_inbox("lead")).statistics().rejected_responses == 1

    async def test_misfiled_envelopes_are_quarantined(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            team = mail.team.encode()
            harness.write_raw(
                "worker", stamp(encode(Envelope.message("lead", "worker", 1)), 0, b"x")
            )
            harness.write_raw(
                "worker", stamp(encode(Envelope.message("lead", "writer", 2)), 1, team)
            )
            await mail.send(Envelope.message("lead", "worker", 3))
            assert [e.body for e in await _drain(mail, "worker")] == [3]
            assert (await mail.open_inbox("worker")).statistics().quarantined == 2

    async def test_nan_and_infinity_are_refused(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            with pytest.raises(InvalidEnvelope, match="NaN"):
                await mail.send(Envelope.message("lead", "worker", {"x": math.nan}))
            assert await _drain(mail, "worker") == []

    async def test_a_signed_team_quarantines_what_the_key_did_not_sign(
        self, harness: StoreHarness
    ) -> None:
        key = "conformance key, 32 bytes long.."
        async with Mailboxes(harness.make_store(), members=["lead", "worker"], key=key) as mail:
            unsigned = encode(Envelope.message("lead", "worker", "forged"))
            harness.write_raw("worker", stamp(unsigned, 0, mail.team.encode()))
            await mail.send(Envelope.message("lead", "worker", "signed"))
            assert [e.body for e in await _drain(mail, "worker")] == ["signed"]
            assert (await mail.open_inbox("worker")).statistics().quarantined == 1

    async def test_an_inbox_shares_its_stores_lease(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            lease = await mail.store.acquire_lease("worker", "a team of this process")
            inbox = await mail.open_inbox("worker")
            await lease.release()
            assert not mail.store.lease_held("worker")
            with pytest.raises(ReceiveTimeout):
                await inbox.receive(timeout=0.05)  # takes the lease for itself
            assert mail.store.lease_held("worker")

    # -- every store: opening inboxes, leases within one store object --

    async def test_open_inbox_works_on_every_store(self, harness: StoreHarness) -> None:
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            assert await mail.open_inbox("worker") is inbox  # one object per name
            await mail.send(Envelope.message("lead", "worker", "x"))
            assert (await inbox.receive(timeout=5)).body == "x"
            if mail.store.capabilities.opens_locally:
                assert mail.inbox("worker") is inbox

    async def test_a_released_lease_is_free_and_a_view_shows_the_inboxes(
        self, harness: StoreHarness
    ) -> None:
        async with harness.open() as mail:
            lease = await mail.store.acquire_lease("writer", "first")
            assert mail.store.lease_held("writer")
            assert not lease.lost.is_set()
            assert await mail.store.member_alive("writer") is True
            await lease.release()
            await lease.release()  # twice is harmless
            assert not mail.store.lease_held("writer")
            assert await mail.store.member_alive("writer") is False  # it ran, and stopped
            again = await mail.store.acquire_lease("writer", "second")
            assert again.fence >= lease.fence
            await again.release()
            await mail.send_many([Envelope.message("lead", "worker", i) for i in range(3)])
            with mail.store.view() as view:
                assert set(view.members()) >= {"lead", "worker", "writer"}
                entries = list(view.scan("worker"))
                assert len(entries) == 3
                rest = [e.raw for e in view.scan("worker", after=entries[0].end)]
                assert rest == [e.raw for e in entries[1:]]
                assert view.end("worker") == entries[-1].end

    # -- shared stores: two store objects on one team --

    async def test_two_store_objects_share_a_team(self, harness: StoreHarness) -> None:
        first = harness.make_store()
        if not first.capabilities.shared:
            pytest.skip(f"{type(first).__name__} keeps a team in one store object")
        async with (
            Mailboxes(first, members=["lead", "worker"]) as a,
            Mailboxes(harness.make_store()) as b,
        ):
            await a.add_member("critic")
            assert "critic" in await b.members_now()
            await b.send(Envelope.message("lead", "critic", "from b"))
            inbox = await a.open_inbox("critic")
            assert (await inbox.receive(timeout=5)).body == "from b"
            with pytest.raises(MemberBusy):
                await b.open_inbox("critic")  # a owns it

    async def test_a_held_lease_fences_effects_with_its_token(self, harness: StoreHarness) -> None:
        store = harness.make_store()
        async with Mailboxes(store, members=["lead", "worker"]) as mail:
            inbox = await mail.open_inbox("worker")
            fence = store.fence("worker")
            await fence.check()  # held: an effect may go ahead
            assert inbox.lease is not None
            assert fence.token == inbox.lease.fence
            record = store.lease_record("worker")
            assert record is not None
            assert record.known_held()
            await inbox.close()  # its lease released
            with pytest.raises(LeaseLost):
                store.fence("worker")  # not held: nothing may act for the member

    # -- stores whose leases expire --

    async def test_an_expired_lease_is_lost_and_its_commits_refused(
        self, harness: StoreHarness
    ) -> None:
        store = harness.make_store()
        if not store.capabilities.leases_expire or harness.expire_lease is None:
            pytest.skip(f"{type(store).__name__}'s leases do not expire")
        async with Mailboxes(store, members=["lead", "worker"]) as a:
            inbox = await a.open_inbox("worker")
            await a.send(Envelope.message("lead", "worker", 1))
            got = await inbox.receive(timeout=5)
            old_fence = inbox.lease.fence if inbox.lease is not None else -1
            harness.expire_lease("worker")
            async with Mailboxes(harness.make_store()) as b:
                successor = await b.open_inbox("worker")  # the lease lapsed: b takes it over
                assert successor.lease is not None
                assert successor.lease.fence > old_fence
                with anyio.fail_after(10):  # a's next renewal finds b's token
                    assert inbox.lease is not None
                    await inbox.lease.lost.wait()
                with pytest.raises(LeaseLost):
                    await inbox.ack(got)  # a stale holder cannot move the cursor
                again = await successor.receive(timeout=5)  # not acked: b gets it
                assert again.id == got.id
                await successor.ack(again)

    async def test_an_inbox_that_lost_its_lease_hands_out_nothing_more(
        self, harness: StoreHarness
    ) -> None:
        store = harness.make_store()
        if not store.capabilities.leases_expire or harness.expire_lease is None:
            pytest.skip(f"{type(store).__name__}'s leases do not expire")
        async with Mailboxes(store, members=["lead", "worker"]) as a:
            inbox = await a.open_inbox("worker")
            for i in range(3):
                await a.send(Envelope.message("lead", "worker", i))
            record = store.lease_record("worker")
            assert record is not None
            harness.expire_lease("worker")
            record.valid_until = -math.inf  # as after a pause past the time limit
            async with Mailboxes(harness.make_store()) as b:
                successor = await b.open_inbox("worker")  # b takes it over
                with pytest.raises(LeaseLost):
                    await inbox.receive(timeout=5)  # a stale holder: nothing handed out
                got = [await successor.receive(timeout=5) for _ in range(3)]
                assert [e.body for e in got] == [0, 1, 2]

    # -- network stores: outages --

    async def test_an_outage_fails_sends_clearly_then_nothing_is_lost_or_doubled(
        self, harness: StoreHarness
    ) -> None:
        store = (harness.make_outage_store or harness.make_store)()
        if not store.capabilities.network or harness.outage is None:
            pytest.skip(f"{type(store).__name__} is not reached over a network")
        async with Mailboxes(store, members=["lead", "worker"], send_retry=0.2) as mail:
            inbox = await mail.open_inbox("worker")
            await mail.send(Envelope.message("lead", "worker", "before"))
            outcomes: list[str] = []
            with harness.outage():
                for i in range(3):
                    try:
                        await mail.send(Envelope.message("lead", "worker", f"during {i}"))
                        outcomes.append("sent")
                    except (StoreUnavailable, OutcomeUnknown) as exc:
                        outcomes.append(type(exc).__name__)
            assert set(outcomes) <= {"sent", "StoreUnavailable", "OutcomeUnknown"}
            assert "sent" not in outcomes[:1]  # the first send saw the outage
            retried = Envelope.message("lead", "worker", "after")
            await mail.send(retried)
            await mail.send(retried)  # a retry of a send whose outcome was unknown
            bodies = []
            with anyio.fail_after(10):
                while "after" not in bodies:
                    envelope = await inbox.receive(timeout=5)
                    bodies.append(envelope.body)
                    await inbox.ack(envelope)
            assert bodies[0] == "before"
            assert bodies.count("after") == 1
            assert len(bodies) == len(set(bodies))  # nothing delivered twice

    # -- task records: idempotent asks --

    async def test_a_task_record_is_written_once_and_settled_once(
        self, harness: StoreHarness
    ) -> None:
        async with Mailboxes(harness.make_store(), members=["lead", "worker"]) as mail:
            store = mail.store
            first = {"member": "worker", "text": "charge it"}
            assert await store.task_record_create("r1", first) == first
            assert await store.task_record_create("r1", {"text": "other"}) == first
            assert await store.task_record_settle("r2", {"body": 1}) is None  # no record
            assert await store.task_record_settle("r1", {"body": 1}) == {
                **first,
                "outcome": {"body": 1},
            }
            assert await store.task_record_settle("r1", {"body": 2}) == {
                **first,
                "outcome": {"body": 1},
            }
            assert await store.task_record_create("r1", {}) == {**first, "outcome": {"body": 1}}
        async with Mailboxes(harness.make_store()) as mail:  # reopened: the record survives
            assert await mail.store.task_record_create("r1", {}) == {
                **first,
                "outcome": {"body": 1},
            }

    async def test_a_destroyed_team_keeps_no_task_record(self, harness: StoreHarness) -> None:
        store = harness.make_store()
        async with Mailboxes(store, members=["lead"]) as mail:
            await mail.store.task_record_create("r1", {"by": 1})
        doomed = harness.make_store()
        try:
            await doomed.destroy()
        except NotImplementedError:
            pytest.skip("the store cannot delete a team")
        finally:
            if doomed is not store:  # (a store that is the whole team is the same object)
                await doomed.close()
        async with Mailboxes(harness.make_store(), members=["lead"]) as mail:
            assert await mail.store.task_record_create("r1", {"by": 2}) == {"by": 2}

    async def test_concurrent_task_records_have_one_winner(self, harness: StoreHarness) -> None:
        stores = [harness.make_store()]
        if stores[0].capabilities.shared:
            stores.append(harness.make_store())
        async with contextlib.AsyncExitStack() as stack:
            opened = [
                await stack.enter_async_context(Mailboxes(s, members=["lead"])) for s in stores
            ]
            records: list[dict[str, object]] = []

            async def create(i: int) -> None:
                store = opened[i % len(opened)].store
                records.append(await store.task_record_create("r", {"by": i}))

            async def settle(i: int) -> None:
                store = opened[i % len(opened)].store
                record = await store.task_record_settle("r", {"by": i})
                assert record is not None
                records.append(record)

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(create, i)
            assert len({str(r) for r in records}) == 1
            records.clear()
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(settle, i)
            assert len({str(r["outcome"]) for r in records}) == 1

"""A hostile pass over the bulk read path and the request wait: the typed decode against
`decode_line` on nasty lines, and the Inbox's drain/receive/release/ack and `request()` waits
mixed in the ways a busy owner mixes them, on the file and memory stores (and Redis, when a
redis-server is installed)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from teamrt.codec import FIELD_NAMES, EnvelopeFields, decode_fields
from teamrt.envelopes import Envelope, Request
from teamrt.errors import MailboxClosed, ReceiveTimeout, RequestTimeout, UsageError
from teamrt.mail.filestore import FileStore
from teamrt.mail.inbox import Inbox
from teamrt.mail.log import decode_line, encode, stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.memory import MemoryStore
from teamrt.testing.conformance import StoreHarness
from tests.redis_server import REDIS_SERVER, RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture


def _file_harness(tmp_path: Path) -> StoreHarness:
    team = tmp_path / "team"

    def write_raw(name: str, data: bytes) -> None:
        fd = os.open(team / "inboxes" / f"{name}.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    return StoreHarness(lambda: FileStore(team), write_raw)


def _memory_harness() -> StoreHarness:
    store = MemoryStore("team")
    return StoreHarness(lambda: store, store.write_raw)


STORES = ["file", "memory", "redis"]


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    if request.param == "file":
        yield _file_harness(tmp_path)
    elif request.param == "memory":
        yield _memory_harness()
    else:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed")
        from teamrt.mail.redisstore import RedisStore

        server: RedisServer = request.getfixturevalue("shared_redis")
        url = server.url()  # a team of its own

        def no_raw(name: str, data: bytes) -> None:  # pragma: no cover - file/memory only
            raise NotImplementedError

        yield StoreHarness(lambda: RedisStore(url, socket_timeout=0.5, connect_timeout=0.5), no_raw)


@pytest.fixture(params=["file", "memory"])
def local_harness(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    """The stores whose inboxes a test writes raw lines to."""
    return _file_harness(tmp_path) if request.param == "file" else _memory_harness()


# --- request waits ----------------------------------------------------------------------------


async def test_an_answer_routed_by_a_drain_during_the_send_is_not_waited_for(
    harness: StoreHarness,
) -> None:
    """The owner drains its inbox in another task while a request is being sent: the answer can
    be read and routed to the request before the request starts waiting. It must be taken, not
    waited past (with no timeout and no liveness check, that wait would never end)."""
    async with harness.open() as mail:
        lead = await mail.open_inbox("lead")
        await mail.open_inbox("worker")
        real_send = mail.send

        async def send_then_answer_and_drain(envelope: Envelope) -> None:
            await real_send(envelope)
            if isinstance(envelope, Request):
                reply = lead._pending[envelope.id]
                await real_send(Envelope.response(envelope, "done"))
                while reply.response is None:  # the other task's drain routes the answer
                    assert lead.drain_nowait() == []
                    await anyio.sleep(0.001)

        mail.send = send_then_answer_and_drain  # type: ignore[method-assign]
        ask = Envelope.request("lead", "worker", "go")
        with anyio.fail_after(10):
            response = await mail.request(ask, require_live=False)
        assert response.body == "done"


async def test_a_request_that_gets_no_answer_times_out_and_its_late_answer_is_drained(
    harness: StoreHarness,
) -> None:
    async with harness.open() as mail:
        lead = await mail.open_inbox("lead")
        await mail.open_inbox("worker")  # alive, but it never answers
        ask = Envelope.request("lead", "worker", "go")
        with anyio.fail_after(10), pytest.raises(RequestTimeout):
            await mail.request(ask, timeout=0.2)
        assert lead.statistics().pending_requests == 0
        await mail.send(Envelope.response(ask, "late"))
        got = await lead.drain(timeout=5)
        assert [(f.kind, f.body) for f in got] == [("response", "late")]
        assert lead.statistics().late_responses == 1


async def test_a_cancelled_request_leaves_no_timer_and_the_inbox_works_on(
    harness: StoreHarness,
) -> None:
    async with harness.open() as mail:
        lead = await mail.open_inbox("lead")
        await mail.open_inbox("worker")
        ask = Envelope.request("lead", "worker", "go")
        with anyio.move_on_after(0.05):
            await mail.request(ask, timeout=0.3)
        assert lead.statistics().pending_requests == 0
        # the deadline's timer was cancelled with the wait
        loop = asyncio.get_running_loop()
        timers = [h for h in getattr(loop, "_scheduled", []) if h._callback == lead._signal_if]
        assert all(h.cancelled() for h in timers)
        # a receiver that starts waiting now is woken by mail, not by the old deadline, and the
        # answer to the cancelled request is an ordinary envelope (nobody awaits it)
        got: list[EnvelopeFields] = []

        async def drainer() -> None:
            got.extend(await lead.drain(timeout=5))

        async with anyio.create_task_group() as tg:
            tg.start_soon(drainer)
            await anyio.sleep(0.4)  # past the cancelled request's deadline
            assert got == []
            await mail.send(Envelope.response(ask, "after all"))
        assert [f.body for f in got] == ["after all"]


async def test_many_concurrent_requests_on_one_inbox_all_get_their_answers(
    harness: StoreHarness,
) -> None:
    count = 40
    async with harness.open() as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        answers: dict[int, object] = {}

        async def ask(i: int) -> None:
            response = await mail.request(Envelope.request("lead", "worker", i), timeout=30)
            answers[i] = response.body

        async def answer_in_batches() -> None:
            done = 0
            while done < count:
                batch = await worker.drain(max=7, timeout=10)
                for record in reversed(batch):  # answered out of order
                    await mail.send(
                        Envelope.response(
                            record.to_envelope(),  # type: ignore[arg-type]
                            record.body * 10,
                        )
                    )
                await worker.ack(*batch)
                done += len(batch)

        async def owner_drains() -> None:  # the lead's own loop drains beside the requests
            while len(answers) < count:
                assert lead.drain_nowait() == []
                await anyio.sleep(0.002)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_in_batches)
                tg.start_soon(owner_drains)
                for i in range(count):
                    tg.start_soon(ask, i)
        assert answers == {i: i * 10 for i in range(count)}
        stats = lead.statistics()
        assert (stats.pending_requests, stats.ready, stats.duplicate_responses) == (0, 0, 0)


# --- drain, receive, release and ack mixed, across restarts -----------------------------------


async def test_mixed_reads_releases_and_acks_lose_and_double_nothing_across_reopens(
    harness: StoreHarness,
) -> None:
    handled: list[int] = []
    async with harness.open() as mail:
        inbox = await mail.open_inbox("worker")
        await mail.send_many([Envelope.message("lead", "worker", i) for i in range(20)])
        first = await inbox.drain(max=5, timeout=5)  # 0-4
        second = [await inbox.receive(timeout=5) for _ in range(3)]  # 5-7
        assert [f.body for f in first] + [e.body for e in second] == list(range(8))
        inbox.release(first[1], second[0], first[3])  # a record, an envelope, a record
        with pytest.raises(UsageError):
            inbox.release(Envelope.message("lead", "worker", "never delivered"))
        again = inbox.drain_nowait(max=2)
        assert [f.body for f in again] == [1, 5]
        assert all(type(f) is EnvelopeFields for f in again)
        assert again[1] == decode_fields(_line_of(again[1]))  # a released model as a record
        assert (await inbox.receive(timeout=5)).body == 3
        await inbox.ack(first[0], again[0], second[1])  # 0, 1, 6
        inbox.ack_nowait(first[2])  # 2
        handled += [0, 1, 6, 2]
        with pytest.raises(UsageError):
            inbox.release(first[0])  # acked: it would be handled twice
        rest: list[EnvelopeFields] = []
        while len(rest) < 12:  # 8-19
            rest += await inbox.drain(max=100, timeout=5)
        assert [f.body for f in rest] == list(range(8, 20))
        await inbox.ack(*rest[::2])
        handled += [f.body for f in rest[::2]]
        await inbox.flush()
    for _ in range(2):  # twice: a reopen that reads and acks nothing changes nothing
        async with harness.open() as mail:
            inbox = await mail.open_inbox("worker")
            unacked = sorted(set(range(20)) - set(handled))
            got = await _drain_count(inbox, len(unacked), max=3)
            assert [f.body for f in got] == unacked
    async with harness.open() as mail:
        inbox = await mail.open_inbox("worker")
        await inbox.ack(*await _drain_count(inbox, len(unacked)))
    async with harness.open() as mail:
        inbox = await mail.open_inbox("worker")
        await _drain_count(inbox, 0)


async def _drain_count(inbox: Inbox, count: int, max: int = 256) -> list[EnvelopeFields]:
    """Exactly `count` records from `inbox` (a network store hands out what it has fetched:
    drain until they are all there), and then nothing more."""
    got: list[EnvelopeFields] = []
    while len(got) < count:
        got += await inbox.drain(max=max, timeout=5)
    with pytest.raises(ReceiveTimeout):
        await inbox.drain(timeout=0.05)
    assert len(got) == count
    return got


def _line_of(fields: EnvelopeFields) -> bytes:
    envelope = fields.to_envelope()
    return stamp(encode(envelope), fields.seq, (fields.team or "").encode())[:-1]


async def test_a_closed_inbox_refuses_drain_release_and_ack(harness: StoreHarness) -> None:
    async with harness.open() as mail:
        inbox = await mail.open_inbox("worker")
        await mail.send(Envelope.message("lead", "worker", 1))
        record = (await inbox.drain(timeout=5))[0]
    with pytest.raises(MailboxClosed):
        inbox.drain_nowait()
    with pytest.raises(MailboxClosed):
        await inbox.drain(timeout=0.05)
    with pytest.raises(MailboxClosed):
        inbox.release(record)
    with pytest.raises(MailboxClosed):
        await inbox.ack(record)
    with pytest.raises(UsageError):
        await inbox.drain(max=0)


async def test_drain_quarantines_misfiled_and_corrupt_lines_once(
    local_harness: StoreHarness,
) -> None:
    harness = local_harness
    async with harness.open() as mail:
        inbox = await mail.open_inbox("worker")
        team = mail.team.encode()
        good = Envelope.message("lead", "worker", "good")
        lines = [
            stamp(encode(Envelope.message("lead", "worker", "other team")), 0, b"elsewhere"),
            stamp(encode(Envelope.message("lead", "writer", "not mine")), 1, team),
            b'{"seq":2,"kind":"message",\n',
            stamp(encode(good), 3, team),
            stamp(encode(good), 4, team),  # the same id again: dropped
            stamp(encode(Envelope.broadcast("lead", "to all")), 5, team),
        ]
        harness.write_raw("worker", b"".join(lines))
        got = await _drain_count(inbox, 2)
        assert [f.body for f in got] == ["good", "to all"]
        stats = inbox.statistics()
        assert (stats.quarantined, stats.duplicates_dropped) == (3, 1)
        await inbox.ack(got[0])  # the broadcast stays unacked
    async with harness.open() as mail:
        inbox = await mail.open_inbox("worker")
        assert [f.body for f in await _drain_count(inbox, 1)] == ["to all"]
        assert inbox.statistics().quarantined == 0  # passed by the committed cursor
        assert len(list(mail.store.view().quarantined("worker"))) == 3


async def test_a_signed_team_drains_only_what_the_key_signed_and_releases_it(
    local_harness: StoreHarness,
) -> None:
    harness = local_harness
    key = "hostile key, thirty-two bytes.."
    async with Mailboxes(harness.make_store(), members=["lead", "worker"], key=key) as mail:
        inbox = await mail.open_inbox("worker")
        forged = stamp(encode(Envelope.message("lead", "worker", "forged")), 0, mail.team.encode())
        harness.write_raw("worker", forged)
        await mail.send_many([Envelope.message("lead", "worker", i) for i in range(3)])
        got = await _drain_count(inbox, 3)
        assert [f.body for f in got] == [0, 1, 2]
        assert inbox.statistics().quarantined == 1
        inbox.release(got[1])
        assert inbox.drain_nowait() == [got[1]]
        await inbox.ack(*got)

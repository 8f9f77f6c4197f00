"""The request/response path's shortcuts keep their promises: one deadline timer per inbox wakes
every waiter at its own deadline; a response handed to its `request()` is acked later (at the next
wait or commit) and still never comes to `receive()`, now or after a restart; the file reader's
first read takes no size; an append asks whether the log lost its name only after its write."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.codec import encode
from teamrt.errors import ReceiveTimeout, StoreCorrupt
from teamrt.mail.filestore.paths import FIRST_READ, READ_CHUNK
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.log import stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.memory import MemoryStore

MEMBERS = ["lead", "worker"]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line]


# --- one timer per inbox ------------------------------------------------------------------------


async def test_waiters_with_deadlines_in_any_order_each_time_out_at_their_own(
    tmp_path: Path,
) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        inbox = mail.inbox("worker")
        loop = asyncio.get_running_loop()
        ended: dict[float, float] = {}

        async def wait(timeout: float) -> None:
            start = loop.time()
            with pytest.raises(ReceiveTimeout):
                await inbox.receive(timeout)
            ended[timeout] = loop.time() - start

        timeouts = [0.3, 0.1, 0.2, 0.1, 0.0]  # a later deadline first, then earlier ones
        async with anyio.create_task_group() as tg:
            for timeout in timeouts:
                tg.start_soon(wait, timeout)
        assert sorted(ended) == sorted(set(timeouts))
        for timeout, took in ended.items():
            assert took >= timeout - 0.005  # asyncio's timers may fire a clock tick early
        assert not inbox._deadlines  # nothing left behind


async def test_many_waiters_with_shuffled_deadlines_go_by_the_inbox_heap(tmp_path: Path) -> None:
    """500 receivers, deadlines shuffled over 0.2 s: each wakes at (not before) its own, and the
    timer goes off once per deadline that comes, not once per waiter per waiter."""
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        inbox = mail.inbox("worker")
        loop = asyncio.get_running_loop()
        timeouts = [0.05 + i * 0.0003 for i in range(500)]
        random.Random(5).shuffle(timeouts)
        early: list[float] = []
        fired = 0
        expire = inbox._expire

        def counted() -> None:
            nonlocal fired
            fired += 1
            expire()

        inbox._expire = counted  # type: ignore[method-assign]

        async def wait(timeout: float) -> None:
            deadline = loop.time() + timeout
            with pytest.raises(ReceiveTimeout):
                await inbox.receive(timeout)
            if loop.time() < deadline - 0.005:
                early.append(timeout)

        async with anyio.create_task_group() as tg:
            for timeout in timeouts:
                tg.start_soon(wait, timeout)
        assert early == []
        assert not inbox._deadlines and len(inbox._heap) <= 16
        assert fired <= len(timeouts) + 10  # at most about once per deadline


async def test_a_woken_waiter_leaves_the_timer_to_the_others(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        inbox = mail.inbox("worker")
        results: list[object] = []

        async def receive(timeout: float) -> None:
            try:
                results.append((await inbox.receive(timeout)).body)
            except ReceiveTimeout:
                results.append("timeout")

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive, 0.05)  # the timer is armed for this one
            tg.start_soon(receive, 0.2)
            await anyio.sleep(0.01)
            await mail.send(Envelope.message("lead", "worker", "one"))  # wakes both
        # one got the envelope; the other waited again and timed out at its own deadline,
        # or got the envelope; never both the envelope
        assert sorted(map(str, results)) == ["one", "timeout"]


async def test_a_cancelled_waiter_does_not_keep_the_inbox_timer_for_itself(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        inbox = mail.inbox("worker")
        with anyio.move_on_after(0.02):
            await inbox.receive(0.01 + 3600)  # armed an hour ahead, then cancelled
        assert not inbox._deadlines
        with pytest.raises(ReceiveTimeout):
            await inbox.receive(0.05)  # a later, shorter wait still ends at its deadline


# --- routed responses are acked after the requester has them -----------------------------------


async def _answer(mail: Mailboxes, times: int = 1, twice: bool = False) -> None:
    worker = mail.inbox("worker")
    for _ in range(times):
        request = await worker.receive()
        response = Envelope.response(request, request.body)
        await mail.send(response)
        if twice:  # the same answer again, and another answer to the same request
            await mail.send(response)
            await mail.send(Envelope.response(request, "again"))
        await worker.ack(request)


@pytest.mark.parametrize("store", ["file", "memory"])
async def test_answered_requests_never_come_to_receive_now_or_after_a_restart(
    tmp_path: Path, store: str
) -> None:
    def mailboxes() -> Mailboxes:
        if store == "memory":
            return Mailboxes(MemoryStore("t"), members=MEMBERS)
        return FileMailboxes(tmp_path / "t", members=MEMBERS)

    async with mailboxes() as mail, anyio.create_task_group() as tg:
        tg.start_soon(_answer, mail, 3, True)
        for i in range(3):
            answer = await mail.request(Envelope.request("lead", "worker", i), timeout=10)
            assert answer.body == i
        lead = mail.inbox("lead")
        with pytest.raises(ReceiveTimeout):
            await lead.receive(0.05)  # the copies and second answers were dropped
        stats = lead.statistics()
        assert stats.unacked == 0 and stats.pending_requests == 0
        assert stats.duplicates_dropped == 3 and stats.duplicate_responses == 3
    if store == "memory":
        return  # a memory store's team ends with its process
    async with FileMailboxes(tmp_path / "t") as mail:
        with pytest.raises(ReceiveTimeout):
            await mail.inbox("lead").receive(0.05)  # the cursor passed every answer


async def test_a_flush_right_after_the_answer_commits_its_ack(tmp_path: Path) -> None:
    async with (
        Mailboxes(FileStore(tmp_path / "t"), members=MEMBERS, commit_delay=3600) as mail,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(_answer, mail)
        await mail.request(Envelope.request("lead", "worker", 1), timeout=10)
        lead = mail.inbox("lead")
        assert lead._routed  # not acked yet: nothing has waited on the inbox since
        await lead.flush()
        assert not lead._routed
        log = tmp_path / "t" / "inboxes" / "lead.jsonl"
        assert lead._tracker.committed.offset == log.stat().st_size  # past the answer
    async with FileMailboxes(tmp_path / "t") as mail:
        with pytest.raises(ReceiveTimeout):
            await mail.inbox("lead").receive(0.05)


# --- the reader's first read takes no size ------------------------------------------------------


@pytest.mark.parametrize(
    "size",
    [FIRST_READ - 2, FIRST_READ - 1, FIRST_READ, FIRST_READ + 1, READ_CHUNK + 1, 3 * FIRST_READ],
)
async def test_lines_around_the_first_reads_size_arrive_whole_and_once(
    tmp_path: Path, size: int
) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        base = len(Envelope.message("lead", "worker", "").model_dump_json())
        # a line of about `size` bytes (the stamp adds a few), then two small ones
        big = Envelope.message("lead", "worker", "x" * max(0, size - base - 16))
        await mail.send_many(
            [big, Envelope.message("lead", "worker", 1), Envelope.message("lead", "worker", 2)]
        )
        worker = mail.inbox("worker")
        got = [await worker.receive(5) for _ in range(3)]
        assert [e.id for e in got] == [big.id, *(e.id for e in got[1:])]
        assert got[0].body == big.body and [e.body for e in got[1:]] == [1, 2]
        with pytest.raises(ReceiveTimeout):
            await worker.receive(0.02)
        await mail.send(Envelope.message("lead", "worker", 3))
        assert (await worker.receive(5)).body == 3


async def test_a_line_written_in_two_halves_is_read_once_it_is_whole(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        worker = mail.inbox("worker")
        log = tmp_path / "t" / "inboxes" / "worker.jsonl"
        line = stamp(encode(Envelope.message("lead", "worker", "y" * FIRST_READ)), 0, b"t")[:-1]
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line[: FIRST_READ + 7])
            with pytest.raises(ReceiveTimeout):
                await worker.receive(0.05)
            os.write(fd, line[FIRST_READ + 7 :] + b"\n")
        finally:
            os.close(fd)
        assert (await worker.receive(5)).body == "y" * FIRST_READ


# --- an append asks whether the log lost its name after the write ------------------------------


async def test_a_log_replaced_by_a_rename_gets_the_next_send(tmp_path: Path) -> None:
    team = tmp_path / "t"
    log = team / "inboxes" / "worker.jsonl"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", 0))  # the appender holds the log
        copy = log.with_name("copy")
        shutil.copy(log, copy)
        os.rename(copy, log)  # the held descriptor's file has no name now
        await mail.send(Envelope.message("lead", "worker", 1))
        await mail.send(Envelope.message("lead", "worker", 2))
    assert [(line["seq"], line["body"]) for line in _lines(log)] == [(0, 0), (1, 1), (2, 2)]
    async with FileMailboxes(team) as mail:
        worker = mail.inbox("worker")
        assert [(await worker.receive(5)).body for _ in range(3)] == [0, 1, 2]


async def test_a_deleted_log_fails_the_send_that_found_it_deleted(tmp_path: Path) -> None:
    team = tmp_path / "t"
    log = team / "inboxes" / "worker.jsonl"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", 0))
        log.unlink()
        with pytest.raises(StoreCorrupt, match="is missing"):
            await mail.send(Envelope.message("lead", "worker", 1))
        assert not log.exists()  # never silently recreated


# --- answers after the request gave up ----------------------------------------------------------

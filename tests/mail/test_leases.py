"""One consumer per inbox, however it is opened: an inbox takes its member's lease, shared with a
Team of the same process (re-entrant per store), refused to any other owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes
from teamrt.errors import MemberBusy
from teamrt.mail.filestore import lease_holder
from tests.support.children import PROCS

MEMBERS = ("lead", "worker")


async def test_a_second_owner_of_an_inbox_is_refused_naming_the_holder(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as a, FileMailboxes(team) as b:
        a.inbox("worker")
        with pytest.raises(MemberBusy, match=rf"'worker' .* already running \(pid {os.getpid()}"):
            b.inbox("worker")
        assert lease_holder(team, "worker") == f"pid {os.getpid()}, inbox of worker"
    assert lease_holder(team, "worker") is None  # given up when the mailboxes close


async def test_a_second_process_cannot_consume_an_owned_inbox(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(100):
            await mail.send(Envelope.message("lead", "worker", i))
        inbox = mail.inbox("worker")
        effects = tmp_path / "effects"
        result = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, PROCS, "consume", str(team), str(effects), "100"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
        assert result.returncode != 0 and "MemberBusy" in result.stderr
        assert not effects.exists()  # it received nothing
        got: list[Envelope] = []
        while len(got) < 100:
            got.append(await inbox.receive(timeout=5))
    assert [e.body for e in got] == list(range(100))


@pytest.mark.parametrize("inbox_first", [False, True])
async def test_a_lease_is_shared_within_one_store_in_either_order(
    tmp_path: Path, inbox_first: bool
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail, FileMailboxes(team) as other:
        if inbox_first:
            inbox = mail.inbox("worker")
            lease = await mail.store.acquire_lease("worker", "pid 1, incarnation X")
        else:
            lease = await mail.store.acquire_lease("worker", "pid 1, incarnation X")
            inbox = mail.inbox("worker")
        assert lease_holder(team, "worker") == "pid 1, incarnation X"
        with pytest.raises(MemberBusy, match="incarnation X"):
            await other.store.acquire_lease("worker", "someone else")
        await lease.release()
        if inbox_first:  # the inbox still holds it
            with pytest.raises(MemberBusy):
                other.inbox("worker")
            return
        # the inbox only shared the Team's lease: once it is released, another owner may take
        # it, and this inbox is refused when it next reads
        taken = other.inbox("worker")
        await mail.send(Envelope.message("lead", "worker", "for the new owner"))
        with pytest.raises(MemberBusy):
            inbox.receive_nowait()
        assert (await taken.receive(timeout=5)).body == "for the new owner"


async def test_a_plain_inbox_cannot_take_a_running_teammates_inbox(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail, FileMailboxes(team) as other:
        lease = await mail.store.acquire_lease("worker", f"pid {os.getpid()}, incarnation T")
        with pytest.raises(MemberBusy, match="incarnation T"):
            other.inbox("worker")
        await lease.release()


async def test_memory_leases_are_reentrant_within_the_store() -> None:
    async with MemoryMailboxes(members=MEMBERS) as mail:
        lease = await mail.store.acquire_lease("worker", "team")
        mail.inbox("worker")  # shares the lease
        await lease.release()
        assert not mail.store.lease_held("worker")
        with pytest.raises(anyio.WouldBlock):
            mail.inbox("worker").receive_nowait()  # takes the lease again
        assert mail.store.lease_held("worker")


async def test_send_wait_collects_its_answer_without_consuming_the_senders_inbox(
    tmp_path: Path,
) -> None:
    """`teamrt send --wait` beside the lead's live owner: both see the answer, nobody is
    refused, and the owner's inbox is not consumed by the command."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail, anyio.create_task_group() as tg:
        lead = mail.inbox("lead")  # the live owner of the sender's inbox
        worker = mail.inbox("worker")

        async def answer() -> None:
            request = await worker.receive(timeout=10)
            await mail.send(Envelope.response(request, "approved"))
            await worker.ack(request)

        tg.start_soon(answer)
        cursor = team / "inboxes" / "lead.cursor.json"
        result = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [
                    *(sys.executable, "-m", "teamrt", "send", str(team)),
                    *("--from", "lead", "--to", "worker", "--kind", "request"),
                    *("--body", '"may I?"', "--wait", "20"),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["body"] == "approved"
        assert not cursor.exists()  # the command committed nothing in the lead's inbox
        owner_copy = await lead.receive(timeout=5)  # the owner got the answer as well
        assert owner_copy.body == "approved"


async def test_an_inbox_that_took_its_lease_back_reloads_what_another_owner_committed(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
        lease = await mail.store.acquire_lease("worker", "pid 1, incarnation A")
        inbox = mail.inbox("worker")  # shares incarnation A's lease
        assert inbox.receive_nowait().body == 0  # received, never acked
        await lease.release()
        async with FileMailboxes(team) as other:  # another owner handles everything meanwhile
            theirs = other.inbox("worker")
            await theirs.ack(*[theirs.receive_nowait() for _ in range(3)])
        await mail.send(Envelope.message("lead", "worker", 3))
        assert inbox.receive_nowait().body == 3  # not 1 and 2 again: it reloaded

"""File damage is reported, never silent: a log truncated, replaced or deleted under its cursor,
and a damaged cursor; `teamrt repair` brings each back and says what cannot be delivered."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.cli.main import main
from teamrt.errors import MemberBusy, StoreCorrupt
from teamrt.mail.filestore import read_cursor
from tests.mail.filestore.helpers import received_now

MEMBERS = ("lead", "worker")


async def _sent_and_handled(team: Path, count: int) -> None:
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(count):
            await mail.send(Envelope.message("lead", "worker", i))
        inbox = mail.inbox("worker")
        await inbox.ack(*await received_now(mail))


def _repair(team: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["repair", str(team), "--inbox", "worker"]) == 0
    return capsys.readouterr().out


async def test_truncation_below_the_cursor_is_reported_then_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    await _sent_and_handled(team, 30)
    log = team / "inboxes" / "worker.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:15]))  # someone truncates the log below the cursor
    async with FileMailboxes(team) as mail:
        for i in range(100, 125):  # 25 sends after the truncation
            await mail.send(Envelope.message("lead", "worker", i))
        with pytest.raises(StoreCorrupt) as caught:
            mail.inbox("worker")
    message = str(caught.value)
    assert str(log) in message and "teamrt repair" in message and "--inbox worker" in message
    assert "bytes before offset" in message  # the log grew past the cursor again: the CRC
    out = _repair(team, capsys)
    assert "not the file the cursor was written for" in out and "handled before the damage" in out
    assert "cannot be delivered" not in out  # every envelope that is gone had been handled
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == list(range(100, 125))  # none lost


async def test_a_log_shorter_than_the_cursor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    await _sent_and_handled(team, 10)
    log = team / "inboxes" / "worker.jsonl"
    data = log.read_bytes()
    os.truncate(log, data.index(b"\n", len(data) // 2) - 7)  # cut mid-line
    async with FileMailboxes(team) as mail:
        with pytest.raises(StoreCorrupt, match=r"is \d+ bytes, but the cursor says \d+ bytes"):
            mail.inbox("worker")
    out = _repair(team, capsys)
    assert "moved the cursor back to" in out and "sealed a torn last line" in out
    assert "bytes" in out and "are gone" in out
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "after"))
        got = await received_now(mail)
    assert [e.body for e in got] == ["after"]
    assert mail.inbox is not None


async def test_truncation_while_the_owner_reads_is_an_error_not_a_skip(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(10):
            await mail.send(Envelope.message("lead", "worker", i))
        assert len(await received_now(mail)) == 10
        os.truncate(team / "inboxes" / "worker.jsonl", 100)
        with pytest.raises(StoreCorrupt, match="shrank to 100 bytes below the read position"):
            mail.inbox("worker").receive_nowait()


async def test_a_deleted_log_is_never_silently_recreated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", "before"))
        (team / "inboxes" / "worker.jsonl").unlink()
        # the writer's descriptor points at the deleted file: writing there would lose the send
        with pytest.raises(StoreCorrupt, match=r"worker\.jsonl is missing.*teamrt repair"):
            await mail.send(Envelope.message("lead", "worker", "lost?"))
    async with FileMailboxes(team, members=MEMBERS) as mail:  # opening does not recreate it
        assert not (team / "inboxes" / "worker.jsonl").exists()
        with pytest.raises(StoreCorrupt, match="is missing"):
            mail.inbox("worker")
    out = _repair(team, capsys)
    assert "was missing: created an empty active log" in out
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "after"))
        assert [e.body for e in await received_now(mail)] == ["after"]


async def test_a_cursor_with_no_valid_slot_is_repaired_to_a_rescan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    await _sent_and_handled(team, 3)
    cursor = team / "inboxes" / "worker.cursor.json"
    cursor.write_bytes(b"\0" * 8192)
    out = _repair(team, capsys)
    assert "had no valid slot" in out
    assert read_cursor(cursor)[0].offset == 0 and read_cursor(cursor)[1] == 1
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [0, 1, 2]  # at-least-once


async def test_repair_of_a_healthy_team_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    await _sent_and_handled(team, 3)
    before = (team / "inboxes" / "worker.cursor.json").read_bytes()
    capsys.readouterr()
    assert main(["repair", str(team), "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["ok"]) for r in reports] == [("lead", True), ("worker", True)]
    assert (team / "inboxes" / "worker.cursor.json").read_bytes() == before


async def test_repair_refuses_while_the_owner_runs(tmp_path: Path) -> None:
    from teamrt.mail.filestore.repair import repair_team

    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        mail.inbox("worker")
        with pytest.raises(MemberBusy, match="inbox of worker"):
            repair_team(team, "worker")


async def test_damage_found_by_the_rescan_never_cancels_the_mailboxes(tmp_path: Path) -> None:
    """The background rescan only wakes the owner; the error goes to whoever receives."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, rescan_interval=0.005) as mail:
        for i in range(5):
            await mail.send(Envelope.message("lead", "worker", i))
        inbox = mail.inbox("worker")
        assert len(await received_now(mail)) == 5
        os.truncate(team / "inboxes" / "worker.jsonl", 10)
        await anyio.sleep(0.05)  # several rescans see the damage
        with pytest.raises(StoreCorrupt):
            await inbox.receive(timeout=1)
        await mail.send(Envelope.message("worker", "lead", "the rest still works"))
        assert (await mail.inbox("lead").receive(timeout=1)).body == "the rest still works"


async def test_a_cursor_naming_a_missing_segment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from teamrt.mail.filestore.framing import encode_slot
    from teamrt.mail.log import Cursor

    team = tmp_path / "t"
    await _sent_and_handled(team, 2)
    slot = encode_slot(Cursor(5, 10, 40), 9, 4096)
    assert slot is not None
    (team / "inboxes" / "worker.cursor.json").write_bytes(slot + slot)
    async with FileMailboxes(team) as mail:
        with pytest.raises(StoreCorrupt, match="names segment 5, but the log has only"):
            mail.inbox("worker")
    out = _repair(team, capsys)
    assert "the cursor named segment 5" in out and "cannot be delivered" in out
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [0, 1]  # delivered again

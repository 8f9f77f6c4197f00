"""File-store behaviour beyond the conformance suite: torn tails, rollback, fsync, rotation,
permissions and hostile paths."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import (
    DiskFull,
    DurabilityError,
    Envelope,
    FileMailboxes,
    InvalidName,
    StoreError,
    UnknownRecipient,
)
from teamrt.mail import filestore
from teamrt.mail.filestore.framing import decode_all
from teamrt.mail.log import encode, stamp
from tests.mail.filestore.helpers import received_now

MEMBERS = ("lead", "worker")


def _log(team: Path, name: str = "worker") -> bytes:
    return (team / "inboxes" / f"{name}.jsonl").read_bytes()


def _append_raw(team: Path, data: bytes, name: str = "worker") -> None:
    with open(team / "inboxes" / f"{name}.jsonl", "ab") as f:
        f.write(data)


def _quarantine(team: Path, name: str = "worker") -> list[dict[str, Any]]:
    path = team / "inboxes" / f"{name}.quarantine.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_torn_tail_is_sealed_and_the_next_envelope_survives(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", "before"))
    # a writer killed mid-append leaves a fragment without a newline
    line = stamp(encode(Envelope.message("lead", "worker", "x" * 5000)), 1, b"t")
    _append_raw(team, line[: 4096 - len(_log(team))])
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "after"))
        got = await received_now(mail)
        assert [e.body for e in got] == ["before", "after"]
        assert [e.seq for e in got] == [0, 1]  # the fragment's seq was never acknowledged
        assert mail.store.statistics() == {"worker": 1}  # type: ignore[attr-defined]
    (entry,) = _quarantine(team)
    assert entry["offset"] == len(_log(team).split(b"\n")[0]) + 1
    assert entry["reason"].startswith("json:")
    assert entry["raw"].startswith('{"seq":1,')


async def test_hand_edited_line_is_quarantined_not_fatal(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
    path = team / "inboxes" / "worker.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"kind":"message"', b'"kind":"mesage"')
    path.write_bytes(b"\n".join(lines))
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [0, 2]
    (entry,) = _quarantine(team)
    assert "schema" in entry["reason"] and "mesage" in entry["raw"]


async def test_short_write_then_enospc_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", "kept"))
        size = len(_log(team))
        real_write = os.write
        calls = {"n": 0}

        def full_disk(fd: int, data: Any) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                return real_write(fd, bytes(data)[:37])  # a short write first, as tmpfs does
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full_disk)
        with pytest.raises(DiskFull, match="No space left on device; nothing was written"):
            await mail.send(Envelope.message("lead", "worker", "lost"))
        monkeypatch.setattr(os, "write", real_write)
        assert len(_log(team)) == size  # rolled back to the last good length
        await mail.send(Envelope.message("lead", "worker", "next"))
        got = await received_now(mail)
        assert [e.body for e in got] == ["kept", "next"]
        assert [e.seq for e in got] == [0, 1]
    assert _quarantine(team) == []


async def test_failed_fsync_is_an_error_never_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, durability="fsync", members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", "durable"))
        syncs = {"n": 0}

        def failing_sync(fd: int) -> None:
            syncs["n"] += 1
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing_sync)
        with pytest.raises(DurabilityError, match=r"fsync failed.*not acknowledged"):
            await mail.send(Envelope.message("lead", "worker", "unsure"))
        assert syncs["n"] == 1  # reported, not retried into a false success


async def test_group_commit_shares_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    team = tmp_path / "t"
    syncs = {"n": 0}
    real = os.fdatasync

    def counting_sync(fd: int) -> None:
        syncs["n"] += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting_sync)
    async with FileMailboxes(team, durability="fsync", members=MEMBERS) as mail:

        async def sender(k: int) -> None:
            for i in range(10):
                await mail.send(Envelope.message("lead", "worker", [k, i]))

        async with anyio.create_task_group() as tg:
            for k in range(16):
                tg.start_soon(sender, k)
        assert len(await received_now(mail)) == 160
    assert 0 < syncs["n"] < 160  # concurrent senders shared syncs


async def test_rotation_across_two_writers_keeps_seq_dense(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with (
        FileMailboxes(team, members=MEMBERS, segment_bytes=2000) as a,
        FileMailboxes(team, segment_bytes=2000) as b,
    ):
        # two stores hold their own descriptors, as two processes would
        for i in range(40):
            await (a if i % 3 else b).send(Envelope.message("lead", "worker", i))
        got = await received_now(a)
    assert [e.body for e in got] == list(range(40))
    assert [e.seq for e in got] == list(range(40))
    segments = sorted(p.name for p in (team / "inboxes").glob("worker.*.jsonl"))
    assert len(segments) >= 3 and segments[0] == "worker.000000.jsonl"
    # every segment holds whole lines only
    for path in (team / "inboxes").glob("worker*.jsonl"):
        if "quarantine" not in path.name:
            items, pending = decode_all(path.read_bytes())
            assert pending == 0 and all(hasattr(x, "envelope") for x in items)


async def test_reader_resumes_in_a_later_segment(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=1500) as mail:
        for i in range(10):
            await mail.send(Envelope.message("lead", "worker", i))
        inbox = mail.inbox("worker")
        got = await received_now(mail)
        await inbox.ack(*got[:9])
        for i in range(10, 20):
            await mail.send(Envelope.message("lead", "worker", i))
    cursor, _, _ = filestore.read_cursor(team / "inboxes" / "worker.cursor.json")
    assert cursor.segment > 0
    async with FileMailboxes(team, segment_bytes=1500) as mail:
        assert [e.body for e in await received_now(mail)] == list(range(9, 20))


async def test_permissions(tmp_path: Path) -> None:
    team = tmp_path / "root" / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", 1))
        inbox = mail.inbox("worker")
        await inbox.ack(await inbox.receive(timeout=5))
    for path in [team, team / "inboxes"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in [team / "team.json", *(team / "inboxes").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


async def test_unknown_recipient_creates_nothing(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        before = sorted(os.listdir(team / "inboxes"))
        with pytest.raises(UnknownRecipient, match=r"members: lead, worker"):
            await mail.send(Envelope.message("lead", "ghost", "boo"))
        with pytest.raises(UnknownRecipient):
            mail.inbox("ghost")
        assert sorted(os.listdir(team / "inboxes")) == before


async def test_member_added_by_another_process_is_seen(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as a, FileMailboxes(team) as b:
        await b.add_member("critic")
        await a.send(Envelope.message("lead", "critic", "hello"))  # a re-reads the roster
        assert (await b.inbox("critic").receive(timeout=5)).body == "hello"
        assert a.members == ("lead", "worker", "critic")


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "..",
        ".",
        "a/b",
        "/etc/passwd",
        "a\x00b",
        "",
        " ",
        ".hidden",
        "x" * 65,
        "x/../y",
        "\uff0e\uff0e/x",  # full-width dots
    ],
)
async def test_hostile_names_are_refused(tmp_path: Path, bad: str) -> None:
    team = tmp_path / "t"
    before = set(os.listdir(tmp_path))
    with pytest.raises(InvalidName):
        async with FileMailboxes(team, members=[bad]):
            pass
    async with FileMailboxes(team, members=MEMBERS) as mail:
        with pytest.raises(ValueError, match="recipient"):
            await mail.send(Envelope.message("lead", bad, "x"))
        with pytest.raises(InvalidName):
            mail.inbox(bad)
    assert set(os.listdir(tmp_path)) - before == {"t"}
    assert sorted(os.listdir(team / "inboxes")) == [
        "lead.jsonl",
        "lead.lock",
        "worker.jsonl",
        "worker.lock",
    ]


async def test_symlinked_inbox_is_refused(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    target = tmp_path / "elsewhere.jsonl"
    target.write_bytes(b"")
    log = team / "inboxes" / "worker.jsonl"
    log.unlink()
    log.symlink_to(target)
    with pytest.raises(StoreError, match="refused to follow a symbolic link"):
        async with FileMailboxes(team) as mail:
            await mail.send(Envelope.message("lead", "worker", "x"))
    assert target.read_bytes() == b""


async def test_seq_recovered_from_the_tail_not_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send_many([Envelope.message("lead", "worker", i) for i in range(3000)])
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "last"))
    assert sum(reads) <= 1 + filestore._TAIL_WINDOW < len(_log(team))
    assert _log(team).rsplit(b"\n", 2)[-2].startswith(b'{"seq":3000,')


async def test_leftover_cursor_tmp_is_ignored(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
        inbox = mail.inbox("worker")
        await inbox.ack(inbox.receive_nowait())
    # a consumer that died between writing the new cursor and renaming it
    (team / "inboxes" / "worker.cursor.json.tmp").write_text('{"v":1,"segment":0,"offset":9')
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [1, 2]
    assert not (team / "inboxes" / "worker.cursor.json.tmp").exists()


async def test_missing_team_with_create_false(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no team directory"):
        async with FileMailboxes(tmp_path / "nope", create=False):
            pass


async def test_cursor_commits_alternate_slots_and_grow(tmp_path: Path) -> None:
    team = tmp_path / "t"
    path = team / "inboxes" / "worker.cursor.json"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        sent = [Envelope.message("lead", "worker", i) for i in range(600)]
        await mail.send_many(sent)
        inbox = mail.inbox("worker")
        got = await received_now(mail)
        await inbox.ack(got[0])
        await inbox.ack(got[1])
        assert filestore.read_cursor(path)[1:] == (2, 4096)
        assert path.stat().st_size == 8192
        # 200 acks ahead of an unacked envelope are one run: the cursor stays one page
        await inbox.ack(*got[3:203])
        cursor, gen, slot = filestore.read_cursor(path)
        assert (gen, slot, len(cursor.ahead)) == (3, 4096, 1)
        # 150 more separate runs do not fit a 4 KiB slot: the file grows
        await inbox.ack(*got[204:504:2])
        cursor, gen, slot = filestore.read_cursor(path)
        assert (gen, len(cursor.ahead)) == (4, 151) and slot > 4096
        await inbox.ack(got[2])  # generation 5, into slot 1
        assert filestore.read_cursor(path)[0].offset > cursor.offset
    # a crash that tore the newest slot falls back to the previous commit (generation 4)
    slot_size = path.stat().st_size // 2
    data = bytearray(path.read_bytes())
    data[slot_size + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    async with FileMailboxes(team) as mail:
        again = await received_now(mail)
        assert [e.body for e in again] == [2, 203, *range(205, 504, 2), *range(504, 600)]


async def test_a_cursor_with_no_valid_slot_is_read_again_from_the_start(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
        inbox = mail.inbox("worker")
        await inbox.ack(inbox.receive_nowait())
    path = team / "inboxes" / "worker.cursor.json"
    for damage in (b"edited by hand\n", b""):
        path.write_bytes(damage)
        async with FileMailboxes(team) as mail:  # never unopenable: at-least-once from 0
            assert [e.body for e in await received_now(mail)] == [0, 1, 2]
        assert (team / "inboxes" / "worker.cursor.json.damaged").read_bytes() == damage


def test_running_out_of_descriptors_says_which_limit_and_what_holds_them(tmp_path: Path) -> None:
    # a process allowed few open files runs the inboxes of many members: the error names the
    # limit, what each member holds and what to do, not only "Too many open files"
    script = f"""
import resource, anyio
from teamrt.errors import StoreError
from teamrt.mail import FileMailboxes

async def main():
    names = [f"m{{i:03d}}" for i in range(200)]
    async with FileMailboxes({str(tmp_path / "team")!r}, members=names) as mail:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        try:
            for name in names:
                await mail.open_inbox(name)
        except StoreError as exc:
            print(exc)
        else:
            print("no error")

anyio.run(main)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    message = done.stdout.strip()
    assert "Too many open files" in message, done.stdout + done.stderr
    assert "may have 64 files open (RLIMIT_NOFILE" in message
    assert "each member whose inbox this process runs holds its lease open" in message
    assert "given back under the descriptor budget, TEAMRT_FD_BUDGET" in message
    assert "ulimit -n" in message

"""The cursor on disk knows the file it points into: the CRCs of the first and the last 256 bytes
before its offset, and the file's inode number, birth time and inode generation. An owner that
opens an inbox (a restart, another process) refuses a log that is not that file, as a parked
reader does, and `teamrt repair` sees the same damage and says what it did. Copies of a team
(other inodes and births, the same bytes) and cursors written before these marks still open."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.cli.main import main
from teamrt.errors import StoreCorrupt
from teamrt.mail.filestore import identity, read_cursor
from teamrt.mail.filestore import reader as reader_module
from teamrt.mail.filestore.framing import encode_slot
from teamrt.mail.log import Cursor
from tests.mail.filestore.helpers import NotReused, received_now, recreate

MEMBERS = ("lead", "worker")


async def _handled(team: Path, count: int) -> bytes:
    """`count` envelopes sent to worker and handled; the log's bytes."""
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(count):
            await mail.send(Envelope.message("lead", "worker", i))
        await mail.inbox("worker").ack(*await received_now(mail))
    return (team / "inboxes" / "worker.jsonl").read_bytes()


async def _send(team: Path, bodies: range) -> None:
    async with FileMailboxes(team) as mail:
        for i in bodies:
            await mail.send(Envelope.message("lead", "worker", i))


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + (b"0" if data[at : at + 1] != b"0" else b"1") + data[at + 1 :]


def _recreate_with_another_first_id(log: Path, data: bytes) -> None:
    """Delete the log and create it again: the same size and the same last bytes before the
    cursor, one byte of the first envelope's id different (another first envelope)."""
    log.unlink()
    log.write_bytes(_flip(data, data.index(b'"id":"') + 10))


async def _refused_at_open(team: Path) -> str:
    async with FileMailboxes(team) as mail:
        with pytest.raises(StoreCorrupt, match="teamrt repair") as caught:
            mail.inbox("worker")
    return str(caught.value)


def _write_cursor(team: Path, cursor: Cursor) -> None:
    slot = encode_slot(cursor, 7, 4096)
    assert slot is not None
    (team / "inboxes" / "worker.cursor.json").write_bytes(slot + slot)


async def test_the_committed_cursor_records_the_files_marks(tmp_path: Path) -> None:
    team = tmp_path / "t"
    data = await _handled(team, 6)
    log = team / "inboxes" / "worker.jsonl"
    cursor = read_cursor(team / "inboxes" / "worker.cursor.json")[0]
    assert cursor.offset == len(data) > 2 * identity.CHECK
    fd = os.open(log, os.O_RDONLY)
    try:
        _, ino, _, born, generation = identity.identify(fd)
        head, tail = identity.read_marks(fd, cursor.offset)
    finally:
        os.close(fd)
    assert (cursor.head, cursor.tail) == (f"{head:08x}", f"{tail:08x}")
    assert (cursor.ino, cursor.born, cursor.igen) == (ino, born, generation)


async def test_a_log_recreated_with_another_first_envelope_is_refused_at_open(
    tmp_path: Path,
) -> None:
    """Same size, same last 256 bytes before the cursor: only the first bytes tell. Before the
    cursor recorded them, a restarted owner read on from the offset and skipped the new file."""
    team = tmp_path / "t"
    data = await _handled(team, 6)
    _recreate_with_another_first_id(team / "inboxes" / "worker.jsonl", data)
    await _send(team, range(100, 103))
    message = await _refused_at_open(team)
    assert "first bytes" in message and "--inbox worker" in message


async def test_another_process_opening_the_inbox_refuses_it(tmp_path: Path) -> None:
    team = tmp_path / "t"
    data = await _handled(team, 6)
    _recreate_with_another_first_id(team / "inboxes" / "worker.jsonl", data)
    script = (
        "import sys, anyio\n"
        "from teamrt import FileMailboxes\n"
        "from teamrt.errors import StoreCorrupt\n"
        "async def main() -> None:\n"
        "    async with FileMailboxes(sys.argv[1]) as mail:\n"
        "        try:\n"
        "            mail.inbox('worker')\n"
        "        except StoreCorrupt as exc:\n"
        "            print('refused:', exc)\n"
        "anyio.run(main)\n"
    )
    done = await anyio.run_process([sys.executable, "-c", script, str(team)], check=False)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert out.startswith("refused:") and "first bytes" in out and "teamrt repair" in out


async def test_a_cursor_for_a_file_created_again_at_its_inode_number_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same inode number and every byte the same but a later birth time: the file the
    cursor was written for was deleted and this one created in its place."""
    team = tmp_path / "t"
    await _handled(team, 3)
    cursor = read_cursor(team / "inboxes" / "worker.cursor.json")[0]
    fd = os.open(team / "inboxes" / "worker.jsonl", os.O_RDONLY)
    try:
        kept = identity.birth_time(fd)
    finally:
        os.close(fd)
    if not kept:
        pytest.skip("this file system records no birth time (statx stx_btime)")
    _write_cursor(
        team,
        Cursor(
            cursor.segment,
            cursor.offset,
            cursor.seq,
            recent=cursor.recent,
            tail=cursor.tail,
            head=cursor.head,
            ino=cursor.ino,
            born=cursor.born - 1,  # the cursor's file was born before this one
            igen=cursor.igen,
        ),
    )
    assert "created again" in await _refused_at_open(team)
    # on overlayfs a copy-up gives a lower layer's file another birth at the same inode number
    monkeypatch.setattr(reader_module, "on_overlayfs", lambda fd: True)
    async with FileMailboxes(team) as mail:
        assert await received_now(mail) == []


async def test_a_log_created_again_with_its_inode_number_and_nearly_its_bytes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleted while no owner ran and created again with the freed inode number, every byte the
    same but one in the middle (outside both checked ranges): the birth time tells, at open and
    in `teamrt repair`."""
    for attempt in range(5):
        team = tmp_path / f"t{attempt}"
        data = await _handled(team, 6)
        log = team / "inboxes" / "worker.jsonl"
        fd = os.open(log, os.O_RDONLY)
        try:
            kept = identity.birth_time(fd)
        finally:
            os.close(fd)
        if not kept:
            pytest.skip("this file system records no birth time (statx stx_btime)")
        try:
            recreate(log, _flip(data, len(data) // 2))
            break
        except NotReused:
            continue
    else:
        pytest.skip("this file system did not hand a freed inode number out again (5 attempts)")
    assert "created again" in await _refused_at_open(team)
    capsys.readouterr()
    assert main(["repair", str(team), "--inbox", "worker"]) == 0
    out = capsys.readouterr().out
    assert "created again" in out and "nothing to repair" not in out
    await _send(team, range(100, 102))
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [100, 101]


async def test_a_copied_team_opens_and_reads_on(tmp_path: Path) -> None:
    """A copy has other inode numbers and birth times and the same bytes: it is the same log."""
    team = tmp_path / "t"
    await _handled(team, 6)
    copy = tmp_path / "elsewhere" / "t"  # a team directory's name is its team
    shutil.copytree(team, copy)
    await _send(copy, range(100, 103))
    async with FileMailboxes(copy) as mail:
        assert [e.body for e in await received_now(mail)] == [100, 101, 102]


async def test_a_cursor_written_before_the_marks_opens_and_is_checked_as_before(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    data = await _handled(team, 6)
    cursor = read_cursor(team / "inboxes" / "worker.cursor.json")[0]
    old = {
        k: v for k, v in cursor.to_json_dict().items() if k not in ("head", "ino", "born", "igen")
    }
    _write_cursor(team, Cursor.from_json_dict(old))
    raw = (team / "inboxes" / "worker.cursor.json").read_bytes()
    assert b'"tail"' in raw and b'"head"' not in raw and b'"born"' not in raw
    await _send(team, range(100, 102))
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [100, 101]
    assert json.loads(raw.split(b"\n")[0])["tail"] == cursor.tail
    # the old check still holds: the last bytes before the offset
    log = team / "inboxes" / "worker.jsonl"
    log.write_bytes(_flip(log.read_bytes(), len(data) - 20))
    assert "bytes before offset" in await _refused_at_open(team)


async def test_repair_of_a_log_recreated_with_another_first_envelope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Repair sees what the owner sees, restarts at the first envelope sent since, and says that
    the handled ones the old file held are gone."""
    team = tmp_path / "t"
    data = await _handled(team, 6)
    _recreate_with_another_first_id(team / "inboxes" / "worker.jsonl", data)
    await _send(team, range(100, 103))
    capsys.readouterr()
    assert main(["repair", str(team), "--inbox", "worker"]) == 0
    out = capsys.readouterr().out
    assert "nothing to repair" not in out
    assert "not the file the cursor was written for" in out and "first bytes" in out
    assert "before the first envelope written since (seq 6)" in out
    async with FileMailboxes(team) as mail:
        assert [e.body for e in await received_now(mail)] == [100, 101, 102]
    capsys.readouterr()
    assert main(["repair", str(team), "--inbox", "worker"]) == 0
    assert "nothing to repair" in capsys.readouterr().out  # the new cursor has the new marks


async def test_a_rotated_segment_cut_short_with_unread_lines_does_not_stall_the_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rotated segment cut after the rotation, above the cursor: its lines left are read, and
    the reader goes on to the next segment (a segment shorter than the segment size used to be
    taken for one still being written, and the reader waited at its end for ever)."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=2048) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
        await mail.inbox("worker").ack(*await received_now(mail))
    await _send(team, range(3, 40))  # rotates at least twice
    first = team / "inboxes" / "worker.000000.jsonl"
    lines = first.read_bytes().splitlines(keepends=True)
    first.write_bytes(b"".join(lines[:-2]))  # the last two lines of segment 0 are gone
    lost = {json.loads(line)["body"] for line in lines[-2:]}
    async with FileMailboxes(team) as mail:
        inbox, got = mail.inbox("worker"), list[object]()
        with anyio.fail_after(20):
            while len(got) < 37 - len(lost):
                got.append((await inbox.receive(10)).body)
        assert got == [i for i in range(3, 40) if i not in lost]
    assert "worker.000000.jsonl" in caplog.text and "cut after it was rotated" in caplog.text

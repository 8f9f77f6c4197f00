"""`seq` never goes backwards: a writer never hands out a seq at or below one already handed out
in that inbox, whatever happened to the log's tail (truncated below the owner's cursor, lines
appended by something that is not teamrt), and `teamrt repair` delivers every envelope written
after the damage and names exactly the seqs that are gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.cli.main import main
from teamrt.mail.filestore import read_cursor
from teamrt.mail.filestore.framing import decode_high_water
from tests.support.children import finish, read_acked, spawn, wait_ready

MEMBERS = ("lead", "worker")


def _log(team: Path) -> Path:
    return team / "inboxes" / "worker.jsonl"


async def _drain(mail: FileMailboxes) -> list[Envelope]:
    inbox, out = mail.inbox("worker"), []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except anyio.WouldBlock:
            await inbox.ack(*out)
            return out


async def _handle(team: Path, count: int) -> None:
    """The owner handles (receives and acks) the first `count` envelopes of its inbox."""
    async with FileMailboxes(team) as mail:
        inbox, got = mail.inbox("worker"), []
        for _ in range(count):
            got.append(inbox.receive_nowait())
        await inbox.ack(*got)


def _cli_send(team: Path, body: object) -> None:
    """`teamrt send` from another process: a writer that knows nothing of this one."""
    command = ["send", str(team), "--from", "lead", "--to", "worker", "--body", json.dumps(body)]
    subprocess.run(
        [sys.executable, "-m", "teamrt", *command],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _repair(team: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any]]:
    """`teamrt repair` of the worker's inbox: its text, and its JSON report (from a copy of the
    team directory, repaired the same way)."""
    twin = team.parent / "twin" / team.name
    shutil.copytree(team, twin, symlinks=True)
    capsys.readouterr()
    assert main(["repair", str(team), "--inbox", "worker"]) == 0
    text = capsys.readouterr().out
    assert main(["repair", str(twin), "--inbox", "worker", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    return text, report


def _seqs(team: Path) -> list[int]:
    return [json.loads(line)["seq"] for line in _log(team).read_bytes().splitlines()]


async def test_sends_after_a_truncation_below_the_cursor_are_numbered_above_and_delivered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as sender:
        for i in range(30):
            await sender.send(Envelope.message("lead", "worker", i))
        await _handle(team, 30)
        lines = _log(team).read_bytes().splitlines(keepends=True)
        _log(team).write_bytes(b"".join(lines[:15]))  # someone truncates below the cursor
        for body in ("live-0", "live-1", "live-2"):  # this writer saw the log shrink
            await sender.send(Envelope.message("lead", "worker", body))
    for body in ("cli-0", "cli-1"):  # writers that never saw the log before the damage
        _cli_send(team, body)
    assert _seqs(team) == list(range(15)) + list(range(30, 35))
    text, report = _repair(team, capsys)
    assert "handled before the damage" in text and "seq 15 to 29" in text
    assert "cannot be delivered" not in text  # the owner had handled all that is gone
    async with FileMailboxes(team) as mail:
        got = await _drain(mail)
    assert [e.body for e in got] == ["live-0", "live-1", "live-2", "cli-0", "cli-1"]
    assert [e.seq for e in got] == [30, 31, 32, 33, 34]
    assert [(g["first_seq"], g["last_seq"], g["handled"]) for g in report["gone"]] == [
        (15, 29, True)
    ]


async def test_repair_names_exactly_the_seqs_that_are_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(30):
            await mail.send(Envelope.message("lead", "worker", i))
    await _handle(team, 20)  # seqs 0-19 handled, 20-29 sent but not yet read
    data = _log(team).read_bytes()
    lines = data.splitlines(keepends=True)
    cut = len(b"".join(lines[:10]))
    handled_end = len(b"".join(lines[:20]))
    os.truncate(_log(team), cut)
    for body in ("after-0", "after-1", "after-2"):
        _cli_send(team, body)
    text, report = _repair(team, capsys)
    assert report["gone"] == [
        {"segment": 0, "first_seq": 10, "last_seq": 19, "start": cut, "end": handled_end,
         "handled": True},
        {"segment": 0, "first_seq": 20, "last_seq": 29, "start": handled_end, "end": None,
         "handled": False},
    ]  # fmt: skip
    assert "seq 20 to 29" in text and "never delivered" in text
    assert f"bytes {cut} to {handled_end}" in text and "seq 10 to 19" in text
    assert "sent since are delivered" not in text
    async with FileMailboxes(team) as mail:
        got = await _drain(mail)
    assert [(e.seq, e.body) for e in got] == [(30, "after-0"), (31, "after-1"), (32, "after-2")]


async def test_a_truncation_with_nothing_sent_since_reports_the_seqs_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(12):
            await mail.send(Envelope.message("lead", "worker", i))
    await _handle(team, 8)
    lines = _log(team).read_bytes().splitlines(keepends=True)
    _log(team).write_bytes(b"".join(lines[:5]))
    text, report = _repair(team, capsys)
    assert [(g["first_seq"], g["last_seq"], g["handled"]) for g in report["gone"]] == [
        (5, 7, True),
        (8, 11, False),
    ]
    assert "seq 8 to 11" in text
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "next"))
        got = await _drain(mail)
    assert [(e.seq, e.body) for e in got] == [(12, "next")]


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def _forged(line: bytes, seq: object) -> bytes:
    """A copy of a teamrt line with another seq and id: what a third party might append."""
    fields = json.loads(line)
    fields["seq"] = seq
    fields["id"] = "f" * 30
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


@pytest.mark.parametrize("seq", [0, 2**62, "7", 3.5, -1], ids=repr)
async def test_a_line_not_written_by_teamrt_does_not_move_seq(tmp_path: Path, seq: object) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as live:
        for i in range(10):
            await live.send(Envelope.message("lead", "worker", i))
        last = _log(team).read_bytes().splitlines()[-1]
        _append(_log(team), _forged(last, seq))
        await live.send(Envelope.message("lead", "worker", "live"))  # saw the line appear
    _cli_send(team, "fresh")  # a writer that finds the line at the log's tail
    async with FileMailboxes(team) as mail:
        got = [e for e in await _drain(mail) if e.id != "f" * 30]
    assert [(e.seq, e.body) for e in got] == [
        *((i, i) for i in range(10)),
        (10, "live"),
        (11, "fresh"),
    ]


async def test_an_inbox_without_a_high_water_mark_continues_from_its_log(tmp_path: Path) -> None:
    """A team written before the mark existed (an empty lock file) numbers on from its log."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(4):
            await mail.send(Envelope.message("lead", "worker", i))
    os.truncate(team / "inboxes" / "worker.lock", 0)
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", 4))
        got = await _drain(mail)
    assert [e.seq for e in got] == [0, 1, 2, 3, 4]


async def test_a_damaged_high_water_mark_falls_back_to_the_log(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(4):
            await mail.send(Envelope.message("lead", "worker", i))
    (team / "inboxes" / "worker.lock").write_bytes(b"not a number\n")
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", 4))
        got = await _drain(mail)
    assert [e.seq for e in got] == [0, 1, 2, 3, 4]


async def test_a_line_written_by_a_writer_killed_before_its_mark_counts(tmp_path: Path) -> None:
    """A writer killed between its line and its mark: the next writer numbers after the line."""
    team = tmp_path / "t"
    lock = team / "inboxes" / "worker.lock"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
            if i == 1:
                mark_before_the_last = lock.read_bytes()
    lock.write_bytes(mark_before_the_last)  # the line of seq 2 is in the log, unmarked
    assert decode_high_water(mark_before_the_last) == (
        1,
        0,
        len(b"".join(_log(team).read_bytes().splitlines(keepends=True)[:2])),
    )
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", 3))
        got = await _drain(mail)
    assert [(e.seq, e.body) for e in got] == [(0, 0), (1, 1), (2, 2), (3, 3)]


async def test_repair_gives_an_inbox_without_a_mark_the_one_its_log_implies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    lock = team / "inboxes" / "worker.lock"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(4):
            await mail.send(Envelope.message("lead", "worker", i))
    os.truncate(lock, 0)  # as a team written before the mark existed
    capsys.readouterr()
    assert main(["repair", str(team), "--inbox", "worker"]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert decode_high_water(lock.read_bytes()) == (3, 0, len(_log(team).read_bytes()))


def _senders(team: Path, tag: str, count: int) -> list[Path]:
    """Four writer processes, each sending `count` envelopes at once (acks recorded)."""
    acks = [team.parent / f"acks-{tag}{k}" for k in range(4)]
    procs = [
        spawn("send", str(team), f"{tag}{k}", str(count), "50", str(acks[k]), "0") for k in range(4)
    ]
    wait_ready([Path(f"{a}.ready") for a in acks], procs)
    (team.parent / "go").touch()
    log, cut = _log(team), False
    while any(p.poll() is None for p in procs):
        data = log.read_bytes()
        if tag == "b" and not cut and data.count(b"\n") > 220:  # once, while they write
            os.truncate(log, len(b"".join(data.splitlines(keepends=True)[:160])))
            cut = True
        time.sleep(0.002)
    for proc in procs:
        finish(proc)
    (team.parent / "go").unlink()
    return acks


def test_writer_processes_number_above_a_cut_log_and_each_other(tmp_path: Path) -> None:
    """Writers in other processes, fresh after the log was cut and live while it is cut again:
    every seq in the log is above every one before it, and above all that was handed out."""
    team = tmp_path / "t"
    anyio.run(_create, team)
    _senders(team, "a", 50)  # seqs 0-199
    lines = _log(team).read_bytes().splitlines(keepends=True)
    _log(team).write_bytes(b"".join(lines[:120]))
    acks = _senders(team, "b", 50)
    seqs = _seqs(team)
    assert seqs == sorted(set(seqs))  # strictly increasing in file order
    later = [s for s in seqs if s >= 120]
    assert later and min(later) == 200  # the writers after the cut numbered above 199
    assert sum(len(read_acked(a)) for a in acks) == 200
    mark = decode_high_water((team / "inboxes" / "worker.lock").read_bytes())
    assert mark is not None and mark.seq == 399  # 400 sends, 400 seqs, none twice


async def _create(team: Path) -> None:
    async with FileMailboxes(team, members=MEMBERS):
        pass


async def test_without_a_mark_repair_says_it_cannot_tell_how_many_are_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(6):
            await mail.send(Envelope.message("lead", "worker", i))
    await _handle(team, 4)
    lines = _log(team).read_bytes().splitlines(keepends=True)
    _log(team).write_bytes(b"".join(lines[:2]))
    os.truncate(team / "inboxes" / "worker.lock", 0)  # a team written before the mark
    text, report = _repair(team, capsys)
    assert [(g["first_seq"], g["last_seq"]) for g in report["gone"]] == [(2, 3), (4, None)]
    assert "any envelope from seq 4 on" in text and "do not tell how many" in text


async def test_repair_of_a_cut_rotated_segment_names_the_seqs_gone_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=2048) as mail:
        for i in range(40):
            await mail.send(Envelope.message("lead", "worker", i))
    await _handle(team, 20)
    cursor = read_cursor(team / "inboxes" / "worker.cursor.json")[0]
    segment = team / "inboxes" / f"worker.{cursor.segment:06d}.jsonl"
    lines = segment.read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])["seq"]
    assert first < 19 < json.loads(lines[-1])["seq"]  # the cursor is inside this segment
    segment.write_bytes(b"".join(lines[: 19 - first]))  # cut just before seq 19, handled
    after_cut = json.loads(lines[-1])["seq"] + 1  # the next segment's first seq
    _, report = _repair(team, capsys)
    assert [(g["first_seq"], g["last_seq"], g["handled"]) for g in report["gone"]] == [
        (19, 19, True),
        (20, after_cut - 1, False),
    ]
    async with FileMailboxes(team) as mail:
        got = await _drain(mail)
    assert [e.seq for e in got] == list(range(after_cut, 40))

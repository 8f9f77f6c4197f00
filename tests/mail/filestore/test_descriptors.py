"""Descriptors of idle inboxes are given back under the process's budget, and nothing changes for
whoever reads or sends: a parked reader is woken, reopens its file, checks it is the same one
(inode, size, the bytes before its position) and carries on; a dropped appender's successor
continues `seq` densely. A team far larger than the descriptor limit runs in one process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.errors import ReceiveTimeout, StoreCorrupt
from teamrt.mail.filestore.descriptors import BUDGET, DescriptorBudget
from teamrt.mail.filestore.reader import FileReader
from teamrt.mail.filestore.store import FileStore
from tests.support.paths import ROOT

MEMBERS = ["lead", "a", "b", "c", "d"]


@pytest.fixture
def tight(monkeypatch: pytest.MonkeyPatch) -> DescriptorBudget:
    """A budget of two descriptors: opening one more reader parks the oldest."""
    monkeypatch.setattr(BUDGET, "limit", 2)
    return BUDGET


def _store(mail: FileMailboxes) -> FileStore:
    assert isinstance(mail.store, FileStore)
    return mail.store


def _reader(mail: FileMailboxes, name: str) -> FileReader:
    reader = mail.inbox(name)._reader
    assert isinstance(reader, FileReader)
    return reader


async def _park(mail: FileMailboxes, name: str, *, settle: bool = True) -> FileReader:
    """Open every other inbox, so that `name`'s reader (opened first) is parked; `settle`: after
    the notifications of what was sent so far came and were read (each wakes the inbox, whose
    next receive reads, and so reopens: a test that waits parked wants them behind it)."""
    reader = _reader(mail, name)
    if settle:
        await anyio.sleep(0.05)
        with pytest.raises(ReceiveTimeout):
            await mail.inbox(name).receive(0.01)
    for other in MEMBERS:
        if other != name:
            await mail.open_inbox(other)
    assert reader.parked, "the oldest idle reader gives its descriptors back"
    return reader


def _message(i: int, to: str = "a") -> Envelope:
    return Envelope.message("lead", to, {"i": i})


def _fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
    return out


def _write_at(path: Path, data: bytes, offset: int | None = None) -> None:
    """Write `data` at `offset` of the file, or append it (no teamrt writer)."""
    with open(path, "ab" if offset is None else "r+b") as f:
        if offset is not None:
            f.seek(offset)
        f.write(data)


# --- a parked reader ------------------------------------------------------------------------------


async def test_a_parked_reader_is_woken_by_a_send_and_reads_on(
    tmp_path: Path, tight: DescriptorBudget
) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        await mail.send(_message(0))
        assert (await inbox.receive(5)).body == {"i": 0}
        reader = await _park(mail, "a")
        log = str(tmp_path / "t" / "inboxes" / "a.jsonl")
        assert log not in _fds()
        async with anyio.create_task_group() as tg:
            got: list[Envelope] = []

            async def receive() -> None:
                got.append(await inbox.receive(10))

            tg.start_soon(receive)
            await anyio.sleep(0.05)  # waiting, parked
            assert reader.parked
            await mail.send(_message(1))
        assert [e.body["i"] for e in got] == [1]
        assert [e.seq for e in got] == [1]
        assert not reader.parked


async def test_the_rescan_asks_a_parked_reader_without_reopening_it(
    tmp_path: Path, tight: DescriptorBudget
) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        await mail.open_inbox("a")
        reader = await _park(mail, "a")
        assert not reader.has_new()
        assert reader.parked
        _write_at(tmp_path / "t" / "inboxes" / "a.jsonl", b'{"x":1}\n')
        assert reader.has_new()
        assert reader.parked


async def test_acks_of_a_parked_reader_are_committed_and_hold_after_a_restart(
    tmp_path: Path, tight: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        for i in range(3):
            await mail.send(_message(i))
        first = await inbox.receive(5)
        await inbox.ack(first)
        second = await inbox.receive(5)
        await _park(mail, "a", settle=False)
        await inbox.ack(second)  # the commit reopens what it needs
        assert (await inbox.receive(5)).body == {"i": 2}
    async with FileMailboxes(team, members=MEMBERS) as mail:
        got = await mail.inbox("a").receive(5)
        assert got.body == {"i": 2}  # the two acked ones are not handed out again


@pytest.mark.parametrize("durability", ["none", "fsync"])
async def test_a_reader_parked_across_rotations_reads_every_segment_in_order(
    tmp_path: Path, tight: DescriptorBudget, durability: str
) -> None:
    async with FileMailboxes(
        tmp_path / "t",
        members=MEMBERS,
        segment_bytes=600,
        durability=durability,  # type: ignore[arg-type]
    ) as mail:
        inbox = await mail.open_inbox("a")
        await mail.send(_message(0))
        assert (await inbox.receive(5)).seq == 0
        await _park(mail, "a")
        for i in range(1, 40):  # several rotations while parked
            await mail.send(_message(i))
        got = [await inbox.receive(5) for _ in range(39)]
        assert [e.seq for e in got] == list(range(1, 40))
        await inbox.ack(got[-1])
        with pytest.raises(ReceiveTimeout):
            await inbox.receive(0.05)


async def test_a_reader_parked_in_the_middle_of_a_rotation_finds_its_file_by_its_segment_name(
    tmp_path: Path, tight: DescriptorBudget
) -> None:
    """Rotated away while parked, with a fresh active file in its place: the reader's file is
    reached by its segment's name and read to the end before the next segment."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=400) as mail:
        inbox = await mail.open_inbox("a")
        await mail.send(_message(0))
        assert (await inbox.receive(5)).seq == 0
        reader = await _park(mail, "a")
        for i in range(1, 6):
            await mail.send(_message(i))
        assert (team / "inboxes" / "a.000000.jsonl").exists()
        assert reader.parked
        got = [await inbox.receive(5) for _ in range(5)]
        assert [e.seq for e in got] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("damage", ["deleted", "replaced", "truncated", "rewritten"])
async def test_a_log_damaged_while_its_reader_was_parked_is_reported_not_skipped(
    tmp_path: Path, tight: DescriptorBudget, damage: str
) -> None:
    team = tmp_path / "t"
    log = team / "inboxes" / "a.jsonl"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        for i in range(3):
            await mail.send(_message(i))
        for _ in range(3):
            await inbox.receive(5)
        await _park(mail, "a")
        data = log.read_bytes()
        if damage == "deleted":
            log.unlink()
        elif damage == "replaced":  # a copy, same bytes, renamed over the log
            shutil.copyfile(log, log.with_suffix(".copy"))
            os.replace(log.with_suffix(".copy"), log)
        elif damage == "truncated":
            os.truncate(log, len(data) // 2)
        else:  # same inode, same size, other bytes before the position
            _write_at(log, b"X" * 9, len(data) - 10)
        _write_at(log, b'{"seq":3}\n')
        with pytest.raises(StoreCorrupt, match="teamrt repair"):
            await inbox.receive(2)


async def test_a_tail_reader_parks_and_reads_on(tmp_path: Path, tight: DescriptorBudget) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(_message(0))
        tail = await _store(mail).tail_reader("a")
        for other in ("b", "c", "d"):
            await mail.open_inbox(other)
        assert tail.parked
        await mail.send(_message(1))
        entries = tail.read_nowait()
        assert [e.raw.count(b'"i":1') for e in entries] == [1]
        tail.close()


async def test_a_busy_reader_is_not_parked(tmp_path: Path, tight: DescriptorBudget) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        await mail.open_inbox("a")
        reader = _reader(mail, "a")
        reader.busy = True  # a commit in a worker thread uses its descriptors
        for other in MEMBERS[1:]:
            await mail.open_inbox(other)
        assert not reader.parked
        reader.busy = False


# --- dropped appenders ----------------------------------------------------------------------------


async def test_sends_to_more_inboxes_than_the_budget_keep_seq_dense(
    tmp_path: Path, tight: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(20):
            for to in MEMBERS[1:]:
                await mail.send(_message(i, to))
        assert _store(mail).descriptors() <= 4  # one appender's lock and log, another's at most
        for to in MEMBERS[1:]:
            inbox = mail.inbox(to)
            got = [await inbox.receive(5) for _ in range(20)]
            assert [e.seq for e in got] == list(range(20))
            assert [e.body["i"] for e in got] == list(range(20))


async def test_a_dropped_appenders_successor_continues_after_another_processs_lines(
    tmp_path: Path, tight: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail, FileMailboxes(team) as other:
        await mail.send(_message(0))
        for to in ("b", "c"):  # drops the appender to "a"
            await mail.send(_message(0, to))
        await other.send(_message(1))
        await mail.send(_message(2))
        inbox = mail.inbox("a")
        got = [await inbox.receive(5) for _ in range(3)]
        assert [(e.seq, e.body["i"]) for e in got] == [(0, 0), (1, 1), (2, 2)]


async def test_a_busy_appender_is_not_dropped(tmp_path: Path, tight: DescriptorBudget) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        await mail.send(_message(0))
        appender = _store(mail)._appenders["a"]
        appender.busy = True  # a send of this process is in it (a contended append)
        for to in ("b", "c", "d"):
            await mail.send(_message(0, to))
        assert _store(mail)._appenders.get("a") is appender
        appender.busy = False


# --- the budget -----------------------------------------------------------------------------------


def test_the_budget_defaults_to_a_quarter_of_the_limit_and_takes_an_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    monkeypatch.delenv("TEAMRT_FD_BUDGET", raising=False)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert DescriptorBudget().limit == max(64, soft // 4)
    monkeypatch.setenv("TEAMRT_FD_BUDGET", "500")
    assert DescriptorBudget().limit == 500
    monkeypatch.setenv("TEAMRT_FD_BUDGET", "lots")
    with pytest.raises(ValueError, match="TEAMRT_FD_BUDGET"):
        DescriptorBudget().limit  # noqa: B018 -- read on first use


def test_a_team_larger_than_the_descriptor_limit_runs_in_one_process(tmp_path: Path) -> None:
    """300 teammates under a limit of 400 open files (each would need its lease, its log, its
    cursor, and the lead's lock and log of its inbox: about 1,500): each one answers a task,
    and a broadcast reaches all of them; descriptors stay under the limit throughout."""
    script = textwrap.dedent(
        f"""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, hard))

        import anyio, os
        from teamrt import Envelope, FileMailboxes
        from teamrt.models import FunctionModel
        from teamrt.team import Team, Teammate
        from teamrt.mail.filestore.descriptors import BUDGET

        def answer(messages, tools):
            return "ok"

        async def main():
            names = [f"m{{i:03d}}" for i in range(300)]
            async with FileMailboxes({str(tmp_path / "team")!r}, members=["lead", *names]) as mail:
                team = Team(mail, [Teammate(n, FunctionModel(answer)) for n in names])
                async with team:
                    most = 0
                    for name in names:
                        reply = await team.ask(name, "hello", timeout=60)
                        assert reply.answer == "ok", reply
                        most = max(most, len(os.listdir("/proc/self/fd")))
                    await mail.send(Envelope.broadcast("lead", "all hands", type="announcement"))
                    while not all(team.status[n].rounds >= 1 for n in names):
                        await anyio.sleep(0.01)
                    print("answered", len(names), "most", most, "parked", BUDGET.released > 0)

        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    words = done.stdout.split()
    assert words[:2] == ["answered", "300"], done.stdout
    assert int(words[3]) < 400
    assert words[5] == "True"


@pytest.mark.stress
def test_the_store_tests_pass_with_every_descriptor_given_back_at_once() -> None:
    """Rotation, acks, the round-trip path and the rescan's tests, in a process whose budget is
    two descriptors: every reader parks and every appender is dropped as soon as another opens,
    so each of their reads and sends goes through a reopen."""
    files = [
        "tests/mail/filestore/test_rotation.py",
        "tests/mail/test_acks.py",
        "tests/mail/test_request_responses.py",
        "tests/mail/filestore/test_rescan.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        + [str(ROOT / f) for f in files],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TEAMRT_FD_BUDGET": "2"},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

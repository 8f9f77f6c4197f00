"""The descriptor budget (descriptors.py) under attack: parked readers, dropped appenders,
pinned leases, the EMFILE retry, and the tools' cached arguments models.

Each test tries to lose, duplicate or misnumber a message, read a wrong file, leak a descriptor,
use one after close, stall a parked reader, or make the budget fail the team it is there to
allow. Budgets are made tiny (one or two descriptors) so that every read and send goes through a
reopen; where the claim is about the process's file limit or about processes, a real child
process runs. Nothing is timed: waits are bounded by generous timeouts only.

Bugs this pass found, each fixed after its test:
- sends and cursor commits that wait in a worker thread (for an fsync, or for another process's
  lock) hold their descriptors meanwhile, and as many ran at once as tasks asked: a team that
  runs under the file limit failed with EMFILE under `durability="fsync"`, or when another
  process held many inboxes' locks (now at most a quarter of the budget's room is in flight);
- a parked reader whose commit was behind its segment (an ack of an older segment's message)
  opened that segment and its cursor file and kept both, outside the budget, while it stayed
  parked;
- a child forked while another thread was inside the budget hung on its copy of the lock;
- the tools' hints cache checked the wrapper's module, not the one `get_type_hints` resolves
  in: two `functools.wraps`-decorated tools of two modules shared the first one's resolved
  string annotations;
- the arguments-model cache matched defaults by equality: a closure whose default was
  `(True,)` got the model (and the default) of one whose default was `(1,)`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.agents.tools import tool
from teamrt.envelopes import Request
from teamrt.errors import MailboxClosed, ReceiveTimeout, StoreCorrupt
from teamrt.mail.filestore.descriptors import BUDGET, DescriptorBudget
from teamrt.mail.filestore.reader import FileReader
from teamrt.mail.filestore.store import FileStore
from tests.support.paths import ROOT

MEMBERS = ["lead", "a", "b", "c", "d"]


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> DescriptorBudget:
    """A budget of one descriptor: every holder that opens parks or drops all the others."""
    monkeypatch.setattr(BUDGET, "limit", 1)
    return BUDGET


def _reader(mail: FileMailboxes, name: str) -> FileReader:
    reader = mail.inbox(name)._reader
    assert isinstance(reader, FileReader)
    return reader


def _store(mail: FileMailboxes) -> FileStore:
    assert isinstance(mail.store, FileStore)
    return mail.store


class _Opener:
    """A holder that opens one descriptor: registering it makes the budget take back every
    other idle holder's (a budget of one)."""

    def release_descriptors(self) -> bool:
        return True


def _squeeze() -> None:
    opener = _Opener()
    BUDGET.opened(opener, 1)
    BUDGET.closed(opener)


async def _park(mail: FileMailboxes, name: str) -> FileReader:
    """Park `name`'s reader (after the notifications of what was sent so far were handled:
    each wakes the inbox, whose next receive reads, and so reopens)."""
    reader = _reader(mail, name)
    await anyio.sleep(0.05)
    _squeeze()
    assert reader.parked
    return reader


def _team_fds(team: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(team)):
                out.append(target)
    return out


def _append(path: Path, data: bytes) -> None:
    """Append `data` to the file, as no teamrt writer would."""
    with open(path, "ab") as f:
        f.write(data)


def _child(script: str, *args: str, limit: int | None = None, timeout: float = 120) -> str:
    """Run `script` in a child Python (the worktree's teamrt), optionally under a lowered
    RLIMIT_NOFILE; returns its stdout, failing the test on a non-zero exit."""
    prelude = ""
    if limit is not None:
        prelude = (
            "import resource\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, "
            "resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


# --- the file limit -------------------------------------------------------------------------------

_MANY_MEMBERS = """
    import sys, anyio
    from teamrt import Envelope, FileMailboxes

    async def main(path, n, durability):
        names = [f"m{i:03d}" for i in range(n)]
        async with FileMailboxes(
            path, members=["lead", *names], durability=durability, segment_bytes=2000
        ) as mail:
            inboxes = [await mail.open_inbox(m) for m in names]

            async def serve(inbox):
                for _ in range(3):
                    e = await inbox.receive(60)
                    if e.kind == "request":
                        await mail.send(Envelope.response(e, "ok"))
                    await inbox.ack(e)  # concurrent acks: a cursor commit each

            async def ask(m):
                got = await mail.request(Envelope.request("lead", m, "q"), timeout=60)
                assert got.body == "ok", got

            async with anyio.create_task_group() as tg:
                for inbox in inboxes:
                    tg.start_soon(serve, inbox)
                for r in range(2):
                    for m in names:
                        await mail.send(Envelope.message("lead", m, {"r": r}))
                async with anyio.create_task_group() as asks:  # concurrent sends
                    for m in names:
                        asks.start_soon(ask, m)
            print("done", n)

    anyio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""


@pytest.mark.parametrize("durability", ["none", "fsync"])
def test_more_members_than_the_file_limit_allows_with_concurrent_sends_and_acks(
    tmp_path: Path, durability: str
) -> None:
    """100 members under a limit of 180 open files (leases alone take 101; the budget's room is
    15): concurrent acks and concurrent requests to every member. In `fsync` mode each send and
    commit holds its descriptors while its sync runs in a worker thread, where the budget cannot
    take them back; it must not fail with EMFILE where `none` does not."""
    out = _child(_MANY_MEMBERS, str(tmp_path / "t"), "100", durability, limit=180, timeout=240)
    assert out.split() == ["done", "100"]


_CONTENDED = """
    import subprocess, sys, anyio
    from teamrt import Envelope, FileMailboxes

    HOLD = (
        "import fcntl, os, sys\\n"
        "fds = [os.open(p, os.O_RDWR) for p in sys.argv[1:]]\\n"
        "for fd in fds: fcntl.flock(fd, fcntl.LOCK_EX)\\n"
        "print('held', flush=True)\\n"
        "sys.stdin.read()\\n"
    )

    async def main(path):
        names = [f"m{i:03d}" for i in range(100)]
        async with FileMailboxes(path, members=["lead", *names]) as mail:
            inboxes = [await mail.open_inbox(m) for m in names]
            locks = [f"{path}/inboxes/{m}.lock" for m in names[:60]]
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLD, *locks], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            assert holder.stdout.readline() == b"held\\n"
            try:
                async with anyio.create_task_group() as tg:
                    for m in names:  # 60 of them wait in worker threads for the other's locks
                        tg.start_soon(mail.send, Envelope.message("lead", m, 1))
                    await anyio.sleep(0.5)
                    holder.stdin.close()  # the other process lets go
            finally:
                holder.stdin.close()
                holder.wait()
            for inbox in inboxes:
                assert (await inbox.receive(30)).body == 1
            print("done")

    anyio.run(main, sys.argv[1])
"""


def test_sends_waiting_for_another_processs_locks_beyond_the_file_limit(tmp_path: Path) -> None:
    """Another process holds the locks of 60 of 100 inboxes while this one (limit 180 files)
    sends to all 100 at once: a send that waits for a lock in a worker thread keeps its
    appender's descriptors, which the budget cannot take back; the sends wait their turn
    instead of failing with EMFILE."""
    assert _child(_CONTENDED, str(tmp_path / "t"), limit=180).split() == ["done"]


# --- many tasks, a budget of one ------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["none", "fsync"])
async def test_concurrent_sends_receives_acks_and_requests_under_a_budget_of_one(
    tmp_path: Path, tiny: DescriptorBudget, durability: str
) -> None:
    """Every reader parks and every appender is dropped whenever another opens, with rotations:
    each message comes exactly once, seq dense per inbox, every request answered."""
    members = ["lead"] + [f"m{i}" for i in range(6)]
    rounds, senders = 12, 8
    rng = random.Random(7)
    got: Counter[tuple[str, int, int]] = Counter()
    seqs: dict[str, list[int | None]] = {m: [] for m in members[1:]}
    per_member = rounds * senders // 6 + 1  # upper bound; receivers stop when senders are done
    async with FileMailboxes(
        tmp_path / "t",
        members=members,
        segment_bytes=700,
        durability=durability,  # type: ignore[arg-type]
    ) as mail:

        async def receiver(m: str) -> None:
            inbox = await mail.open_inbox(m)
            with contextlib.suppress(ReceiveTimeout):
                for _ in range(per_member * 2):
                    e = await inbox.receive(5 if not done.is_set() else 0.5)
                    seqs[m].append(e.seq)
                    if isinstance(e, Request):
                        await mail.send(Envelope.response(e, {"ok": e.body}))
                    else:
                        got[(m, e.body["s"], e.body["i"])] += 1
                    if rng.random() < 0.5:
                        await inbox.ack(e)
                    else:
                        inbox.ack_nowait(e)

        async def sender(s: int) -> None:
            for i in range(rounds):
                to = members[1 + (i + s) % 6]
                if (i + s) % 3 == 0:
                    answer = await mail.request(
                        Envelope.request("lead", to, {"i": i, "s": s}), timeout=60
                    )
                    assert answer.body == {"ok": {"i": i, "s": s}}
                else:
                    await mail.send(Envelope.message("lead", to, {"i": i, "s": s}))
                await anyio.lowlevel.checkpoint()

        done = anyio.Event()
        async with anyio.create_task_group() as receivers:
            for m in members[1:]:
                receivers.start_soon(receiver, m)
            async with anyio.create_task_group() as tg:
                for s in range(senders):
                    tg.start_soon(sender, s)
            done.set()
    expected = {
        (members[1 + (i + s) % 6], s, i)
        for s in range(senders)
        for i in range(rounds)
        if (i + s) % 3 != 0
    }
    assert set(got) == expected
    assert all(count == 1 for count in got.values())
    for m, numbers in seqs.items():
        assert numbers == list(range(len(numbers))), m
    assert BUDGET.released > 0


# --- other processes ------------------------------------------------------------------------------

_WRITER = """
    import sys, anyio
    from teamrt import Envelope, FileMailboxes
    from teamrt.mail.filestore.descriptors import BUDGET

    async def main(path, tag, n):
        BUDGET.limit = 1
        async with FileMailboxes(path) as mail:
            for i in range(n):
                await mail.send(Envelope.message("lead", "abcd"[i % 4], {"s": tag, "i": i}))

    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


async def test_two_other_processes_write_the_same_inboxes_while_appenders_are_dropped(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    n = 120
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=900) as mail:
        got: Counter[tuple[str, int]] = Counter()
        seqs: dict[str, list[int | None]] = {m: [] for m in MEMBERS[1:]}

        async def child(tag: str) -> None:
            await anyio.to_thread.run_sync(_child, _WRITER, str(team), tag, str(n))

        async def receiver(m: str) -> None:
            inbox = await mail.open_inbox(m)
            while len(seqs[m]) < 3 * n // 4:
                e = await inbox.receive(60)
                seqs[m].append(e.seq)
                got[(e.body["s"], e.body["i"])] += 1
                inbox.ack_nowait(e)

        async with anyio.create_task_group() as tg:
            for m in MEMBERS[1:]:
                tg.start_soon(receiver, m)
            tg.start_soon(child, "p")
            tg.start_soon(child, "q")
            for i in range(n):
                await mail.send(Envelope.message("lead", "abcd"[i % 4], {"s": "me", "i": i}))
                if i % 5 == 0:
                    await anyio.sleep(0.001)
    assert len(got) == 3 * n
    assert all(count == 1 for count in got.values())
    for m, numbers in seqs.items():
        assert numbers == list(range(3 * n // 4)), m


async def test_a_torn_tail_left_by_a_killed_writer_while_the_reader_was_parked(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    """A writer killed mid-line leaves a tail without its newline; the parked reader reads it
    (held back), parks again; the next send (a new appender) seals it: the torn line is
    quarantined, the new message delivered with the next seq."""
    team = tmp_path / "t"
    log = team / "inboxes" / "a.jsonl"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        await mail.send(Envelope.message("lead", "a", 0))
        assert (await inbox.receive(5)).seq == 0
        await _park(mail, "a")
        # what a SIGKILL in the middle of write() leaves
        _append(log, b'{"seq":1,"team":"t","id":"torn","kind":"mess')
        with pytest.raises(ReceiveTimeout):
            await inbox.receive(0.2)  # reads the partial tail, holds it back
        await _park(mail, "a")
        for to in ("b", "c", "d", "a"):  # drops the appender to "a" on the way
            await mail.send(Envelope.message("lead", to, 1))
        got = await inbox.receive(5)
        assert (got.body, got.seq) == (1, 1)
        await inbox.ack(got)
        assert mail.statistics()["a"].quarantined == 1


async def test_a_parked_reader_waiting_is_woken_by_another_process_and_by_the_rescan(
    tmp_path: Path, tiny: DescriptorBudget, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, rescan_interval=0.2) as mail:
        inbox = await mail.open_inbox("a")
        reader = await _park(mail, "a")
        got: list[Envelope] = []

        async def receive() -> None:
            got.append(await inbox.receive(60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.sleep(0.05)  # its first read done: waiting
            _squeeze()
            assert reader.parked and not got
            cli = [sys.executable, "-m", "teamrt", "send", str(team), "--from", "lead"]
            await anyio.run_process(
                [*cli, "--to", "a", "--text", "from afar"],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        assert [e.body for e in got] == ["from afar"]

        # no notifications at all: only the rescan (has_new on a parked reader) wakes it
        await _park(mail, "a")
        monkeypatch.setattr(inbox, "wake", _only_from_rescan(inbox))
        got.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.sleep(0.05)
            _squeeze()
            assert reader.parked and not got
            await anyio.run_process(
                [*cli, "--to", "a", "--text", "rescanned"],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        assert [e.body for e in got] == ["rescanned"]


def _only_from_rescan(inbox: Any) -> Any:
    """`inbox.wake` that ignores every caller but the rescan (a lost notification)."""
    original = inbox.wake

    def signal() -> None:
        caller = sys._getframe(1).f_code.co_name
        if caller == "rescan":
            original()

    return signal


# --- rotation and damage while parked -------------------------------------------------------------


async def test_a_rotation_half_done_while_parked_is_finished_and_read_in_order(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    """A writer killed between linking segment 0 and renaming the fresh active file over the
    log, while the reader is parked: the reader sees nothing new (same file), the next send
    finishes the rotation, and the reader reads the rest of segment 0 then segment 1."""
    team = tmp_path / "t"
    inboxes = team / "inboxes"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=500) as mail:
        inbox = await mail.open_inbox("a")
        for i in range(2):
            await mail.send(Envelope.message("lead", "a", i))
        assert (await inbox.receive(5)).seq == 0  # one read, one left in the segment
        reader = await _park(mail, "a")
        while (inboxes / "a.jsonl").stat().st_size < 500:  # fill the segment, no rotation yet
            _append(inboxes / "a.jsonl", b"\n")  # blank lines: skipped by readers, no seq
        os.link(inboxes / "a.jsonl", inboxes / "a.000000.jsonl")  # and the writer dies
        assert not reader.has_new() or reader.parked
        for to in ("b", "a"):
            await mail.send(Envelope.message("lead", to, 2))
        assert (inboxes / "a.000000.jsonl").stat().st_ino != (inboxes / "a.jsonl").stat().st_ino
        got = [await inbox.receive(5) for _ in range(2)]
        assert [(e.seq, e.body) for e in got] == [(1, 1), (2, 2)]
        await inbox.ack(*got)
        with pytest.raises(ReceiveTimeout):
            await inbox.receive(0.1)


@pytest.mark.parametrize("durability", ["none", "fsync"])
async def test_a_parked_reader_committing_behind_its_segment_keeps_nothing_open(
    tmp_path: Path, tiny: DescriptorBudget, durability: str
) -> None:
    """The reader read on into segment 1 and parked; an ack of a message of segment 0 commits a
    cursor in segment 0 (the tail check opens that segment, the commit the cursor file): a
    parked reader is no holder of the budget, so whatever the commit opened must be closed
    again, or each such member keeps two descriptors the budget never asks back."""
    team = tmp_path / "t"
    async with FileMailboxes(
        team,
        members=MEMBERS,
        segment_bytes=400,
        durability=durability,  # type: ignore[arg-type]
    ) as mail:
        held: list[Envelope] = []
        for to in MEMBERS[1:]:
            inbox = await mail.open_inbox(to)
            for i in range(6):  # a rotation after three or four
                await mail.send(Envelope.message("lead", to, i))
            got = [await inbox.receive(5) for _ in range(6)]
            assert (team / "inboxes" / f"{to}.000000.jsonl").exists()
            assert _reader(mail, to).segment > 0
            await inbox.ack(*got[2:])
            held.append(got[1])  # 0 never acked: the cursor stays at the start of segment 0
        _squeeze()
        for envelope in held:  # each commit behind its reader, parked
            await mail.inbox(envelope.recipient).ack(envelope)
            assert _reader(mail, envelope.recipient).parked or durability == "fsync"
        _squeeze()
        assert [fd for fd in _team_fds(team) if "/inboxes/" in fd] == []
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for to in MEMBERS[1:]:
            assert (await mail.inbox(to).receive(5)).body == 0
            with pytest.raises(ReceiveTimeout):
                await mail.inbox(to).receive(0.05)  # every other ack held


@pytest.mark.parametrize("how", ["deleted", "copied"])
async def test_the_cursor_file_gone_or_replaced_while_parked_keeps_the_acks(
    tmp_path: Path, tiny: DescriptorBudget, how: str
) -> None:
    team = tmp_path / "t"
    cursor = team / "inboxes" / "a.cursor.json"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        for i in range(4):
            await mail.send(Envelope.message("lead", "a", i))
        first = await inbox.receive(5)
        await inbox.ack(first)
        second = await inbox.receive(5)
        await _park(mail, "a")
        if how == "deleted":
            cursor.unlink()
        else:
            copy = cursor.with_name("copy")
            copy.write_bytes(cursor.read_bytes())
            os.replace(copy, cursor)
        await inbox.ack(second)
    async with FileMailboxes(team, members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        again = [await inbox.receive(5) for _ in range(2)]
        assert [e.body for e in again] == [2, 3]


async def test_a_log_rotated_and_its_segment_deleted_while_parked_is_reported(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    inboxes = team / "inboxes"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=400) as mail:
        inbox = await mail.open_inbox("a")
        await mail.send(Envelope.message("lead", "a", 0))
        assert (await inbox.receive(5)).seq == 0
        await _park(mail, "a")
        for i in range(1, 6):
            await mail.send(Envelope.message("lead", "a", i))
        (inboxes / "a.000000.jsonl").unlink()  # its file, by its segment name: gone
        with pytest.raises(StoreCorrupt, match="teamrt repair"):
            await inbox.receive(5)


# --- threads, fork, close -------------------------------------------------------------------------


def test_two_event_loops_in_two_threads_share_a_budget_of_one(tmp_path: Path) -> None:
    """Each loop's holders are given back on its own thread only; both teams work throughout."""
    saved = BUDGET.limit
    BUDGET.limit = 1
    errors: list[BaseException] = []
    counts: dict[str, list[int | None]] = {}

    async def team(name: str, durability: str) -> None:
        async with FileMailboxes(
            tmp_path / name,
            members=MEMBERS,
            segment_bytes=600,
            durability=durability,  # type: ignore[arg-type]
        ) as mail:
            seqs = counts.setdefault(name, [])
            for i in range(30):
                for to in MEMBERS[1:]:
                    await mail.send(Envelope.message("lead", to, i))
                for to in MEMBERS[1:]:
                    e = await mail.inbox(to).receive(30)
                    seqs.append(e.seq)
                    await mail.inbox(to).ack(e)

    def run(name: str, durability: str) -> None:
        try:
            anyio.run(team, name, durability)
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [
            threading.Thread(target=run, args=(f"t{i}", d))
            for i, d in enumerate(["none", "fsync", "none"])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        BUDGET.limit = saved
    assert not errors, errors
    for seqs in counts.values():
        assert seqs == [i for i in range(30) for _ in MEMBERS[1:]]


async def test_a_forked_child_uses_the_inherited_budget_and_the_parent_reads_on(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for to in MEMBERS[1:]:
            await mail.send(Envelope.message("lead", to, 0))
            assert (await mail.inbox(to).receive(5)).seq == 0
        pid = os.fork()
        if pid == 0:  # the child: a team of its own, the parent's holders inherited
            code = 1
            try:

                async def child() -> None:
                    async with FileMailboxes(tmp_path / "c", members=MEMBERS) as other:
                        for to in MEMBERS[1:]:
                            await other.send(Envelope.message("lead", to, 1))
                            assert (await other.inbox(to).receive(5)).seq == 0
                        # and the parent's team, from here: appended after the parent's
                        async with FileMailboxes(team) as shared:
                            await shared.send(Envelope.message("lead", "a", "child"))

                anyio.run(child)
                code = 0
            finally:
                os._exit(code)
        _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for to in MEMBERS[1:]:
            await mail.send(Envelope.message("lead", to, 2))
        got = [await mail.inbox("a").receive(5) for _ in range(2)]
        assert [(e.seq, e.body) for e in got] == [(1, "child"), (2, 2)]
        for to in ("b", "c", "d"):
            e = await mail.inbox(to).receive(5)
            assert (e.seq, e.body) == (1, 2)


def test_a_fork_while_another_thread_is_inside_the_budget(tmp_path: Path) -> None:
    """Another thread holds the budget's lock (registering a holder of its own event loop) at
    the instant this one forks: the child, whose copy of that lock nobody will release, must
    still be able to open and send."""
    entered, leave = threading.Event(), threading.Event()

    def inside() -> None:
        with BUDGET._lock:
            entered.set()
            leave.wait(60)

    async def child() -> None:
        async with FileMailboxes(tmp_path / "c", members=MEMBERS) as mail:
            await mail.send(Envelope.message("lead", "a", 1))
            assert (await mail.inbox("a").receive(5)).body == 1

    thread = threading.Thread(target=inside)
    thread.start()
    assert entered.wait(30)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                anyio.run(child)
                code = 0
            finally:
                os._exit(code)
    finally:
        leave.set()
        thread.join()
    for _ in range(300):  # up to 30 s: a child stuck on the lock never ends
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the budget's lock")
    assert os.waitstatus_to_exitcode(status) == 0


async def test_closing_parked_readers_leaves_no_descriptor_and_no_holder(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    before = set(BUDGET._holders)
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for to in MEMBERS[1:]:
            await mail.send(Envelope.message("lead", to, 0))
            await mail.open_inbox(to)
        inbox = mail.inbox("a")
        reader = _reader(mail, "a")
        assert reader.parked
        tail = await _store(mail).tail_reader("b")
        await mail.send(Envelope.message("lead", "c", 1))  # parks the tail reader too
    assert _team_fds(team) == []
    assert set(BUDGET._holders) <= before | {tail}  # the tail reader: its owner closes it
    assert tail.parked
    tail.close()
    assert set(BUDGET._holders) <= before
    assert _team_fds(team) == []
    with pytest.raises(MailboxClosed):
        await inbox.receive(0.1)
    assert not reader.has_new() or reader.fd < 0


async def test_teamrt_inspect_and_replay_while_readers_are_parked(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=600) as mail:
        for i in range(12):
            for to in MEMBERS[1:]:
                await mail.send(Envelope.message("lead", to, i))
        for to in MEMBERS[1:]:
            inbox = await mail.open_inbox(to)
            await inbox.ack(*[await inbox.receive(5) for _ in range(6)])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for command in (["inspect", "--json"], ["replay"]):
            done = await anyio.run_process(
                [sys.executable, "-m", "teamrt", *command, str(team)], env=env
            )
            assert done.returncode == 0
        for to in MEMBERS[1:]:
            got = [await mail.inbox(to).receive(5) for _ in range(6)]
            assert [e.seq for e in got] == list(range(6, 12))


async def test_a_request_watched_without_consuming_by_a_parked_tail_reader(
    tmp_path: Path, tiny: DescriptorBudget
) -> None:
    """`request(consume=False)` reads the sender's inbox with a tail reader, which parks while
    it polls and the log rotates under it: the answer is still found."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=500) as mail:
        worker = await mail.open_inbox("a")

        async def answer() -> None:
            e = await worker.receive(30)
            for i in range(8):  # rotations of lead's inbox before the answer
                await mail.send(Envelope.message("a", "lead", i))
                await mail.send(Envelope.message("lead", "b", i))  # and parks, drops
            await mail.send(Envelope.response(e, "yes"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer)
            got = await mail.request(
                Envelope.request("lead", "a", "?"), timeout=30, consume=False, require_live=False
            )
        assert got.body == "yes"
    assert (team / "inboxes" / "lead.000000.jsonl").exists()


# --- the tools' caches ----------------------------------------------------------------------------

_DECORATOR = """
from __future__ import annotations
import functools

def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper
"""

_TOOL_MODULE = """
from __future__ import annotations
from pydantic import BaseModel
from {decorator} import logged

class Item(BaseModel):
    {field}: int

@logged
def put(item: Item) -> str:
    return type(item).__module__
"""


def _module(path: Path, name: str, source: str) -> Any:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_wrapped_tools_of_two_modules_resolve_their_own_string_annotations(tmp_path: Path) -> None:
    """The same decorator (`functools.wraps`: one wrapper code, the decorator's globals) on a
    function of each of two modules whose string annotations name each module's own `Item`."""
    tag = f"hx{os.getpid()}{random.randrange(1 << 30)}"
    try:
        _module(tmp_path / "deco.py", f"{tag}_deco", _DECORATOR)
        first = _module(
            tmp_path / "one.py",
            f"{tag}_one",
            _TOOL_MODULE.format(decorator=f"{tag}_deco", field="one_only"),
        )
        second = _module(
            tmp_path / "two.py",
            f"{tag}_two",
            _TOOL_MODULE.format(decorator=f"{tag}_deco", field="two_only"),
        )
        one, two = tool(first.put), tool(second.put)
        assert one.args_model.model_fields["item"].annotation is first.Item
        assert two.args_model.model_fields["item"].annotation is second.Item
        parsed = two.parse('{"item": {"two_only": 2}}')
        assert not hasattr(parsed, "ok"), parsed  # validated: not an error result
    finally:
        for suffix in ("deco", "one", "two"):
            sys.modules.pop(f"{tag}_{suffix}", None)


def test_closures_whose_defaults_are_equal_but_not_the_same_keep_their_own() -> None:
    """`(1,) == (True,)` and `0.0 == -0.0`, with equal hashes: each closure's own default."""

    def make(default: Any) -> Any:
        def pick(value: Any = default) -> str:
            """Pick."""
            return repr(value)

        return tool(pick)

    for a, b in (((1,), (True,)), (0.0, -0.0), (frozenset({1}), frozenset({1.0}))):
        first, second = make(a), make(b)
        assert repr(first.args_model.model_validate({}).value) == repr(a)
        assert repr(second.args_model.model_validate({}).value) == repr(b)

    same = make(30.0), make(float("30"))  # equal, of one type, two objects: still shared
    assert same[0].args_model is same[1].args_model


def test_closures_with_other_annotations_per_function_get_their_own_model() -> None:
    def make(kind: type) -> Any:
        def take(value: Any) -> str:
            """Take."""
            return type(value).__name__

        take.__annotations__ = {"value": kind, "return": str}
        return tool(take)

    as_int, as_str = make(int), make(str)
    assert as_int.args_model.model_validate({"value": "3"}).value == 3
    assert as_str.args_model.model_validate({"value": "3"}).value == "3"

    def unhashable_default(items: list[int] = [1, 2]) -> int:  # noqa: B006 -- the point
        """Count."""
        return len(items)

    assert tool(unhashable_default).args_model.model_validate({}).model_dump() == {"items": [1, 2]}

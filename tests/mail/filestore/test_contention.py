"""Contended appends: the adaptive spin before the worker thread, and what it must not change
(nothing lost, nothing reordered, whichever way each append got the lock)."""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import threading
import time
from pathlib import Path

import anyio

from teamrt import Envelope, FileMailboxes
from teamrt.mail.filestore import appender as appender_module
from teamrt.mail.filestore.appender import Appender
from teamrt.mail.filestore.store import FileStore
from tests.support.children import drain_all, finish, read_acked, spawn, wait_ready

MEMBERS = ("lead", "worker")


def _lock_fd(team: Path, name: str = "worker") -> int:
    """A descriptor of the inbox's lock file of its own: its flock excludes the store's, as
    another process's would."""
    return os.open(team / "inboxes" / f"{name}.lock", os.O_RDWR | os.O_CLOEXEC)


def _append_raw(team: Path, data: bytes) -> None:
    with open(team / "inboxes" / "worker.jsonl", "ab") as f:
        f.write(data)


async def _appender(mail: FileMailboxes, name: str = "worker") -> Appender:
    await mail.send(Envelope.message("lead", name, "first"))  # opens the appender
    store = mail.store
    assert isinstance(store, FileStore)
    return store._appenders[name]


async def test_the_spin_budget_shrinks_to_nothing_while_spins_fail_and_grows_when_they_win(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        appender = await _appender(mail)
        other = _lock_fd(team)
        try:
            fcntl.flock(other, fcntl.LOCK_EX)  # a holder that does not let go
            budgets = [appender.spin_budget]
            while appender.spin_budget:
                assert not appender.spin()
                budgets.append(appender.spin_budget)
            assert budgets[0] == appender_module.SPIN_START_US
            assert all(b < a for a, b in itertools.pairwise(budgets))  # halved each time
            assert appender.spins_lost == len(budgets) - 1

            # with nothing to gain, it no longer spins, but probes now and then
            lost = appender.spins_lost
            for _ in range(3 * appender_module.SPIN_PROBE_EVERY):
                assert not appender.spin()
            assert appender.spins_lost - lost == 3  # one short spin per SPIN_PROBE_EVERY
            assert appender.spins_skipped == 3 * (appender_module.SPIN_PROBE_EVERY - 1)

            fcntl.flock(other, fcntl.LOCK_UN)  # holders let go quickly again
            wins = []
            for _ in range(appender_module.SPIN_PROBE_EVERY):
                if appender.spin():
                    appender.unlock()
                    wins.append(appender.spin_budget)
                    break
            assert wins == [appender_module.SPIN_MIN_US]  # the probe won: spinning resumes
            while appender.spin_budget < appender_module.SPIN_MAX_US:
                before = appender.spin_budget
                assert appender.spin()
                appender.unlock()
                assert appender.spin_budget > before  # doubled by every win
            assert appender.spin()
            appender.unlock()
            assert appender.spin_budget == appender_module.SPIN_MAX_US  # and no further
        finally:
            os.close(other)


async def test_a_send_spins_past_a_short_hold_and_waits_out_a_long_one(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        appender = await _appender(mail)
        other = _lock_fd(team)
        try:
            # a hold well inside the spin budget (released by a timer: spun, or at once if the
            # timer came first)
            appender.spin_budget = appender_module.SPIN_MAX_US
            fcntl.flock(other, fcntl.LOCK_EX)
            release = threading.Timer(0.0001, fcntl.flock, (other, fcntl.LOCK_UN))
            release.start()
            try:
                with anyio.fail_after(10):
                    await mail.send(Envelope.message("lead", "worker", 1))
            finally:
                release.join()
            assert appender.spins_won + appender.spins_lost + appender.spins_skipped <= 1

            # a hold that outlasts the spin: the send waits in a worker thread, and the event
            # loop runs meanwhile
            won, waited = appender.spins_won, appender.spins_lost + appender.spins_skipped
            appender.spin_budget = appender_module.SPIN_MAX_US
            fcntl.flock(other, fcntl.LOCK_EX)
            async with anyio.create_task_group() as tg:
                tg.start_soon(mail.send, Envelope.message("lead", "worker", 2))
                with anyio.fail_after(10):
                    while appender.spins_lost + appender.spins_skipped == waited:  # noqa: ASYNC110
                        await anyio.sleep(0.001)  # the loop runs while the send waits
                assert appender.spins_won == won
                fcntl.flock(other, fcntl.LOCK_UN)
        finally:
            os.close(other)
        inbox = mail.inbox("worker")
        assert [inbox.receive_nowait().body for _ in range(3)] == ["first", 1, 2]


async def test_contended_appends_from_several_processes_lose_and_reorder_nothing(
    tmp_path: Path,
) -> None:
    """Writer processes send while this process takes the inbox lock again and again for short
    and long spells, so appends get the lock every way there is: at once, by spinning, and in a
    worker thread."""
    nprocs, count = 3, 150
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    acks = [tmp_path / f"acks{k}" for k in range(nprocs)]
    procs = [
        spawn("send", str(team), f"s{k}", str(count), "20", str(acks[k]), "0")
        for k in range(nprocs)
    ]
    wait_ready([Path(f"{a}.ready") for a in acks], procs)
    stop = threading.Event()

    def interfere() -> None:
        fd, rng = _lock_fd(team), random.Random(7)
        try:
            while not stop.is_set():
                fcntl.flock(fd, fcntl.LOCK_EX)
                time.sleep(rng.choice((0, 0.00005, 0.0002, 0.002)))
                fcntl.flock(fd, fcntl.LOCK_UN)
                time.sleep(0.0001)
        finally:
            os.close(fd)

    holder = threading.Thread(target=interfere)
    holder.start()
    try:
        (tmp_path / "go").touch()
        for proc in procs:
            finish(proc)
    finally:
        stop.set()
        holder.join()

    got, quarantined = await drain_all(team)
    assert quarantined == 0
    assert len(got) == nprocs * count and len({e.id for e in got}) == len(got)
    assert [e.seq for e in got] == list(range(len(got)))
    for k in range(nprocs):
        assert [e.body["i"] for e in got if e.sender == f"s{k}"] == list(range(count))
        assert {row[0] for row in read_acked(acks[k])} <= {e.id for e in got}  # acked is there


async def test_a_writer_continues_seq_after_other_writers_lines_and_never_from_garbage(
    tmp_path: Path,
) -> None:
    """The one-read recovery of `seq` after other writers appended (the contended case) takes
    their lines' seq only when it continues densely from ours; anything else goes the long way."""
    team = tmp_path / "t"
    async with (
        FileMailboxes(team, members=MEMBERS) as a,
        FileMailboxes(team) as b,  # its own descriptors, as another process
    ):
        await a.send(Envelope.message("lead", "worker", 0))
        await b.send(Envelope.message("lead", "worker", 1))
        await b.send(Envelope.message("lead", "worker", 2))
        await a.send(Envelope.message("lead", "worker", 3))  # after two lines of b's
        _append_raw(team, b'{"seq":77,"team":"t","v":1}\n')  # a line that only looks right
        await b.send(Envelope.message("lead", "worker", 4))
        await a.send(Envelope.message("lead", "worker", 5))
        _append_raw(team, b'{"seq":6,"team":"t","v":1,"torn')  # a writer died mid-append
        await b.send(Envelope.message("lead", "worker", 6))
        await a.send(Envelope.message("lead", "worker", 7))
        inbox, got = a.inbox("worker"), []
        while True:
            try:
                got.append(inbox.receive_nowait())
            except anyio.WouldBlock:
                break
        assert [(e.seq, e.body) for e in got] == [(i, i) for i in range(8)]
        assert inbox.statistics().quarantined == 2

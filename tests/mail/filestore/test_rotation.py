"""Rotation never leaves an inbox without an active log: for readers, for writers, for a writer
killed at any step of it or failing in the middle of it; descriptors and watches stay flat."""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, StoreError
from teamrt.mail.filestore import InboxPaths
from teamrt.mail.filestore.framing import decode_all
from teamrt.mail.log import Record
from tests.mail.filestore.helpers import received_now
from tests.support.children import finish, read_acked, spawn, wait_ready

MEMBERS = ("lead", "worker")


def _all_lines(team: Path) -> list[Record]:
    records = []
    for segment in InboxPaths(team / "inboxes", "worker").segments():
        items, pending = decode_all(segment.read_bytes())
        assert pending == 0
        records += [x for x in items if isinstance(x, Record)]
    return records


async def test_the_active_log_exists_at_every_step_and_readers_cross_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "t"
    log = team / "inboxes" / "worker.jsonl"
    seen: list[str] = []
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=600) as mail:
        inbox = mail.inbox("worker")
        got: list[Envelope] = []
        real_link, real_rename = os.link, os.rename

        def check(step: str) -> None:
            assert log.exists(), f"no active log {step}"
            seen.append(step)
            got.extend(_drain_now(inbox))  # a reader arriving right now must not fail

        def link(*args: Any, **kwargs: Any) -> None:
            check("before link")
            real_link(*args, **kwargs)
            check("after link")

        def rename(*args: Any, **kwargs: Any) -> None:
            check("before rename")
            real_rename(*args, **kwargs)
            check("after rename")

        monkeypatch.setattr(os, "link", link)
        monkeypatch.setattr(os, "rename", rename)
        for i in range(30):
            await mail.send(Envelope.message("lead", "worker", {"i": i, "pad": "x" * 100}))
        monkeypatch.undo()
        got += await received_now(mail)
    assert {"after link", "before rename"} <= set(seen)
    assert [e.body["i"] for e in got] == list(range(30))
    assert [e.seq for e in got] == list(range(30))


def _drain_now(inbox: Any) -> list[Envelope]:
    out = []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except anyio.WouldBlock:
            return out


@pytest.mark.parametrize("errno_", [errno.EMFILE, errno.ENOSPC])
async def test_a_failure_in_the_middle_of_a_rotation_is_repaired_by_the_next_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: int
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=600) as mail:
        real_open = os.open

        def failing_open(path: Any, *args: Any, **kwargs: Any) -> int:
            if str(path).endswith(".jsonl.next"):
                raise OSError(errno_, os.strerror(errno_))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", failing_open)
        failed_at, error = -1, ""
        for i in range(10):
            try:
                await mail.send(Envelope.message("lead", "worker", {"i": i, "pad": "x" * 100}))
            except StoreError as exc:
                failed_at, error = i, str(exc)
                break
        monkeypatch.undo()
        assert failed_at > 0 and os.strerror(errno_) in error
        # half rotated: segment 0 and the active name are one file, which still exists
        paths = InboxPaths(team / "inboxes", "worker")
        assert paths.log.exists() and paths.segment(0).exists() and paths.active_index() == 0
        for i in range(failed_at, 20):
            await mail.send(Envelope.message("lead", "worker", {"i": i, "pad": "x" * 100}))
        got = await received_now(mail)
    assert [e.body["i"] for e in got] == list(range(20))
    assert [e.seq for e in got] == list(range(20))
    assert len({r.envelope.id for r in _all_lines(team)}) == len(_all_lines(team)) == 20


@pytest.mark.parametrize("step", ["link", "create", "rename"])
async def test_a_writer_killed_at_any_step_of_a_rotation(tmp_path: Path, step: str) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=2048):
        pass
    acks = tmp_path / "acks"
    (tmp_path / "go").touch()
    proc = spawn(
        "send",
        *(str(team), "s0", "100", "300", str(acks), "0"),
        env={"TEAMRT_TEST_FAULT": f"rotation:{step}:2"},
    )
    finish(proc, -signal.SIGKILL)
    acked = read_acked(acks)
    assert 0 < len(acked) < 100
    assert (team / "inboxes" / "worker.jsonl").exists()
    async with FileMailboxes(team) as mail:
        for i in range(5):  # the next writer finishes the rotation
            await mail.send(Envelope.message("lead", "worker", {"i": 1000 + i, "pad": "x" * 300}))
        got = await received_now(mail)
        assert mail.inbox("worker").statistics().quarantined == 0
    assert [e.id for e in got[: len(acked)]] == [row[0] for row in acked]
    assert [e.body["i"] for e in got[len(acked) :]] == list(range(1000, 1005))
    assert [e.seq for e in got] == list(range(len(got)))  # no gap, no repeat


async def test_descriptors_and_watches_stay_flat_over_thousands_of_rotations(
    tmp_path: Path, stress: bool
) -> None:
    rotations = 20_000 if stress else 5_000
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=64) as mail:
        inbox = mail.inbox("worker")
        store: Any = mail.store

        def counts() -> tuple[int, int]:
            return len(os.listdir("/proc/self/fd")), store.watch_count()

        await mail.send(Envelope.message("lead", "worker", 0))
        await inbox.ack(await inbox.receive(timeout=5))
        before = counts()
        for i in range(1, rotations + 1):
            await mail.send(Envelope.message("lead", "worker", i))  # each send rotates
            if i % 500 == 0:
                for envelope in _drain_now(inbox):
                    inbox.ack_nowait(envelope)
                await anyio.sleep(0.001)  # let inotify events and commits run
        got = _drain_now(inbox)
        await inbox.ack(*got)
        after = counts()
        paths = InboxPaths(team / "inboxes", "worker")
        assert paths.rotated_count() >= rotations - 1
    assert after == before


async def test_many_writers_killed_during_rotations_lose_nothing(
    tmp_path: Path, stress: bool
) -> None:
    """12 writer processes with small segments, one consumer process; some writers die in the
    middle of a rotation, others at random moments. No error, no loss, no seq gap."""
    nwriters, count = (12, 600) if stress else (12, 120)
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=4096):
        pass
    effects = tmp_path / "effects"
    consumer = spawn("consume-until", str(team), str(effects), "final")
    wait_ready([Path(f"{effects}.ready")], [consumer])
    acks = [tmp_path / f"acks{k}" for k in range(nwriters)]
    faults = ["rotation:link:3", "rotation:create:3", "rotation:rename:3"]
    procs = [
        spawn(
            "send",
            *(str(team), f"s{k}", str(count), "200", str(acks[k]), "0"),
            env={"TEAMRT_TEST_FAULT": faults[k]} if k < len(faults) else None,
        )
        for k in range(nwriters)
    ]
    wait_ready([Path(f"{a}.ready") for a in acks], procs)
    (tmp_path / "go").touch()
    rng = random.Random(11)
    time.sleep(0.05)
    for proc in rng.sample(procs[len(faults) :], 3):
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=120)
        assert proc.returncode in (0, -signal.SIGKILL)
        finish(proc, proc.returncode)
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "final"))
    finish(consumer)

    consumed = [line.split() for line in effects.read_text().splitlines()]
    consumed_ids = {row[0] for row in consumed}
    acked = [row for path in acks for row in read_acked(path)]
    assert sum(p.returncode == -signal.SIGKILL for p in procs) >= len(faults)
    assert [row for row in acked if row[0] not in consumed_ids] == []  # no loss
    seqs = [int(row[1]) for row in consumed]
    assert seqs == list(range(len(seqs)))  # one dense total order across every segment
    assert len(consumed_ids) == len(consumed)  # nothing delivered twice
    assert len(list((team / "inboxes").glob("worker.0*.jsonl"))) > 20  # it did rotate

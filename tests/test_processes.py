"""Claims about processes, tested with real processes: concurrent writers, SIGKILL mid-append,
a consumer killed before its ack, and a cross-process wake-up."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.mail.filestore import InboxPaths
from teamrt.mail.filestore.framing import decode_all
from teamrt.mail.log import Record
from tests.support.children import drain_all, finish, read_acked, spawn, wait_ready

MEMBERS = ("lead", "worker")


def _drop_torn_row(path: Path) -> None:
    """A SIGKILL can tear the row a sender was writing (a write that crosses a page is cut
    between pages): drop it, so that it is not read, nor glued to the next sender's first row.
    Its envelope was sent, and the next sender sends that index again (order still holds)."""
    if path.exists():
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            os.truncate(path, data.rfind(b"\n") + 1)


async def test_concurrent_processes_into_one_inbox(tmp_path: Path, stress: bool) -> None:
    nprocs, count = (8, 2000) if stress else (4, 150)
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    acks = [tmp_path / f"acks{k}" for k in range(nprocs)]
    procs = [
        spawn("send", str(team), f"s{k}", str(count), "20", str(acks[k]), "0")
        for k in range(nprocs)
    ]
    wait_ready([Path(f"{a}.ready") for a in acks], procs)
    (tmp_path / "go").touch()
    for proc in procs:
        finish(proc)

    got, quarantined = await drain_all(team)
    assert quarantined == 0
    assert len(got) == nprocs * count  # none lost
    assert len({e.id for e in got}) == len(got)  # none duplicated
    assert [e.seq for e in got] == list(range(len(got)))  # one dense total order
    for k in range(nprocs):  # each sender's order kept
        assert [e.body["i"] for e in got if e.sender == f"s{k}"] == list(range(count))


async def test_writer_torn_mid_append_loses_nothing_else(tmp_path: Path) -> None:
    """Deterministic: the 3rd append writes 5,000 of its ~8,000 bytes, then SIGKILL."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    acks = tmp_path / "acks"
    proc = spawn(
        "send",
        str(team),
        "s0",
        "5",
        "8000",
        str(acks),
        "0",
        env={"TEAMRT_TEST_FAULT": "torn-append:5000:3"},
    )
    (tmp_path / "go").touch()
    finish(proc, -signal.SIGKILL)
    assert len(read_acked(acks)) == 2
    log = (team / "inboxes" / "worker.jsonl").read_bytes()
    assert not log.endswith(b"\n")  # the torn fragment is there, unterminated

    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "after the crash"))
    got, quarantined = await drain_all(team)
    assert [e.body["i"] for e in got[:2]] == [0, 1]
    assert got[2].body == "after the crash"
    assert quarantined == 1
    entry = json.loads((team / "inboxes" / "worker.quarantine.jsonl").read_text())
    assert entry["offset"] == len(log) - 5000 and entry["end"] == len(log) + 1


async def test_writers_killed_at_random_never_lose_an_acked_envelope(
    tmp_path: Path, stress: bool
) -> None:
    rounds = 30 if stress else 6
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    (tmp_path / "go").touch()
    rng = random.Random(7)
    next_i: dict[str, int] = defaultdict(int)
    acks = {name: tmp_path / f"acks-{name}" for name in ("s0", "s1")}
    for _ in range(rounds):
        procs = {}
        for name in acks:
            pad = str(rng.choice([3000, 5000, 9000]))  # lines that straddle page boundaries
            procs[name] = spawn(
                "send", str(team), name, "100000", pad, str(acks[name]), str(next_i[name])
            )
        wait_ready([Path(f"{a}.ready") for a in acks.values()], list(procs.values()))
        time.sleep(rng.uniform(0.01, 0.08))
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
        for name, proc in procs.items():
            finish(proc, -signal.SIGKILL)
            for path in [Path(f"{acks[name]}.ready")]:
                path.unlink()
            _drop_torn_row(acks[name])
            rows = read_acked(acks[name])
            next_i[name] = rows[-1][2] + 1 if rows else 0

    # a later writer seals whatever the last kill left
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "final"))

    got, quarantined = await drain_all(team)
    delivered = {e.id for e in got}
    assert sum(len(read_acked(path)) for path in acks.values()) > 0, "every kill came too early"
    for name, path in acks.items():
        acked = read_acked(path)
        missing = [row for row in acked if row[0] not in delivered]
        assert missing == []  # every acknowledged envelope is delivered
        order = [e.body["i"] for e in got if e.sender == name]
        assert order == sorted(order)  # per-sender order, even across restarts
    assert got[-1].body == "final"
    # every line that is not a good envelope was quarantined, none was glued to a good one
    items = []
    for segment in InboxPaths(team / "inboxes", "worker").segments():
        decoded, pending = decode_all(segment.read_bytes())
        assert pending == 0
        items += decoded
    corrupt = [x for x in items if not isinstance(x, Record)]
    assert quarantined == len(corrupt)
    assert len([x for x in items if isinstance(x, Record)]) == len(got)


async def test_consumer_killed_before_ack_gets_the_envelope_again(tmp_path: Path) -> None:
    team = tmp_path / "t"
    first = Envelope.message("lead", "worker", "handle me")
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(first)
    effects = tmp_path / "effects"
    proc = spawn("consume-and-die", str(team), str(effects))
    finish(proc, -signal.SIGKILL)
    assert effects.read_text().split() == [first.id]

    proc = spawn("consume", str(team), str(effects), "1")
    finish(proc)
    assert effects.read_text().split() == [first.id, first.id]  # delivered again

    # a sender that retries the same envelope after the ack: dropped by id
    second = Envelope.message("lead", "worker", "second")
    async with FileMailboxes(team) as mail:
        await mail.send(first)
        await mail.send(second)
    proc = spawn("consume", str(team), str(effects), "1")
    finish(proc)
    assert effects.read_text().split() == [first.id, first.id, second.id]


async def test_receiver_in_another_process_wakes_on_send(tmp_path: Path) -> None:
    """The receiver's safety rescan is an hour: only the file notification can wake it."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        out = tmp_path / "out"
        proc = spawn("wait-one", str(team), str(out))
        wait_ready([Path(f"{out}.ready")], [proc])
        await anyio.sleep(0.2)  # let it block in receive()
        await mail.send(Envelope.message("lead", "worker", "wake up"))
        finish(proc)
    assert json.loads(out.read_text())["body"] == "wake up"


@pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux-only")
def test_inotify_binding_loads() -> None:
    from teamrt.mail import inotify

    assert inotify.available()

"""Values are never changed silently: NaN and Infinity are refused on send, times must be finite,
the team's envelope limit binds every sender, one garbage line cannot move `seq`, and a broadcast
that reaches only some members says who got it."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes
from teamrt.errors import EnvelopeTooLarge, InvalidEnvelope, PartialBroadcast
from teamrt.mail.log import encode, stamp

MEMBERS = ("lead", "worker", "writer", "critic")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_nan_and_infinity_in_a_body_are_refused(bad: float) -> None:
    async with MemoryMailboxes(members=MEMBERS) as mail:
        with pytest.raises(InvalidEnvelope, match="JSON cannot carry"):
            await mail.send(Envelope.message("lead", "worker", {"score": [1.0, bad]}))
        await mail.send(Envelope.message("lead", "worker", {"text": "NaN and Infinity"}))
        got = mail.inbox("worker").receive_nowait()
        assert got.body == {"text": "NaN and Infinity"}  # the words themselves are fine
        with pytest.raises(anyio.WouldBlock):
            mail.inbox("worker").receive_nowait()


async def test_times_must_be_finite() -> None:
    with pytest.raises(InvalidEnvelope, match="deadline"):
        Envelope.request("lead", "worker", "x", timeout=math.inf)
    async with MemoryMailboxes(members=MEMBERS) as mail:
        sneaky = Envelope.message("lead", "worker", "x").model_copy(update={"ts": math.nan})
        with pytest.raises(InvalidEnvelope, match="holds NaN"):
            await mail.send(sneaky)  # model_copy does not validate: send checks again


async def test_the_teams_envelope_limit_binds_every_sender(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, max_envelope=2000):
        pass
    assert json.loads((team / "team.json").read_text())["max_envelope"] == 2000
    # asks for a larger limit, with claim checks off: the team's limit refuses the envelope
    async with FileMailboxes(team, max_envelope=1 << 20, max_blob=0) as mail:
        with pytest.raises(EnvelopeTooLarge, match="over the limit of 2000"):
            await mail.send(Envelope.message("lead", "worker", "x" * 3000))
        await mail.send(Envelope.message("lead", "worker", "x" * 1000))
        got = mail.inbox("worker").receive_nowait()
        assert got.body == "x" * 1000
        mail.inbox("worker").ack_nowait(got)
    async with FileMailboxes(team, max_envelope=1 << 20) as mail:  # with claim checks (default)
        await mail.send(Envelope.message("lead", "worker", "y" * 3000))
        assert (team / "blobs").is_dir()  # over the team's limit: the body went as a blob
        assert mail.inbox("worker").receive_nowait().body == "y" * 3000


async def test_seq_recovery_ignores_lines_that_are_not_envelopes_of_the_inbox(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        for i in range(3):
            await mail.send(Envelope.message("lead", "worker", i))
    log = team / "inboxes" / "worker.jsonl"
    other = Envelope.message("lead", "writer", "not yours")
    log.write_bytes(
        log.read_bytes()
        + b'{"seq":999999999,"team":"t"}\n'  # garbage with a huge seq
        + stamp(encode(other), 888888888, b"t")  # an envelope for another member
    )
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "next"))
        got = []
        while True:
            try:
                got.append(mail.inbox("worker").receive_nowait())
            except anyio.WouldBlock:
                break
    assert [(e.body, e.seq) for e in got] == [(0, 0), (1, 1), (2, 2), ("next", 3)]


async def test_a_broadcast_that_reaches_some_members_names_who_got_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        full = os.open(team / "inboxes" / "writer.jsonl", os.O_RDONLY)
        full_ino = os.fstat(full).st_ino
        os.close(full)
        real_write = os.write

        def write(fd: int, data: Any) -> int:
            if os.fstat(fd).st_ino == full_ino:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)
        with pytest.raises(PartialBroadcast) as caught:
            await mail.send(Envelope.broadcast("lead", "stand down"))
        monkeypatch.undo()
        error = caught.value
        assert error.delivered == ("worker", "critic") and error.undelivered == ("writer",)
        assert "reached worker, critic but not writer (append to writer's inbox: No space" in str(
            error
        )
        assert "nothing was written" not in str(error)
        for name in ("worker", "critic"):
            assert mail.inbox(name).receive_nowait().body == "stand down"
        with pytest.raises(anyio.WouldBlock):
            mail.inbox("writer").receive_nowait()


async def test_a_garbage_line_between_two_sends_of_one_writer_cannot_move_seq(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    log = team / "inboxes" / "worker.jsonl"
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", 0))
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)  # another writer, mid-session
        os.write(fd, b'{"seq":999999999,"team":"t","v":1}\n')
        os.close(fd)
        await mail.send(Envelope.message("lead", "worker", 1))
        got = [mail.inbox("worker").receive_nowait() for _ in range(2)]
    assert [(e.body, e.seq) for e in got] == [(0, 0), (1, 1)]

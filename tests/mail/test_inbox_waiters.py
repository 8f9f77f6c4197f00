"""The round trip's fast paths: the inbox's per-task waiters, the skipped reads
after a read that caught up (`InboxReader.caught_up`, `Inbox._poked`), the file reader's size
from a seek, and the envelope constructors that build their model without validation.

Each test tries to lose an envelope, deliver one twice, hang a receiver or a requester, or build
an envelope the validating path (`_build`) would refuse or build differently. Where the claim is
about processes, a real one writes (this file is also the child:
`python tests/mail/test_inbox_waiters.py`).
"""

from __future__ import annotations

import enum
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, ConfigDict, PrivateAttr

from teamrt import Envelope, FileMailboxes
from teamrt.envelopes import Message, Request, Response, _build, _dump_body, _type_of
from teamrt.errors import ReceiveTimeout, StoreCorrupt
from teamrt.mail import inotify
from teamrt.mail.filestore import fileio
from teamrt.mail.filestore.framing import LineSplitter
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.memory import MemoryStore

MEMBERS = ["lead", "worker"]


# --- constructors: the direct path against _build ---------------------------------------------


class _Sub(str):
    pass


class _Who(enum.StrEnum):
    ALICE = "alice"


class _Body(BaseModel):
    x: int = 1


def _outcome(make: Callable[[], Envelope]) -> object:
    """What a constructor makes, comparably: kind, fields in order with their types, fields
    set; or the error it raises (type and text). The id and ts are fresh each time."""
    try:
        envelope = make()
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    fields = {k: v for k, v in envelope.__dict__.items() if k not in ("id", "ts")}
    return (
        type(envelope).__name__,
        [(k, type(v).__name__, v) for k, v in fields.items()],
        sorted(envelope.model_fields_set),
        envelope.__pydantic_extra__,
        envelope.__pydantic_private__,
    )


NAMES: list[Any] = [
    "alice",
    "a" * 64,
    "a" * 65,
    "",
    "alice\n",
    "al ice",
    "é",
    "../x",
    "*",
    _Sub("alice"),
    _Who.ALICE,
    5,
    None,
]
BODIES: list[Any] = [
    "hi",
    None,
    10**400,
    float("nan"),
    b"raw",
    _Sub("s"),
    {"m": _Body()},
    [_Body()],
    _Body(),
]
TYPES: list[Any] = ["t", "t" * 64, "t" * 65, "", "é" * 64, _Sub("t"), _Who.ALICE, 3]
TRACES: list[Any] = [None, "tr", "", "x" * 1000, _Sub("tr"), 5, _Who.ALICE]


def _cases() -> Iterator[tuple[Any, Any, Any, Any, Any]]:
    for name in NAMES:
        yield name, "bob", "hi", "t", None
        yield "bob", name, "hi", "t", None
    for body in BODIES:
        yield "alice", "bob", body, "t", None
    for type_name in TYPES:
        yield "alice", "bob", "hi", type_name, None
    for trace in TRACES:
        yield "alice", "bob", "hi", "t", trace


@pytest.mark.parametrize(("sender", "recipient", "body", "type_name", "trace"), list(_cases()))
def test_message_and_request_build_what_build_builds(
    sender: Any, recipient: Any, body: Any, type_name: Any, trace: Any
) -> None:
    fast = _outcome(
        lambda: Envelope.message(sender, recipient, body, type=type_name, trace_id=trace)
    )
    slow = _outcome(
        lambda: _build(
            Message,
            sender=sender,
            recipient=recipient,
            body=_dump_body(body),
            type=_type_of(body, type_name),
            trace_id=trace,
        )
    )
    assert fast == slow
    fast = _outcome(
        lambda: Envelope.request(sender, recipient, body, type=type_name, trace_id=trace)
    )
    slow = _outcome(
        lambda: _build(
            Request,
            sender=sender,
            recipient=recipient,
            body=_dump_body(body),
            type=_type_of(body, type_name),
            trace_id=trace,
            ts=time.time(),
            deadline=None,
        )
    )
    assert fast == slow


@pytest.mark.parametrize(
    "timeout",
    [0, -1, 1, True, 2.5, math.nan, math.inf, -math.inf, 10**20, 1e308, 10**400],
    ids=repr,
)
def test_request_timeouts_build_what_build_builds(
    timeout: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("teamrt.envelopes.time.time", lambda: 1000.0)

    def slow() -> Envelope:
        deadline = 1000.0 + timeout  # OverflowError for a huge int, as the constructor raises
        return _build(Request, sender="alice", recipient="bob", body="x", type="request",
                      ts=1000.0, trace_id=None, deadline=deadline)  # fmt: skip

    assert _outcome(lambda: Envelope.request("alice", "bob", "x", timeout=timeout)) == _outcome(
        slow
    )


def _forged(**fields: Any) -> Envelope:
    """A request as a caller could hand one in: built without validation."""
    good = Envelope.request("alice", "bob", "x", trace_id="t")
    return Request.model_construct(**{**good.__dict__, **fields})


@pytest.mark.parametrize(
    "forged",
    [
        {},
        {"id": "i" * 64},
        {"id": "i" * 65},
        {"id": ""},
        {"id": 5},
        {"id": _Sub("i")},
        {"trace_id": 5},
        {"trace_id": _Sub("t")},
        {"sender": "a/b"},
        {"sender": _Sub("alice")},
        {"recipient": _Who.ALICE},
        {"recipient": "*"},
        {"recipient": "x" * 65},
    ],
)
@pytest.mark.parametrize(("body", "type_name"), [("x", "result"), (_Body(), "r"), ("x", "r" * 65)])
def test_response_builds_what_build_builds(
    forged: dict[str, Any], body: Any, type_name: str
) -> None:
    request = _forged(**forged)
    fast = _outcome(lambda: Envelope.response(request, body, type=type_name))
    slow = _outcome(
        lambda: _build(
            Response,
            sender=request.recipient,
            recipient=request.sender,
            body=_dump_body(body),
            type=_type_of(body, type_name),
            in_reply_to=request.id,
            trace_id=request.trace_id,
        )
    )
    assert fast == slow


class _NotedRequest(Request):
    """A user's request class with extra fields and a private attribute."""

    model_config = ConfigDict(extra="allow")
    _note: str = PrivateAttr(default="kept")


@pytest.mark.parametrize(
    "make",
    [
        lambda: Envelope.request("alice", "bob", {"k": 1}, timeout=5),
        lambda: Envelope.message("alice", "bob", "hi"),
        lambda: Envelope.broadcast("alice", "all"),
        lambda: _NotedRequest(sender="alice", recipient="bob", priority=3),
    ],
)
def test_with_deadline_makes_what_model_copy_makes(make: Callable[[], Envelope]) -> None:
    envelope = make()
    copied = envelope.with_deadline(1234.5)
    expected = envelope.model_copy(update={"deadline": 1234.5})
    assert _outcome(lambda: copied) == _outcome(lambda: expected)
    assert copied.model_dump_json() == expected.model_dump_json()
    assert envelope.deadline != 1234.5  # the original is untouched


# --- many tasks on one inbox, cancelled at every await -----------------------------------------


def _file_mail(tmp_path: Path, **options: Any) -> FileMailboxes:
    return FileMailboxes(tmp_path / "team", members=MEMBERS, **options)


async def test_receivers_drains_and_requests_cancelled_at_random_lose_and_repeat_nothing(
    mail_factory: Callable[[], Mailboxes],
) -> None:
    """Receivers, drains and requests share the lead's inbox; each is cancelled at a random
    point, often; the worker answers every request and sends mail. Every message is handled
    once, every request that was not cancelled gets its own answer, nobody hangs."""
    rng = random.Random(7)
    messages, asks = 120, 60
    async with mail_factory() as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        seen: Counter[int] = Counter()
        answered: list[int] = []
        all_seen = anyio.Event()

        async def worker_loop() -> None:
            sent = 0
            while True:
                if sent < messages:
                    await mail.send(Envelope.message("worker", "lead", sent))
                    sent += 1
                for record in worker.drain_nowait():
                    await mail.send(Envelope.response(record.to_envelope(), record.body))
                    await worker.ack(record)
                await anyio.sleep(0 if rng.random() < 0.7 else 0.001)

        async def consumer(style: int) -> None:
            while True:
                with anyio.move_on_after(rng.choice([0, 0.0005, 0.002, 0.01])):
                    got: list[Envelope]
                    if style == 0:
                        got = [await lead.receive()]
                    elif style == 1:
                        got = [r.to_envelope() for r in await lead.drain(max=5)]
                    else:
                        try:
                            got = await lead.receive_batch(3, timeout=0.003)
                        except ReceiveTimeout:
                            continue
                    for envelope in got:
                        seen[envelope.body] += 1
                    if sum(1 for body in seen if body < messages) == messages:
                        all_seen.set()
                    await lead.ack(*got)

        async def asker(k: int) -> None:
            for i in range(k, asks, 4):
                request = Envelope.request("lead", "worker", 10_000 + i)
                with anyio.move_on_after(rng.choice([0.0002, 0.003, 5.0])) as scope:
                    response = await mail.request(request, timeout=10)
                if not scope.cancelled_caught:
                    assert response.body == 10_000 + i
                    assert response.in_reply_to == request.id
                    answered.append(i)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker_loop)
                for style in (0, 0, 1, 2):
                    tg.start_soon(consumer, style)
                async with anyio.create_task_group() as askers:
                    for k in range(4):
                        askers.start_soon(asker, k)
                await all_seen.wait()
                tg.cancel_scope.cancel()
        handled = {body: n for body, n in seen.items() if body < messages}
        assert handled == dict.fromkeys(range(messages), 1)  # each message once, none lost
        # answers to cancelled requests are plain envelopes for receive, each once
        late = [body for body, n in seen.items() if body >= 10_000]
        assert all(seen[body] == 1 for body in late)
        assert not set(late) & {10_000 + i for i in answered}
        assert answered  # some requests ran to their answer
        assert not lead.waited_on and lead.statistics().pending_requests == 0


async def test_a_cancelled_waiter_then_a_signal_wakes_the_others(
    mail_factory: Callable[[], Mailboxes],
) -> None:
    async with mail_factory() as mail:
        lead = await mail.open_inbox("lead")
        got: list[object] = []

        async def receiver() -> None:
            got.append((await lead.receive()).body)

        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as doomed:
                tg.start_soon(receiver)  # waits, then is cancelled
                await anyio.sleep(0.01)
            async with anyio.create_task_group() as inner:
                inner.start_soon(receiver)
                await anyio.sleep(0.01)
                inner.cancel_scope.cancel()  # one cancelled waiter
            tg.start_soon(receiver)
            await anyio.sleep(0.01)
            lead.wake()  # a wake-up with nothing: the waiter waits on
            await anyio.sleep(0.01)
            assert got == []
            with anyio.fail_after(5):
                await mail.send(Envelope.message("worker", "lead", "one"))
                while len(got) < 2:  # the first receiver (never cancelled) and the last
                    await mail.send(Envelope.message("worker", "lead", "two"))
                    await anyio.sleep(0.01)
            del doomed
        assert sorted(map(str, got)) == ["one", "two"]


# --- other processes writing -------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


async def test_a_writer_in_another_process_in_a_tight_loop_loses_no_wake_up(
    tmp_path: Path,
) -> None:
    """Another process sends as fast as it can while this one alternates receive, drain and
    receive_nowait with short waits; the safety rescan is off, so only notifications wake it.
    Small segments make it rotate under the reader."""
    count = 400
    async with _file_mail(tmp_path, rescan_interval=3600, segment_bytes=2000) as mail:
        inbox = await mail.open_inbox("worker")
        proc = _spawn("send", str(tmp_path / "team"), str(count))
        got: list[int] = []
        try:
            with anyio.fail_after(30):
                step = 0
                while len(got) < count:
                    step += 1
                    batch: list[Envelope]
                    if step % 3 == 0:
                        batch = [r.to_envelope() for r in await inbox.drain(max=7)]
                    elif step % 3 == 1:
                        batch = [await inbox.receive()]
                    else:
                        try:
                            batch = [inbox.receive_nowait()]
                        except anyio.WouldBlock:
                            batch = []
                    got.extend(int(e.body) for e in batch)
                    if batch:
                        await inbox.ack(*batch)
        finally:
            _finish(proc)
        assert got == list(range(count))


async def test_receive_nowait_polled_without_yielding_sees_another_process_write(
    tmp_path: Path,
) -> None:
    async with _file_mail(tmp_path, rescan_interval=3600) as mail:
        inbox = await mail.open_inbox("worker")
        await mail.send(Envelope.message("lead", "worker", -1))
        assert (await inbox.receive(timeout=5)).body == -1  # a read that caught up
        proc = _spawn("send", str(tmp_path / "team"), "3")
        got: list[int] = []
        give_up = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < give_up:  # no await: no notification runs
            try:
                got.append(inbox.receive_nowait().body)
            except anyio.WouldBlock:
                time.sleep(0.001)
        _finish(proc)
        assert got == [0, 1, 2]


async def test_the_rescan_alone_wakes_a_receiver_when_there_are_no_notifications(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inotify, "available", lambda: False)
    async with _file_mail(tmp_path) as mail:
        assert mail.store.needs_polling
        inbox = await mail.open_inbox("worker")
        await mail.send(Envelope.message("lead", "worker", -1))
        assert (await inbox.receive(timeout=5)).body == -1  # caught up
        proc = _spawn("send", str(tmp_path / "team"), "5")
        got: list[int] = []
        with anyio.fail_after(20):
            while len(got) < 5:
                got.extend(r.body for r in await inbox.drain())
        _finish(proc)
        assert got == [0, 1, 2, 3, 4]


# --- the log changing under a reader that caught up --------------------------------------------


async def _caught_up(tmp_path: Path, mail: Mailboxes) -> Any:
    inbox = await mail.open_inbox("worker")
    await mail.send(Envelope.message("lead", "worker", "first"))
    await anyio.sleep(0.05)  # the send's notification comes and goes
    envelope = await inbox.receive(timeout=5)  # a read that found data and caught up
    await inbox.ack(envelope)
    assert inbox._reading.caught_up and not inbox._unread()
    return inbox


@pytest.mark.parametrize("wake", ["notification", "rescan"])
async def test_an_inbox_file_deleted_after_a_read_that_caught_up_is_reported(
    tmp_path: Path, wake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader found everything there was; then the log is deleted. A receiver that waits
    with a timeout, again and again, must hear of it (StoreCorrupt naming `teamrt repair`),
    not time out forever as if the inbox were merely empty: woken by the file's notification
    (the safety rescan is off), or where there are none by the rescan."""
    if wake == "rescan":
        monkeypatch.setattr(inotify, "available", lambda: False)
    async with _file_mail(tmp_path, rescan_interval=3600) as mail:
        inbox = await _caught_up(tmp_path, mail)
        os.unlink(tmp_path / "team" / "inboxes" / "worker.jsonl")

        async def receive_until_told() -> None:
            for _ in range(20):
                with pytest.raises(ReceiveTimeout):  # nothing else can arrive
                    await inbox.receive(timeout=0.1)

        with anyio.fail_after(10), pytest.raises(StoreCorrupt, match="teamrt repair"):
            await receive_until_told()


async def test_an_inbox_file_truncated_under_a_waiting_receiver_is_reported(
    tmp_path: Path,
) -> None:
    async with _file_mail(tmp_path) as mail:
        inbox = await _caught_up(tmp_path, mail)

        async def truncate_soon() -> None:
            await anyio.sleep(0.02)  # the receiver waits by then
            os.truncate(tmp_path / "team" / "inboxes" / "worker.jsonl", 5)

        async def receive_while_truncated() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(truncate_soon)
                await inbox.receive()

        with anyio.fail_after(10), pytest.raises(ExceptionGroup) as raised:
            await receive_while_truncated()
        assert raised.group_contains(StoreCorrupt, match="truncated")


async def test_nan_and_infinite_receive_timeouts(tmp_path: Path) -> None:
    async with _file_mail(tmp_path) as mail:
        inbox = await mail.open_inbox("worker")
        with anyio.fail_after(5):
            with pytest.raises(ReceiveTimeout):
                await inbox.receive(timeout=-math.inf)
            with anyio.move_on_after(0.05) as scope:
                await inbox.receive(timeout=math.inf)
            assert scope.cancelled_caught
            await mail.send(Envelope.message("lead", "worker", "x"))
            assert (await inbox.receive(timeout=math.inf)).body == "x"


# --- framing and writing fast paths ------------------------------------------------------------


@pytest.mark.parametrize(
    "chunks",
    [
        [b"x" * 8 + b"\n"],  # exactly max_line bytes: not too long
        [b"x" * 9 + b"\n"],  # one more: too long, reported once
        [b"\n"],
        [b" \t\r\n"],
        [b"\x0b\n"],
        [b"ab\r\n"],
        [b"ab", b"c\n"],  # a held tail, then the rest of its line
        [b"x" * 12, b"yy\n", b"ok\n"],  # an over-long tail, then its end, then a line
        [b"a\n", b"b\n", b"\n", b"c\n"],
        [b"", b"a\n"],
    ],
)
def test_one_line_fed_alone_frames_as_the_general_loop_does(chunks: list[bytes]) -> None:
    """Fed chunk by chunk (the fast path takes each whole line) or as one buffer (the general
    loop): the same entries, the same offsets."""
    split, whole = LineSplitter(max_line=8, segment=3), LineSplitter(max_line=8, segment=3)
    got = [entry for chunk in chunks for entry in split.feed(chunk)]
    assert got == whole.feed(b"".join(chunks))
    assert (split.offset, split.position, split.pending) == (
        whole.offset,
        whole.position,
        whole.pending,
    )


def test_write_all_finishes_a_short_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fd = os.open(tmp_path / "log", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    real_write = os.write

    def short_write(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))  # three bytes at a time

    try:
        monkeypatch.setattr(os, "write", short_write)
        fileio.write_all(fd, b"0123456789\n", 0, "test")
        fileio.write_all(fd, b"", 11, "test")
        monkeypatch.undo()
    finally:
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"0123456789\n"


# --- release, and a second writer in this process ----------------------------------------------


async def test_a_release_wakes_a_receiver_that_caught_up(tmp_path: Path) -> None:
    async with _file_mail(tmp_path, rescan_interval=3600) as mail:
        inbox = await _caught_up(tmp_path, mail)
        await mail.send(Envelope.message("lead", "worker", "second"))
        held = await inbox.receive(timeout=5)
        got: list[object] = []

        async def receiver() -> None:
            got.append((await inbox.receive()).body)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver)
                await anyio.sleep(0.01)
                inbox.release(held)
        assert got == ["second"]


async def test_a_second_mailboxes_on_one_memory_store_wakes_the_receiver_by_the_rescan() -> None:
    """Another `Mailboxes` on the same store writes without this one's `_wake`: like another
    process with no notifications, only the rescan can wake the receiver."""
    store = MemoryStore("team")
    async with (
        Mailboxes(store, members=MEMBERS, rescan_interval=0.05) as mail,
        Mailboxes(store) as other,
    ):
        inbox = await mail.open_inbox("worker")
        await mail.send(Envelope.message("lead", "worker", "first"))
        await inbox.ack(await inbox.receive(timeout=5))
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(other.send, Envelope.message("lead", "worker", "second"))
                assert (await inbox.receive()).body == "second"


# --- the child ---------------------------------------------------------------------------------


async def _send(team: str, count: str) -> None:
    """Send `count` messages to the worker as fast as possible."""
    async with FileMailboxes(team) as mail:
        for i in range(int(count)):
            await mail.send(Envelope.message("lead", "worker", i))


if __name__ == "__main__":
    signal.alarm(60)
    mode, team, count = sys.argv[1:]
    assert mode == "send"
    anyio.run(_send, team, count)

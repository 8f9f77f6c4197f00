"""The round trip's inlined fast paths: `decode_fields`' inlined checks for short lines, the
file reader's first read handled in `read_nowait`, the inbox taking a lone record without its
queue, the appender's inlined `stamp`, `Mailboxes.send` with its lookups inlined, and the
envelopes' one-int ids and `with_deadline` through `_adopt`.

Each test reaches the changed code the way a user does (`Mailboxes` on the file store and on
Redis, a second process, a fork, telemetry on, a team key, payload models, a task's trace,
broadcasts, requests with deadlines, error answers, subclassed envelopes) and compares it with
the reference it claims to equal (`decode_line`, `stamp`, `model_copy`, the old id format).
Nothing is timed: waits are bounded by `anyio.fail_after` only so that a hang fails.

Bugs this pass found, each fixed after its test: an envelope subclass whose own field held NaN
or Infinity, with a text body, was written to the log with a bare `NaN` (not JSON), where the
same envelope with a dict body was refused; `with_deadline` on a subclass that allows extras but
had none gave a copy whose `model_extra` was None (model_copy keeps `{}`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, ConfigDict, PrivateAttr

from teamrt import Envelope, FileMailboxes
from teamrt.codec import _SHALLOW_BELOW, EnvelopeFields, decode_fields, encode
from teamrt.envelopes import (
    Broadcast,
    Message,
    Request,
    Response,
    _id_at,
    _id_of,
    new_id,
    register_payload,
    tracing,
)
from teamrt.errors import InvalidEnvelope, RemoteError, StoreCorrupt
from teamrt.mail.filestore.paths import FIRST_READ
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.inbox import Inbox
from teamrt.mail.log import decode_line, stamp
from teamrt.mail.mailboxes import Mailboxes
from tests.conftest import spans_in_memory as _telemetry
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture

MEMBERS = ["lead", "worker", "other"]
KEY = "a team key of thirty-two bytes!!"


# --- helpers -------------------------------------------------------------------------------------


def _file_mail(tmp_path: Path, *, store: dict[str, Any] | None = None, **options: Any) -> Mailboxes:
    """Mailboxes on a file store in `tmp_path/team` (`store`: the FileStore's options)."""
    return Mailboxes(FileStore(tmp_path / "team", **(store or {})), members=MEMBERS, **options)


@pytest.fixture(params=["file", "redis"])
def make_mail(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Mailboxes]:
    """A maker of `Mailboxes` on one team's storage, on the file store or on Redis."""
    if request.param == "file":
        return lambda **options: _file_mail(tmp_path, **options)
    from teamrt.mail.redisstore import RedisStore

    server: RedisServer = request.getfixturevalue("shared_redis")
    url = server.url()  # a team of its own
    return lambda **options: Mailboxes(RedisStore(url), members=MEMBERS, **options)


def _log_lines(store: FileStore, name: str) -> list[bytes]:
    paths = store.inbox_paths(name)
    data = b"".join(path.read_bytes() for path in paths.segments())
    assert data.endswith(b"\n") or not data
    return data.splitlines()


def _line(**fields: Any) -> bytes:
    """A stamped line as teamrt writes one (compact, UTF-8), with `fields` changed."""
    values: dict[str, Any] = {
        "seq": 3,
        "team": "team",
        "v": 1,
        "id": "0123456789abcdef0123456789abcd",
        "kind": "message",
        "type": "text",
        "sender": "lead",
        "recipient": "worker",
        "in_reply_to": None,
        "trace_id": None,
        "traceparent": None,
        "ts": 1_700_000_000.25,
        "deadline": None,
        "body": "hi",
    }
    values.update(fields)
    return json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )


def _assert_decodes_alike(line: bytes) -> None:
    """`decode_fields` accepts what `decode_line` accepts, as the same envelope (compared by its
    encoding, so that a NaN equals itself), and refuses the rest with the same reason."""
    fields, envelope = decode_fields(line), decode_line(line)
    if isinstance(envelope, str):
        assert fields == envelope, line
        return
    assert type(fields) is EnvelopeFields, (line, fields)
    built = fields.to_envelope()
    assert type(built) is type(envelope), line
    assert built.model_fields_set == envelope.model_fields_set, line
    assert built.__dict__.keys() == envelope.__dict__.keys()
    for made in ("id", "ts"):  # a line without one: each decode makes its own
        if made not in envelope.model_fields_set:
            built = built.model_copy(update={made: getattr(envelope, made)})
    assert repr(built) == repr(envelope), line


class _Task(BaseModel):
    n: int
    label: str = ""


TASK = "hostile-rtt3-task"
register_payload(TASK, _Task)


# --- decode_fields: the inlined checks of a short line -------------------------------------------

_VALUES: list[Any] = [
    None, 0, 1, -1, 1.0, 2**53, 2**53 + 1, -(2**53) - 1, 2**63, 2**64, 2**65, 10**30,
    1e308, 1.5, -0.0, 5e-324, 2.0**53, 2.0**53 + 2, 2.0**63, "x", "5", "", "é", "\U0001f600",
    "\ud800", [], {}, [1, [2, [3]]], {"k": None}, True, False,
]  # fmt: skip
_FIELDS = ("seq", "team", "v", "id", "kind", "type", "sender", "recipient", "in_reply_to",
           "trace_id", "traceparent", "ts", "deadline", "body")  # fmt: skip
_NAMES = ["lead", "a", "A" * 64, "A" * 65, "-a", "_a", "a-", "a_b", "a.b", "a/b", "a\n", "a b",
          "é", "*", "", "a\x00", "\uff4cead", "0"]  # fmt: skip


def _hostile_lines() -> list[bytes]:
    lines = [_line(**{field: value}) for field in _FIELDS for value in _VALUES]
    for kind in ("message", "request", "response", "broadcast", "other"):
        for recipient in ("*", "worker", "a b", "", "x" * 64, "x" * 65):
            for in_reply_to in (None, "", "r", "r" * 64, "r" * 65, 5):
                lines.append(_line(kind=kind, recipient=recipient, in_reply_to=in_reply_to))
    for name in _NAMES:
        lines += [_line(sender=name), _line(recipient=name), _line(team=name)]
    for deadline in (2**53, 2**53 + 1, 2.0**53 * 4, -(2**53), 1e16, 1e300):
        lines += [_line(kind="request", deadline=deadline), _line(ts=deadline)]
    for body in ({"n": 1}, {"n": "one"}, {"n": 1, "label": "é" * 3}, [1], None, {"n": 2**64}):
        lines.append(_line(type=TASK, body=body))
    base = _line()
    raw_bodies = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b'"\\ud800"',
                  b'"\\ud83d\\ude00"', b'"\xff"', b"[NaN]", b'{"a":Infinity}',
                  b"18446744073709551616", b"1" * 40, b"0.1e1", b"01"]  # fmt: skip
    for raw in raw_bodies:
        lines.append(base.replace(b'"body":"hi"', b'"body":' + raw))
    for raw in (b"NaN", b"Infinity", b"1e400", b"9007199254740993", b"9007199254740993.0"):
        lines.append(base.replace(b'"ts":1700000000.25', b'"ts":' + raw))
    lines += [
        base.replace(b'"seq":3', b'"seq":3,"seq":4'),  # a repeated key: the last wins
        base.replace(b'"body":"hi"', b'"body":"hi","fields_set":[]'),  # the record's own name
        base.replace(b'"body":"hi"', b'"body":"hi","extra":NaN'),
        base.replace(b'"traceparent":null,', b""),  # a line from before traceparent
        base.replace(b'"id":"0123456789abcdef0123456789abcd",', b""),
        base + b" ",
        b" " + base,
        base[:-1],
        base.replace(b'"kind":"message"', b'"kind":"messag\\u0065"'),
    ]
    return lines


def _padded(target: int, body: Any) -> bytes | None:
    """A line of exactly `target` bytes holding `body`, padded through its type (None if the
    body alone is too long for it)."""
    bare = _line(body=body, type="t")
    pad = target - len(bare)
    if pad < 0 or pad > 63:
        bare = _line(body=body, type="t", trace_id="")
        pad = target - len(bare)
        if pad < 0:
            return None
        line = _line(body=body, type="t", trace_id="p" * pad)
    else:
        line = _line(body=body, type="t" + "y" * pad)
    assert len(line) == target
    return line


def _deep(depth: int) -> bytes:
    return _line(body=None).replace(b'"body":null', b'"body":' + b"[" * depth + b"]" * depth)


def test_short_lines_are_accepted_and_refused_as_decode_line_does() -> None:
    lines = _hostile_lines()
    assert any(len(line) < _SHALLOW_BELOW for line in lines)
    for line in lines:
        _assert_decodes_alike(line)


@pytest.mark.parametrize("target", range(_SHALLOW_BELOW - 6, _SHALLOW_BELOW + 6))
def test_lines_either_side_of_the_shallow_bound(target: int) -> None:
    """The inlined checks stop at `_SHALLOW_BELOW` bytes; lines one byte either side, with flat,
    nested, unicode, big-int and non-finite bodies, and with a bad name, decode alike."""
    bodies: list[Any] = ["x", "é\U0001f600", [[[[1]]]], {"a": [1, 2.5, None]}, [2**64], [1e308]]
    for body in bodies:
        line = _padded(target, body)
        assert line is not None
        _assert_decodes_alike(line)
        _assert_decodes_alike(line.replace(b'"sender":"lead"', b'"sender":"le/d"'))
        _assert_decodes_alike(line.replace(b'"ts":1700000000.25', b'"ts":9007199254740993'))
    for depth in range(195, 205):  # pydantic reads 201 levels: nesting near it, in short lines
        _assert_decodes_alike(_deep(depth))


def test_random_mutations_of_a_short_line_decode_alike() -> None:
    """Bytes of real short lines changed at random: whatever still parses is judged alike."""
    rng = random.Random(3)
    seeds = [
        _line(),
        _line(kind="response", in_reply_to="abc", type="error", body={"error": "E"}),
        _line(kind="broadcast", recipient="*", body={"k": [1, 2.5]}),
        _line(kind="request", deadline=1_700_000_030.5, type=TASK, body={"n": 4}),
    ]
    alphabet = b'{}[]":,0123456789.eE-+nulltrue*/\\ abc\xc3\xa9'
    for _ in range(3000):
        line = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(line))
            line[at : at + rng.randint(0, 2)] = bytes(
                [rng.choice(alphabet) for _ in range(rng.randint(0, 2))]
            )
        _assert_decodes_alike(bytes(line))


# --- ids -----------------------------------------------------------------------------------------


def test_ids_keep_the_documented_layout() -> None:
    """30 lowercase hex digits: 14 of microseconds, 10 of the process's tag, 6 of a counter."""
    now = time.time()
    made = [_id_at(now) for _ in range(3)] + [new_id(), _id_of(12345)]
    for identifier in made:
        assert len(identifier) == 30 and identifier == identifier.lower()
        int(identifier, 16)
    assert made[0][:14] == format(int(now * 1_000_000), "014x")
    assert made[-1][:14] == format(12345, "014x")
    assert len({identifier[14:24] for identifier in made}) == 1  # one tag in one process
    counters = [int(identifier[24:], 16) for identifier in made]
    assert counters == sorted(counters) and len(set(counters)) == len(counters)
    assert sorted(made[:3]) == made[:3]  # same microsecond: the counter orders them


def test_the_counter_wraps_within_its_six_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    import itertools

    from teamrt import envelopes

    monkeypatch.setattr(envelopes, "_counter", itertools.count(0xFFFFFE))
    tag = _id_of(7)[14:24]
    wrapped = [_id_of(7) for _ in range(3)]
    assert [identifier[24:] for identifier in wrapped] == ["ffffff", "000000", "000001"]
    assert {identifier[14:24] for identifier in wrapped} == {tag}
    assert {identifier[:14] for identifier in wrapped} == {format(7, "014x")}


def test_ids_from_a_fork_and_another_process_at_one_microsecond_differ(tmp_path: Path) -> None:
    """A forked child makes its own tag (`register_at_fork`); a second process has its own: ids
    made at the very same microsecond, by the same counter values, never collide."""
    now = 1_800_000_000.123456
    ours = [_id_at(now) for _ in range(4)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, " ".join(_id_at(now) for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        forked = pipe.read().decode().split()
    os.waitpid(pid, 0)
    code = (
        f"from teamrt.envelopes import _id_at\nprint(' '.join(_id_at({now!r}) for _ in range(4)))\n"
    )
    other = (
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .split()
    )
    assert len(forked) == len(other) == 4
    everyone = ours + forked + other
    assert len(set(everyone)) == 12
    assert {identifier[:14] for identifier in everyone} == {format(int(now * 1e6), "014x")}
    assert len({identifier[14:24] for identifier in everyone}) == 3
    assert [identifier[24:] for identifier in forked] == ["000000", "000001", "000002", "000003"]


# --- with_deadline through _adopt ----------------------------------------------------------------


class _Loose(Request):
    model_config = ConfigDict(extra="allow")


class _Tagged(Request):
    tag: str = "t"


class _Private(Request):
    _note: int = PrivateAttr(default=3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Envelope.request("lead", "worker", {"a": 1}),
        lambda: Envelope.request("lead", "worker", "x", timeout=5),
        lambda: Envelope.request("lead", "worker", "x", trace_id="t"),
        lambda: _Loose(sender="lead", recipient="worker"),
        lambda: _Loose(sender="lead", recipient="worker", extra_field=[1]),
        lambda: _Tagged(sender="lead", recipient="worker", tag="mine"),
        lambda: _Private(sender="lead", recipient="worker"),
        lambda: Envelope.message("lead", "worker", "m"),
    ],
)
def test_with_deadline_is_model_copy_and_shares_nothing(make: Callable[[], Envelope]) -> None:
    """Found by this pass: on a subclass that allows extras but was given none, the copy's
    `model_extra` was None (as for a model that allows none), where model_copy keeps `{}`."""
    original = make()
    fields_before = set(original.model_fields_set)
    deadline_before = original.deadline
    for deadline in (None, 1.5, 2.0**53 + 2, 1e300):
        copied = original.with_deadline(deadline)
        reference = original.model_copy(update={"deadline": deadline})
        assert type(copied) is type(reference)
        assert copied == reference
        assert copied.model_fields_set == reference.model_fields_set
        assert list(copied.__dict__) == list(reference.__dict__)  # the encoder's field order
        assert encode(copied) == encode(reference)
        assert copied.__pydantic_extra__ == reference.__pydantic_extra__
        assert copied.model_extra == reference.model_extra
        assert copied.__pydantic_private__ == reference.__pydantic_private__
        # the copy has its own fields and fields set: nothing done to it reaches the original
        assert copied.__dict__ is not original.__dict__
        assert copied.__pydantic_fields_set__ is not original.__pydantic_fields_set__
        again = copied.model_copy(update={"trace_id": "later"})
        assert again.trace_id == "later" and "trace_id" in again.model_fields_set
        assert original.model_fields_set == fields_before
    assert original.deadline == deadline_before


async def test_subclassed_requests_get_their_deadline_and_their_answer(
    make_mail: Callable[..., Mailboxes],
) -> None:
    """`request(timeout=...)` stamps the deadline through `with_deadline` on a user's subclass
    (extras allowed, with and without any; a field of its own; a private attribute): the
    request sent keeps its class's fields, the worker reads the envelope's own fields, and the
    answer comes back."""
    made: list[Request] = [
        _Loose(sender="lead", recipient="worker", body={"n": 1}, type=TASK),
        _Loose(sender="lead", recipient="worker", body={"n": 2}, type=TASK, note="é"),
        _Tagged(sender="lead", recipient="worker", body={"n": 3}, type=TASK, tag="mine"),
        _Private(sender="lead", recipient="worker", body={"n": 4}, type=TASK),
    ]
    async with make_mail() as mail:
        worker = await mail.open_inbox("worker")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                seen: list[Envelope] = []

                async def serve() -> None:
                    seen.extend(await _serve(mail, worker, len(made)))

                tg.start_soon(serve)
                for request in made:
                    answer = await mail.request(request, timeout=25)
                    assert answer.in_reply_to == request.id and answer.body == request.body
                    assert request.deadline is None  # the caller's envelope is not changed
        assert worker.statistics().quarantined == 0
    assert [envelope.id for envelope in seen] == [request.id for request in made]
    for request, received in zip(made, seen, strict=True):
        assert type(received) is Request and received.deadline == request.ts + 25


# --- encoding: NaN and Infinity anywhere in an envelope ------------------------------------------


class _Scored(Message):
    score: float = 0.0


class _LooseMessage(Message):
    model_config = ConfigDict(extra="allow")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("body", ["text", 7, None, True, {"a": 1}, [1]])
def test_a_subclass_field_holding_nan_is_refused_whatever_the_body(bad: float, body: Any) -> None:
    """Found by this pass: with a text body, a subclass's own float field holding NaN or
    Infinity went to the log as a bare `NaN` (a line no JSON reader takes); with a dict body
    the same envelope was refused."""
    for envelope in (
        _Scored(sender="lead", recipient="worker", body=body, score=bad),
        _LooseMessage(sender="lead", recipient="worker", body=body, extra=bad),
        _LooseMessage(sender="lead", recipient="worker", body=body, extra={"deep": [bad]}),
    ):
        with pytest.raises(InvalidEnvelope):
            encode(envelope, finite=True)


async def test_a_subclass_field_holding_nan_is_never_written(tmp_path: Path) -> None:
    async with _file_mail(tmp_path) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        with pytest.raises(InvalidEnvelope):
            await mail.send(_Scored(sender="lead", recipient="worker", body="x", score=math.nan))
        scored = _Scored(sender="lead", recipient="worker", body="x", score=2.5)
        await mail.send(scored)  # a finite one is sent, its own field with it
        lines = _log_lines(store, "worker")
        assert len(lines) == 1 and lines[0].endswith(b',"body":"x","score":2.5}')
        for line in lines:
            json.loads(line)  # every line in the log is JSON
        received = await mail.inbox("worker").receive(timeout=5)
        assert received.id == scored.id and received.body == "x"


# --- the appender's inlined stamp ----------------------------------------------------------------


async def test_a_single_send_writes_exactly_what_stamp_makes(tmp_path: Path) -> None:
    bodies: list[Any] = ["", "é\U0001f600\n\t\"\\", {"n": 2**63 - 1}, [2**64], 1e308, -0.0,
                         "x" * (FIRST_READ + 10)]  # fmt: skip
    async with _file_mail(tmp_path, key=KEY) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        sent = [Envelope.message("lead", "worker", body) for body in bodies]
        for envelope in sent:
            await mail.send(envelope)
        lines = _log_lines(store, "worker")
        assert [line + b"\n" for line in lines] == [
            stamp(mail._encode(envelope), seq, b"team") for seq, envelope in enumerate(sent)
        ]
        inbox = mail.inbox("worker")
        got = [await inbox.receive(timeout=5) for _ in sent]
        assert [envelope.id for envelope in got] == [envelope.id for envelope in sent]
        assert [repr(envelope.body) for envelope in got] == [repr(body) for body in bodies]


# --- Mailboxes: the round trip in every context --------------------------------------------------


async def _serve(mail: Mailboxes, worker: Inbox, count: int) -> list[Envelope]:
    """As the worker: answer `count` requests (an error where the body asks for one)."""
    seen: list[Envelope] = []
    while len(seen) < count:
        envelope = await worker.receive()
        seen.append(envelope)
        if isinstance(envelope, Request):
            body = envelope.body
            if isinstance(body, dict) and body.get("label") == "fail":
                await mail.send(Envelope.error(envelope, ValueError(f"no {body['n']}")))
            else:
                await mail.send(Envelope.response(envelope, body, type=envelope.type))
        await worker.ack(envelope)
    return seen


@pytest.mark.parametrize("context", ["plain", "telemetry", "signed", "traced", "all"])
async def test_requests_answers_errors_and_broadcasts_in_every_context(
    make_mail: Callable[..., Mailboxes], context: str
) -> None:
    key = KEY if context in ("signed", "all") else None
    with contextlib.ExitStack() as stack:
        exporter = stack.enter_context(_telemetry()) if context in ("telemetry", "all") else None
        if context in ("traced", "all"):
            stack.enter_context(tracing("task-trace-7"))
        async with make_mail(key=key) as mail:
            worker = await mail.open_inbox("worker")
            lead = await mail.open_inbox("lead")
            other = await mail.open_inbox("other")
            sent: list[Envelope] = []
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_serve, mail, worker, 5)
                    for n, label in enumerate(["", "é\U0001f600", "fail"]):
                        request = Envelope.request("lead", "worker", {"n": n, "label": label},
                                                   type=TASK)  # fmt: skip
                        sent.append(request)
                        if label == "fail":
                            with pytest.raises(RemoteError) as caught:
                                await mail.request(request, timeout=20)
                            assert caught.value.response.in_reply_to is not None
                            assert "no 2" in str(caught.value)
                            continue
                        # a timeout given here: the deadline is stamped through with_deadline
                        answer = await mail.request(request, timeout=20 + n)
                        assert isinstance(answer, Response)
                        assert answer.in_reply_to == request.id and answer.body == request.body
                    deadlined = Envelope.request("lead", "worker", {"n": 9}, type=TASK,
                                                 timeout=3600)  # fmt: skip
                    sent.append(deadlined)
                    answer = await mail.request(deadlined)
                    assert answer.body == {"n": 9}
                    broadcast = Envelope.broadcast("lead", {"all": [1.5, None]})
                    sent.append(broadcast)
                    await mail.send(broadcast)
                    got = await other.receive()
                    assert isinstance(got, Broadcast) and got.id == broadcast.id
                with pytest.raises(anyio.WouldBlock):
                    lead.receive_nowait()  # answers went to their requests, not to receive
    if context in ("traced", "all"):
        assert got.trace_id == "task-trace-7"
    if exporter is not None:
        spans = [span for span in exporter.get_finished_spans() if span.name.startswith("send ")]
        # a span per send: four requests, their four answers (one an error), one broadcast
        assert sorted(span.name for span in spans) == sorted(
            [f"send {TASK}"] * 7 + ["send error", "send text"]
        )
        assert got.traceparent is not None and got.traceparent.startswith("00-")
    else:
        assert got.traceparent is None


# --- the reader's first read and the inbox's lone record -----------------------------------------


def _raw(envelope: Envelope) -> bytes:
    return encode(envelope, finite=True)


@pytest.mark.parametrize("where", ["file", "file-rotating", "redis"])
async def test_mixed_reads_of_mixed_records_lose_and_repeat_nothing(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """Records one at a time and in bursts, small and longer than the first read, bad lines
    and repeated ids among them (a small segment size: rotations land in the middle of
    reads), taken by receive_nowait, drain_nowait and receive_batch_nowait in turn: every good
    envelope arrives once, in order; each bad line is quarantined with decode_line's reason;
    each repeat is counted as a duplicate."""
    if where == "redis":
        from teamrt.mail.redisstore import RedisStore

        server: RedisServer = request.getfixturevalue("shared_redis")
        mail = Mailboxes(RedisStore(server.url()), members=MEMBERS)
    else:
        segment = 40_000 if where == "file-rotating" else None
        mail = _file_mail(tmp_path, store={"segment_bytes": segment})
    rng = random.Random(11)
    async with mail:
        worker = await mail.open_inbox("worker")
        expected: list[str] = []
        bad_reasons: list[str] = []
        repeats = 0
        got: list[str] = []

        def take_some() -> None:
            how = rng.choice(["one", "drain", "batch"])
            try:
                if how == "one":
                    got.append(worker.receive_nowait().id)
                elif how == "drain":
                    got.extend(fields.id for fields in worker.drain_nowait(rng.randint(1, 40)))
                else:
                    got.extend(e.id for e in worker.receive_batch_nowait(rng.randint(1, 40)))
            except anyio.WouldBlock:
                pass

        for _ in range(120):
            kind = rng.random()
            if kind < 0.5:  # one record: the usual wake-up
                size = rng.choice([1, 50, FIRST_READ - 400, FIRST_READ + 10])
                envelope = Envelope.message("lead", "worker", "é" * (size // 2) + str(size))
                await mail.send(envelope)
                expected.append(envelope.id)
            elif kind < 0.75:  # a burst: many records in one read
                burst = [
                    Envelope.message("lead", "worker", {"i": i, "pad": "x" * rng.randint(0, 900)})
                    for i in range(rng.randint(2, 60))
                ]
                await mail.send_many(burst)
                expected += [envelope.id for envelope in burst]
            elif kind < 0.85:  # a bad line among them
                broken = rng.choice(
                    [
                        b'"v":1,"id":"x","kind":"message"',
                        _raw(Envelope.message("lead", "worker", 1)).replace(b'"lead"', b'"le/d"'),
                        _raw(Envelope.message("lead", "worker", {"n": "x"}, type=TASK)),
                    ]
                )
                seq = await mail.store.append("worker", broken)
                reason = decode_line(stamp(broken, seq, b"team")[:-1])
                assert isinstance(reason, str)
                bad_reasons.append(reason)
            else:  # the same envelope twice
                envelope = Envelope.message("lead", "worker", "twice")
                await mail.store.append("worker", _raw(envelope))
                await mail.store.append("worker", _raw(envelope))
                expected.append(envelope.id)
                repeats += 1
            for _ in range(rng.randint(0, 2)):
                take_some()
        with anyio.fail_after(20):
            while len(got) < len(expected):
                got.extend(fields.id for fields in await worker.drain(256, timeout=10))
        assert got == expected
        with pytest.raises(anyio.WouldBlock):
            worker.receive_nowait()
        statistics = worker.statistics()
        assert statistics.quarantined == len(bad_reasons)
        assert statistics.duplicates_dropped == repeats
        await worker.flush()
    if where != "redis":
        store = FileStore(tmp_path / "team")
        quarantined = store.inbox_paths("worker").quarantine.read_text().splitlines()
        assert [json.loads(line)["reason"] for line in quarantined] == bad_reasons


@pytest.mark.parametrize("how", ["renamed over", "rewritten in place"])
async def test_a_log_replaced_between_two_reads(tmp_path: Path, how: str) -> None:
    """The reader caught up; the log is then replaced by a longer copy of itself, either as a
    new file renamed over it or rewritten in place (the same inode: truncated, then written
    past the read position). The first is reported (`StoreCorrupt`); in the second the
    records past the position are the ones already handled, and none is delivered twice."""
    async with _file_mail(tmp_path) as mail:
        worker = await mail.open_inbox("worker")
        sent = [Envelope.message("lead", "worker", f"m{i}") for i in range(3)]
        for envelope in sent:
            await mail.send(envelope)
        with anyio.fail_after(20):
            assert [(await worker.receive()).id for _ in sent] == [e.id for e in sent]
        assert worker._reading.caught_up
        log_path = mail.store.inbox_paths("worker").log  # type: ignore[attr-defined]
        data = log_path.read_bytes()
        if how == "renamed over":
            copy = log_path.with_name("copy.tmp")
            copy.write_bytes(data + data)
            os.replace(copy, log_path)
        else:
            fd = os.open(log_path, os.O_WRONLY)  # the same inode, written again from 0
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, data + data, 0)
            finally:
                os.close(fd)
        worker.wake()
        if how == "renamed over":
            with pytest.raises(StoreCorrupt, match="deleted or replaced"):
                await worker.receive(timeout=5)
            return
        with pytest.raises(anyio.WouldBlock):
            worker.receive_nowait()
        assert worker.statistics().duplicates_dropped == len(sent)
        assert worker.statistics().quarantined == 0


# --- values at the edges, through the stores ------------------------------------------------------


async def test_times_beyond_2_53_big_ints_and_unicode_cross_the_store_unchanged(
    make_mail: Callable[..., Mailboxes],
) -> None:
    """What the short decode hands to the slower paths (times beyond 2**53, ints beyond 64
    bits, deep nesting) and what it keeps (unicode, -0.0, tiny floats) arrive as sent."""
    sent: list[Envelope] = [
        Envelope.message("lead", "worker", "x").model_copy(update={"ts": 2.0**53 + 2}),
        Envelope.message("lead", "worker", [1, 2]).model_copy(update={"ts": 1e300}),
        Envelope.request("lead", "worker", "r", timeout=1e16),  # deadline beyond 2**53
        Envelope.request("lead", "worker", "r").with_deadline(-(2.0**60)),
        Envelope.message("lead", "worker", {"big": 2**64, "bigger": -(10**30), "f": 5e-324}),
        Envelope.message("lead", "worker", [2**63, -(2**63) - 1, -0.0, 1e308]),
        Envelope.message("lead", "worker", '\U0001f600\u2028\x00\x7f\\"', type="é" * 64),
        Envelope.message("lead", "worker", {"é\U0001f600": {"\n": [[[[[[[[None]]]]]]]]}}),
        Envelope.message("lead", "worker", [json.loads("[" * 20 + "1" + "]" * 20)] * 30),
    ]
    async with make_mail() as mail:
        worker = await mail.open_inbox("worker")
        for envelope in sent:
            await mail.send(envelope)
        with anyio.fail_after(20):
            got = [await worker.receive() for _ in sent]
        for before, after in zip(sent, got, strict=True):
            assert after.id == before.id and type(after) is type(before)
            assert repr(after.body) == repr(before.body)
            assert (after.ts, after.deadline, after.type) == (
                before.ts,
                before.deadline,
                before.type,
            )
        assert worker.statistics().quarantined == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_non_finite_values_are_refused_before_anything_is_written(
    make_mail: Callable[..., Mailboxes], bad: float
) -> None:
    """With telemetry on (the send's span around the refusal) and off, a NaN or Infinity in
    the body (flat, nested, past the flat items), ts or deadline is refused and nothing reaches
    the inbox; the good envelope after them arrives first."""
    plain = Envelope.message("lead", "worker", "x")
    refused: list[Envelope] = [
        Envelope.message("lead", "worker", bad),
        Envelope.message("lead", "worker", [bad]),
        Envelope.message("lead", "worker", {"a": {"b": [1, bad]}}),
        Envelope.message("lead", "worker", [*range(40), bad]),
        Envelope.message("lead", "worker", {"pad": "x" * 600, "deep": [[bad]]}),
        plain.model_copy(update={"ts": bad}),
        Envelope.request("lead", "worker", "r").with_deadline(bad),
        _Scored(sender="lead", recipient="worker", body="x", score=bad),
    ]
    async with make_mail() as mail:
        worker = await mail.open_inbox("worker")
        for on in (False, True):
            with _telemetry() if on else contextlib.nullcontext() as exporter:
                for envelope in refused:
                    with pytest.raises(InvalidEnvelope):
                        await mail.send(envelope)
                if exporter is not None:  # each refused send still ended its span
                    assert len(exporter.get_finished_spans()) == len(refused)
        good = Envelope.message("lead", "worker", "after")
        await mail.send(good)
        with anyio.fail_after(20):
            assert (await worker.receive()).id == good.id
        with pytest.raises(anyio.WouldBlock):
            worker.receive_nowait()


async def test_watched_requests_get_their_answers_and_errors(
    make_mail: Callable[..., Mailboxes],
) -> None:
    """`request(consume=False)` reads the answer with `decode_line`, beside the inbox's owner:
    an answer, an error (`RemoteError`), an answer from someone not asked (ignored)."""
    async with make_mail() as mail:
        worker = await mail.open_inbox("worker")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_serve, mail, worker, 2)
                asked = Envelope.request("lead", "worker", {"n": 1}, type=TASK)
                answer = await mail.request(asked, timeout=20, consume=False, require_live=False)
                assert answer.in_reply_to == asked.id and answer.body == {"n": 1}
                failing = Envelope.request("lead", "worker", {"n": 5, "label": "fail"}, type=TASK)
                with pytest.raises(RemoteError, match="no 5"):
                    await mail.request(failing, timeout=20, consume=False, require_live=False)


_HOSTILE_NAMES: list[Any] = [*_NAMES, None, 5, b"lead", "lead ", " lead", "lead\n"]


@pytest.mark.parametrize("who", ["sender", "recipient"])
def test_a_response_to_a_request_with_a_hostile_name_builds_what_pydantic_builds(
    who: str,
) -> None:
    """`Envelope.response` checks the names itself (`_plain`) and builds directly: for every
    name it must build the envelope, or raise the error, that validation does."""
    from teamrt.envelopes import _build

    for name in _HOSTILE_NAMES:
        values = {"sender": "lead", "recipient": "worker", who: name}
        request = Request.model_construct(**values, body="q")

        def fast(request: Request = request) -> Envelope:
            return Envelope.response(request, {"ok": True})

        def slow(request: Request = request) -> Envelope:
            return _build(
                Response,
                sender=request.recipient,
                recipient=request.sender,
                body={"ok": True},
                type="result",
                in_reply_to=request.id,
                trace_id=request.trace_id,
            )

        outcomes: list[tuple[str, object]] = []
        for make in (fast, slow):
            try:
                built = make()
            except Exception as exc:  # the same error, both ways
                outcomes.append((type(exc).__name__, str(exc)))
            else:
                outcomes.append(("built", (built.sender, built.recipient, built.in_reply_to)))
        assert outcomes[0] == outcomes[1], name


# --- a second process ----------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def test_signed_requests_with_deadlines_answered_by_another_process(tmp_path: Path) -> None:
    """A worker in another process, on the team key, answers typed requests (one with an
    error); the requester runs inside a task's trace with telemetry on. Every answer comes to
    its own request, errors raise `RemoteError`, the trace and traceparent cross the process,
    and no id made by either process repeats."""
    team = tmp_path / "team"
    count = 6
    async with FileMailboxes(team, members=MEMBERS, key=KEY) as mail:
        await mail.open_inbox("lead")
        proc = _spawn("serve", str(team), str(count))
        try:
            with _telemetry() as exporter, tracing("crossing-trace"), anyio.fail_after(60):
                answers: list[Response] = []
                for n in range(count):
                    label = "fail" if n == 3 else "é" * n
                    timeout = None if n % 2 else 45.0
                    body = {"n": n, "label": label}
                    request = Envelope.request("lead", "worker", body, type=TASK, timeout=timeout)
                    if label == "fail":
                        with pytest.raises(RemoteError, match="no 3"):
                            await mail.request(request, timeout=40, require_live=False)
                        continue
                    answer = await mail.request(request, timeout=40, require_live=False)
                    assert answer.in_reply_to == request.id and answer.body == request.body
                    assert answer.trace_id == "crossing-trace"
                    answers.append(answer)
            out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
            assert proc.returncode == 0, err.decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seen = json.loads(out)
    assert [request["trace_id"] for request in seen] == ["crossing-trace"] * count
    sends = [span for span in exporter.get_finished_spans() if span.name == f"send {TASK}"]
    assert len(sends) == count
    assert [request["traceparent"][3:35] for request in seen] == [
        format(span.context.trace_id, "032x") for span in sends
    ]
    ids = [request["id"] for request in seen] + [answer.id for answer in answers]
    assert len(set(ids)) == len(ids)
    assert len({identifier[14:24] for identifier in ids}) == 2  # one tag per process


async def _serve_in_child(team: str, count: str) -> None:
    """As the worker, in its own process: answer `count` requests, print what they carried."""
    async with FileMailboxes(team, key=KEY) as mail:
        worker = await mail.open_inbox("worker")
        seen = await _serve(mail, worker, int(count))
    print(json.dumps([{"id": r.id, "trace_id": r.trace_id, "traceparent": r.traceparent}
                      for r in seen]))  # fmt: skip


if __name__ == "__main__":
    import signal

    signal.alarm(60)
    mode, team_path, served = sys.argv[1:]
    assert mode == "serve"
    anyio.run(_serve_in_child, team_path, served)

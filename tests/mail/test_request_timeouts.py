"""`request()`'s timeouts: a request waits until its answer or its deadline and never past it,
whatever else waits on the inbox (receivers with their own timeouts, other requests, an answer
sent right at the deadline); an infinite timeout waits like none, a NaN or too large one is a
`UsageError`; an answer that comes after its request timed out is delivered once to
`receive()` as a late response (one from a member that was not asked is dropped), on every store.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.envelopes import Request, Response
from teamrt.errors import ReceiveTimeout, RequestTimeout, UsageError
from teamrt.mail.mailboxes import Mailboxes
from teamrt.testing.conformance import StoreHarness
from tests.mail.helpers import Backing, answer_all, assert_quiet, loop_errors

# --- a request alone ---------------------------------------------------------------------------


async def test_an_infinite_request_timeout_waits_like_none(local_backing: Backing) -> None:
    async with local_backing.open() as mail:
        await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        request = Envelope.request("lead", "worker", "q")
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: answer_all(mail, worker, count=1))
                response = await mail.request(request, timeout=math.inf, require_live=False)
        assert response.in_reply_to == request.id


@pytest.mark.parametrize("timeout", [math.nan, 10**400], ids=["nan", "huge-int"])
async def test_a_nan_or_huge_timeout_is_a_usage_error_not_a_corrupt_timer(
    tmp_path: Path, timeout: float
) -> None:
    """A NaN deadline put on the event loop's timer heap compares false with everything: that
    wait ends at some unrelated timer, and timers pushed after it can be held up behind it (other
    tasks' deadlines fire late). A number too large for a float raised OverflowError."""
    async with FileMailboxes(tmp_path / "team", members=["lead", "worker"]) as mail:
        inbox = await mail.open_inbox("worker")
        await mail.open_inbox("lead")
        asked = Envelope.request("lead", "worker", "x", timeout=30)
        with anyio.fail_after(5):
            for wait in (
                lambda: inbox.receive(timeout=timeout),
                lambda: inbox.drain(timeout=timeout),
                lambda: inbox.receive_batch(timeout=timeout),
                lambda: mail.request(asked, timeout=timeout),
                lambda: mail.request(asked, timeout=timeout, consume=False),
            ):
                with pytest.raises(UsageError, match="timeout"):
                    await wait()
        assert inbox.statistics().pending_requests == 0


async def test_a_request_that_gets_no_answer_times_out_and_its_late_answer_is_drained(
    harness: StoreHarness,
) -> None:
    async with harness.open() as mail:
        lead = await mail.open_inbox("lead")
        await mail.open_inbox("worker")  # alive, but it never answers
        ask = Envelope.request("lead", "worker", "go")
        woken: list[Envelope] = []

        async def receiver() -> None:  # waits on the same inbox through the request's deadline
            woken.append(await lead.receive())

        async with anyio.create_task_group() as tg:
            tg.start_soon(receiver)
            start = time.monotonic()
            with anyio.fail_after(10), pytest.raises(RequestTimeout):
                await mail.request(ask, timeout=0.2)
            assert time.monotonic() - start >= 0.2  # not before its deadline
            assert woken == []  # the deadline's wake-up is nobody else's timeout
            await mail.send(Envelope.message("worker", "lead", "mail"))
        assert [e.body for e in woken] == ["mail"]
        await lead.ack(*woken)
        assert lead.statistics().pending_requests == 0
        await mail.send(Envelope.response(ask, "late"))
        got = await lead.drain(timeout=5)
        assert [(f.kind, f.body) for f in got] == [("response", "late")]
        assert lead.statistics().late_responses == 1


# --- answers at and after the deadline ----------------------------------------------------


async def test_deadlines_racing_answers_never_drop_the_answer(
    mail_factory: Callable[[], Mailboxes],
) -> None:
    """Answers sent right at the request's deadline: either the request gets it, or it times
    out and the answer arrives as a late envelope; never both, never neither."""
    async with mail_factory() as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        outcomes: dict[str, str] = {}
        for i in range(25):
            request = Envelope.request("lead", "worker", i)
            delay = 0.004 + (i % 5) * 0.001

            async def answer_at(request: Request = request, delay: float = delay) -> None:
                await anyio.sleep(delay)
                await mail.send(Envelope.response(request, "late-or-not"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_at)
                try:
                    await mail.request(request, timeout=0.006, require_live=False)
                    outcomes[request.id] = "answered"
                except RequestTimeout:
                    outcomes[request.id] = "timed out"
        await worker.ack(*worker.drain_nowait(max=100))
        late: list[str] = []
        with anyio.move_on_after(0.3):
            while True:
                late.extend(str(r.in_reply_to) for r in await lead.drain())
        assert Counter(late) == Counter(k for k, v in outcomes.items() if v == "timed out")


async def test_a_late_answer_from_someone_not_asked_is_rejected_not_received(
    tmp_path: Path,
) -> None:
    """After a request timed out, its real answer comes to receive() as a late response; one
    from a member that was not asked is flagged and dropped, as while the request waited."""
    async with FileMailboxes(tmp_path / "t", members=["lead", "worker", "other"]) as mail:
        request = Envelope.request("lead", "worker", "q")
        with pytest.raises(RequestTimeout):
            await mail.request(request, timeout=0.05, require_live=False)
        forged = Envelope.response(request, "forged").model_copy(update={"sender": "other"})
        await mail.send(forged)
        await mail.send(Envelope.response(request, "late"))
        lead = mail.inbox("lead")
        late = await lead.receive(5)
        assert (late.sender, late.body) == ("worker", "late")
        with pytest.raises(ReceiveTimeout):
            await lead.receive(0.05)
        stats = lead.statistics()
        assert stats.late_responses == 1 and stats.rejected_responses == 1


# --- with everything else waiting on the inbox -------------------------------------------


async def test_receives_and_requests_with_deadlines_mixed_on_one_inbox(
    backing: Backing,
) -> None:
    """Receivers with short timeouts and requests with their own deadlines wait on the lead's
    inbox at once; the worker answers in random order with random delays, some after their
    request's deadline, and sends mail. Each request gets its own answer or times out not
    before its deadline; every late answer comes to receive once, counted as late; every
    message is received once."""
    rng = random.Random(11)
    asks, messages = 40, 30
    with loop_errors() as errors:
        async with backing.open() as mail:
            lead = await mail.open_inbox("lead")
            worker = await mail.open_inbox("worker")
            outcome: dict[str, str] = {}
            received: Counter[str] = Counter()
            late: list[str] = []
            stop = anyio.Event()

            async def worker_loop() -> None:
                sent = 0
                while not stop.is_set():
                    requests: list[Request] = [
                        r.to_envelope()  # type: ignore[misc]
                        for r in worker.drain_nowait()
                    ]
                    rng.shuffle(requests)
                    for request in requests:
                        if rng.random() < 0.3:
                            await anyio.sleep(rng.choice([0.001, 0.01, 0.03]))
                        await mail.send(Envelope.response(request, request.body))
                    if requests:
                        await worker.ack(*requests)
                    if sent < messages:
                        await mail.send(Envelope.message("worker", "lead", f"m{sent}"))
                        sent += 1
                    await anyio.sleep(0.001)

            async def asker(i: int) -> None:
                timeout = rng.choice([0.005, 0.02, 5.0])
                request = Envelope.request("lead", "worker", f"q{i}")
                started = time.monotonic()
                try:
                    response = await mail.request(request, timeout=timeout, require_live=False)
                except RequestTimeout:
                    assert time.monotonic() >= started + timeout
                    outcome[request.id] = "timed out"
                else:
                    assert response.in_reply_to == request.id and response.body == f"q{i}"
                    outcome[request.id] = "answered"

            async def receiver() -> None:
                while not stop.is_set():
                    timeout = rng.choice([0.0, 0.002, 0.01])
                    started = time.monotonic()
                    try:
                        envelope = await lead.receive(timeout=timeout)
                    except ReceiveTimeout:
                        assert time.monotonic() >= started + timeout
                        continue
                    if isinstance(envelope, Response):
                        late.append(str(envelope.in_reply_to))
                    else:
                        received[str(envelope.body)] += 1
                    await lead.ack(envelope)

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker_loop)
                    for _ in range(3):
                        tg.start_soon(receiver)
                    async with anyio.create_task_group() as askers:
                        for i in range(asks):
                            askers.start_soon(asker, i)
                            await anyio.sleep(rng.choice([0, 0.001]))
                    expected_late = Counter(k for k, v in outcome.items() if v == "timed out")
                    while (
                        Counter(late) != expected_late or sum(received.values()) < messages
                    ) and sum(received.values()) <= messages:
                        await anyio.sleep(0.01)
                        if Counter(late) - expected_late:
                            break  # an answer came twice, or one that was taken
                    await anyio.sleep(0.05)  # anything more would be a duplicate
                    stop.set()
            assert Counter(late) == expected_late
            assert received == Counter(f"m{i}" for i in range(messages))
            stats = lead.statistics()
            assert stats.late_responses == len(expected_late)
            assert stats.pending_requests == 0 and stats.unacked == 0
            assert "answered" in outcome.values()
            assert_quiet(lead)
    assert errors == []

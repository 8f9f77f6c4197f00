"""The round trip's deadlines and acks: the inbox's one deadline timer for all its waiters,
responses acked after their requester has them (`Inbox._routed`, `_settle`), receive's inlined
checks, the file store's one-step append, the file reader's first read without a seek, and the
single-envelope encoding.

Each test tries to wake a waiter early or never, deliver an answer twice or lose one, tear or
misnumber a line, or encode an envelope otherwise than the batched path does. Times are compared
logically (a timeout is never raised before its deadline, measured on the clock the deadline was
computed with); "not long after" is asserted by order (an early deadline is reached while later
waiters still wait), never by a wall-clock bound. Where the claim is about processes, a real one
runs (this file is also the child: `python test_inbox.py MODE ...`).

Bugs this pass found, each fixed after its test: `release()` took an answer `request()` had
returned (its ack was still pending); a closed inbox's deadline timer kept the mailboxes alive
until it went off; a second answer read after the last commit was never committed (the next
process received it); a request waiting when its mailboxes closed took the member's lease again;
an answer that came during the liveness check was dropped with `TeammateGone`;
`request(timeout=math.inf)` stamped an infinite deadline (`InvalidEnvelope`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import math
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

from teamrt import Envelope, FileMailboxes
from teamrt.codec import encode
from teamrt.envelopes import Request, Response, register_payload, tracing
from teamrt.errors import (
    DiskFull,
    EnvelopeTooLarge,
    MailboxClosed,
    PayloadError,
    ReceiveTimeout,
    StoreCorrupt,
    UsageError,
)
from teamrt.mail.filestore import fileio
from teamrt.mail.filestore.paths import FIRST_READ, READ_CHUNK
from teamrt.mail.filestore.reader import FileReader, read_cursor
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.inbox import InboxStatistics
from teamrt.mail.log import decode_line, stamp
from teamrt.mail.mailboxes import Mailboxes
from tests.mail.helpers import (
    MEMBERS,
    Backing,
    answer_all,
    assert_quiet,
    file_mail,
    loop_errors,
    until,
)
from tests.support.paths import ROOT

# --- helpers -----------------------------------------------------------------------------------


# --- the inbox's one deadline timer --------------------------------------------------------------


async def test_each_waiter_times_out_at_its_own_deadline_never_before(backing: Backing) -> None:
    """Receivers with deadlines in shuffled order (equal ones, zero, negative, earlier ones
    added after later ones): each times out, never before its deadline by the clock the
    deadline was computed with; the far ones still wait when the near ones are done, and get
    the mail sent to them then."""
    rng = random.Random(3)
    near = [0.0, -1.0, 0.001, 0.004, 0.004, 0.004, 0.01, 0.02, 0.03, 0.03]
    rng.shuffle(near)
    far = [30.0, 20.0, 30.0]
    with loop_errors() as errors:
        async with backing.open() as mail:
            lead = await mail.open_inbox("lead")
            timed_out: list[tuple[float, float, float]] = []  # (timeout, started, ended)
            got: list[object] = []

            async def waiter(timeout: float) -> None:
                started = time.monotonic()
                try:
                    envelope = await lead.receive(timeout=timeout)
                except ReceiveTimeout:
                    timed_out.append((timeout, started, time.monotonic()))
                else:
                    got.append(envelope.body)

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for timeout in far:  # the later deadlines first: the timer is armed for them
                        tg.start_soon(waiter, timeout)
                    await anyio.lowlevel.checkpoint()
                    for timeout in near:
                        tg.start_soon(waiter, timeout)
                        await anyio.sleep(rng.choice([0, 0, 0.001]))
                    await until(lambda: len(timed_out) == len(near))
                    assert got == []  # nobody of the far ones was woken by a near deadline
                    for i in range(len(far)):
                        await mail.send(Envelope.message("worker", "lead", i))
            assert sorted(got) == list(range(len(far)))  # type: ignore[type-var]
            assert sorted(t for t, _, _ in timed_out) == sorted(near)
            for timeout, started, ended in timed_out:
                assert ended >= started + timeout  # never before its deadline
            assert_quiet(lead)
    assert errors == []


async def test_an_early_deadline_added_after_late_ones_is_not_held_up_by_them(
    local_backing: Backing,
) -> None:
    """The timer is armed for deadlines minutes away; a wait with a deadline of milliseconds
    comes after them: it times out while they still wait (no second wait for the far timer)."""
    async with local_backing.open() as mail:
        lead = await mail.open_inbox("lead")
        done: list[float] = []

        async def waiter(timeout: float) -> None:
            with contextlib.suppress(ReceiveTimeout):
                await lead.receive(timeout=timeout)
            done.append(timeout)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(waiter, 120.0)
                await anyio.sleep(0.01)
                assert lead._timer_at - time.monotonic() > 100  # armed for the far ones
                for timeout in (0.02, 0.01):
                    tg.start_soon(waiter, timeout)
                await until(lambda: len(done) == 2)
                assert sorted(done) == [0.01, 0.02]
                tg.cancel_scope.cancel()
        assert_quiet(lead)


async def test_the_timer_goes_off_for_a_waiter_that_is_gone_and_rearms_for_the_next(
    local_backing: Backing,
) -> None:
    """A waiter arms the timer, then leaves (mail came, or it was cancelled); later waiters
    with later deadlines are woken by the re-armed timer, not left waiting forever."""
    with loop_errors() as errors:
        async with local_backing.open() as mail:
            lead = await mail.open_inbox("lead")
            with anyio.fail_after(20):
                # 1. the timer's waiter got mail and left
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lead.receive, 0.02)
                    await anyio.sleep(0.001)
                    await mail.send(Envelope.message("worker", "lead", "x"))
                armed_for = lead._timer_at
                assert armed_for < math.inf  # still armed for the waiter that left
                started = time.monotonic()
                with pytest.raises(ReceiveTimeout):
                    await lead.receive(timeout=0.05)  # later than the stale timer
                assert time.monotonic() >= started + 0.05
                # 2. the timer's waiter was cancelled while armed for it
                with anyio.move_on_after(0.005):
                    await lead.receive(timeout=0.03)
                started = time.monotonic()
                with pytest.raises(ReceiveTimeout):
                    await lead.receive(timeout=0.06)
                assert time.monotonic() >= started + 0.06
                # 3. the timer goes off with nobody waiting at all
                with anyio.move_on_after(0.001):
                    await lead.receive(timeout=0.01)
                await anyio.sleep(0.03)
                assert lead._timer is None or lead._timer_at > time.monotonic()
                assert_quiet(lead)
    assert errors == []


async def test_an_inbox_closed_while_its_timer_is_armed(local_backing: Backing) -> None:
    """Receivers wait with deadlines; the mailboxes close under them: each gets MailboxClosed
    at once (not at its deadline), and the timer going off later for an inbox that is closed
    does nothing."""
    with loop_errors() as errors:
        outcomes: list[str] = []
        mail = local_backing.open()
        with anyio.fail_after(10):
            # the waiters outlive the mailboxes
            async with anyio.create_task_group() as tg, mail:
                lead = await mail.open_inbox("lead")

                async def receiver(timeout: float) -> None:
                    try:
                        await lead.receive(timeout=timeout)
                    except MailboxClosed:
                        outcomes.append("closed")
                    except ReceiveTimeout:
                        outcomes.append("timeout")

                for timeout in (1.0, 2.0, 60.0):
                    tg.start_soon(receiver, timeout)
                await anyio.sleep(0.005)
                assert lead._timer_at < math.inf
        assert outcomes == ["closed"] * 3
        lead._expire()  # the timer going off after the close
        assert not lead._deadlines
    assert errors == []


async def test_a_request_waiting_when_its_mailboxes_close_gets_mailbox_closed(
    local_backing: Backing,
) -> None:
    outcomes: list[BaseException] = []
    mail = local_backing.open()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, mail:
            lead = await mail.open_inbox("lead")

            async def requester() -> None:
                try:
                    await mail.request(
                        Envelope.request("lead", "worker", 1), timeout=1, require_live=False
                    )
                except Exception as exc:
                    outcomes.append(exc)

            tg.start_soon(requester)
            await anyio.sleep(0.005)
    assert [type(exc) for exc in outcomes] == [MailboxClosed]
    assert lead._lease is None  # not taken again by the closed inbox


async def test_closed_mailboxes_are_not_kept_alive_by_a_far_deadline(
    local_backing: Backing,
) -> None:
    """A receive with an hour's timeout gets its mail at once; the mailboxes close: nothing
    of them stays alive for that hour."""
    mail = local_backing.open()
    async with mail:
        lead = await mail.open_inbox("lead")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lead.receive, 3600)
            await anyio.sleep(0.01)
            await mail.send(Envelope.message("worker", "lead", "x"))
    refs = weakref.ref(lead), weakref.ref(mail)
    del lead, mail, tg
    await anyio.sleep(0.01)
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


async def test_timeouts_of_zero_and_below_never_wait_and_never_lose_mail(
    backing: Backing,
) -> None:
    async with backing.open() as mail:
        lead = await mail.open_inbox("lead")
        for timeout in (0, 0.0, -5, -math.inf):
            with pytest.raises(ReceiveTimeout):
                await lead.receive(timeout=timeout)
        await mail.send(Envelope.message("worker", "lead", "here"))
        got = None
        with anyio.fail_after(10):
            while got is None:  # a network store may need a moment to show it
                with contextlib.suppress(ReceiveTimeout):
                    got = await lead.receive(timeout=0)
                await anyio.sleep(0.001)
        assert got.body == "here"
        await lead.ack(got)
        assert_quiet(lead)


async def test_many_requests_answered_in_random_order_each_get_their_own(
    backing: Backing,
) -> None:
    """Sixty requests wait at once; the worker answers them all in a shuffled order, some first
    by a member that was not asked (rejected); every request gets its own answer, and after
    flush every answer is acked and nothing is left for receive."""
    rng = random.Random(5)
    count = 60
    async with backing.open() as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        answers: dict[str, Response] = {}
        requests = [Envelope.request("lead", "worker", i) for i in range(count)]
        impostors = 0

        async def ask(request: Request) -> None:
            answers[request.id] = await mail.request(request, timeout=20, require_live=False)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for request in requests:
                    tg.start_soon(ask, request)
                got: list[Request] = []
                while len(got) < count:
                    got.extend(r.to_envelope() for r in await worker.drain())  # type: ignore[misc]
                rng.shuffle(got)
                for request in got:
                    if rng.random() < 0.2:
                        impostors += 1
                        forged = Envelope.response(request, "forged")
                        await mail.send(forged.model_copy(update={"sender": "other"}))
                    await mail.send(Envelope.response(request, request.body))
                await worker.ack(*got)
        assert {k: v.body for k, v in answers.items()} == {r.id: r.body for r in requests}
        assert all(answers[r.id].in_reply_to == r.id for r in requests)
        await lead.flush()
        stats = lead.statistics()
        assert stats.unacked == 0 and stats.pending_requests == 0
        assert stats.rejected_responses == impostors
        with pytest.raises(ReceiveTimeout):
            await lead.receive(timeout=0.05)
        assert_quiet(lead)


@pytest.mark.parametrize("routed", [True, False], ids=["routed-by-another-read", "in-the-log"])
async def test_an_answer_that_comes_while_the_request_is_being_sent(
    backing: Backing, routed: bool
) -> None:
    """The answer comes before request() starts waiting: while its send is still returning,
    the worker answers, and another task's read routes the answer (no wake-up is left for
    the requester to see) or it just lies in the log. The request returns it, without
    waiting for its deadline."""
    async with backing.open() as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        real_send = mail.send

        async def send_then_answer(envelope: Envelope) -> None:
            await real_send(envelope)
            if isinstance(envelope, Request):
                requests: list[Any] = []
                with anyio.fail_after(10):
                    while not requests:
                        requests = worker.drain_nowait()
                        await anyio.sleep(0.001)
                await real_send(Envelope.response(requests[0].to_envelope(), "early"))
                if routed:
                    with anyio.fail_after(10):
                        while lead._pending:
                            assert lead.drain_nowait() == []  # routes it
                            await anyio.sleep(0.001)

        mail.send = send_then_answer  # type: ignore[method-assign]
        with anyio.fail_after(10):  # far less than its deadline: it does not wait that out
            response = await mail.request(
                Envelope.request("lead", "worker", "q"), timeout=600, require_live=False
            )
        assert response.body == "early"
        with pytest.raises(ReceiveTimeout):
            await lead.receive(timeout=0.05)


async def test_a_request_to_oneself_shares_the_inbox_with_its_own_receiver(
    backing: Backing,
) -> None:
    """The lead asks itself: a receiver on the lead's inbox gets the request (with its own
    short deadlines expiring meanwhile) and answers; the answer goes to request(), not to
    the receiver."""
    async with backing.open() as mail:
        lead = await mail.open_inbox("lead")
        seen: list[Envelope] = []

        async def receiver() -> None:
            while True:
                try:
                    envelope = await lead.receive(timeout=0.003)
                except ReceiveTimeout:
                    continue
                seen.append(envelope)
                await lead.ack(envelope)
                if isinstance(envelope, Request):
                    await mail.send(Envelope.response(envelope, ("echo", envelope.body)))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver)
                for i in range(5):
                    response = await mail.request(
                        Envelope.request("lead", "lead", i), timeout=10, require_live=False
                    )
                    assert response.body == ["echo", i]
                tg.cancel_scope.cancel()
        assert [e.kind for e in seen] == ["request"] * 5
        assert_quiet(lead)


# --- routed answers and their acks -----------------------------------------------------------


async def _restart_gets_nothing(backing: Backing) -> InboxStatistics:
    """The next process of the team: nothing comes to the lead's receive(); its statistics."""
    async with backing.open() as mail:
        lead = await mail.open_inbox("lead")
        with pytest.raises(ReceiveTimeout):
            await lead.receive(timeout=0.1)
        return lead.statistics()


async def _ask_once(mail: Mailboxes, body: object = "q") -> tuple[Request, Response]:
    """One request from the lead, answered by the worker (its request acked)."""
    worker = await mail.open_inbox("worker")
    request = Envelope.request("lead", "worker", body)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: answer_all(mail, worker, count=1))
        response = await mail.request(request, timeout=10, require_live=False)
    assert response.in_reply_to == request.id
    return request, response


@pytest.mark.parametrize("commit_delay", [0.01, 3600.0], ids=["committer", "close-only"])
async def test_an_answer_is_not_received_again_after_a_clean_exit(
    backing: Backing, commit_delay: float
) -> None:
    """The request returns and the process exits at once (no wait, flush or statistics
    after it): the next process does not get the answer again from receive()."""
    with anyio.fail_after(20):
        async with backing.open(commit_delay=commit_delay) as mail:
            await mail.open_inbox("lead")
            await _ask_once(mail)
        assert (await _restart_gets_nothing(backing)).unacked == 0  # not the answer again


async def test_a_routed_answer_is_committed_in_the_background_when_nothing_else_happens(
    tmp_path: Path,
) -> None:
    """After the request returns the inbox is never touched again (no wait, no flush, no
    statistics): the committer still commits the answer's ack."""
    async with file_mail(tmp_path) as mail:
        lead = await mail.open_inbox("lead")
        await _ask_once(mail)
        paths = mail.store.inbox_paths("lead")  # type: ignore[attr-defined]
        size = paths.log.stat().st_size
        with anyio.fail_after(10):
            await until(lambda: read_cursor(paths.cursor)[0].offset == size)
        assert lead._routed == []


async def test_flush_and_statistics_settle_the_routed_answers(tmp_path: Path) -> None:
    """With no background commit (a long commit delay), the answer's ack is counted by
    statistics() at once and in the committed cursor after flush(); an ack of the answer by
    the caller too changes nothing."""
    async with file_mail(tmp_path, commit_delay=3600) as mail:
        lead = await mail.open_inbox("lead")
        paths = mail.store.inbox_paths("lead")  # type: ignore[attr-defined]
        _, response = await _ask_once(mail)
        assert lead.statistics().unacked == 0
        assert read_cursor(paths.cursor)[0].offset == 0  # not committed yet
        await lead.flush()
        assert read_cursor(paths.cursor)[0].offset == paths.log.stat().st_size
        _, response = await _ask_once(mail)
        await lead.ack(response)  # the caller acks it as well: harmless
        await lead.flush()
        assert read_cursor(paths.cursor)[0].offset == paths.log.stat().st_size
        stats = lead.statistics()
        assert (stats.unacked, stats.duplicates_dropped, stats.duplicate_responses) == (0, 0, 0)


async def test_duplicate_answers_never_reach_receive(backing: Backing) -> None:
    """The same answer twice and a second answer (another id) in the one write the requester
    reads, then both again in later reads: the request gets the first; the same id again is a
    dropped duplicate, the other answers are duplicate responses; receive() gets none of them,
    in this process or the next."""
    with anyio.fail_after(20):
        async with backing.open() as mail:
            lead = await mail.open_inbox("lead")
            worker = await mail.open_inbox("worker")
            request = Envelope.request("lead", "worker", "q")
            answer = Envelope.response(request, "first")
            second = Envelope.response(request, "second")
            third = Envelope.response(request, "third")

            async def answer_twice() -> None:
                await worker.drain()
                await mail.send_many([answer, answer, second])  # one write

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_twice)
                response = await mail.request(request, timeout=10, require_live=False)
            assert (response.id, response.body) == (answer.id, "first")
            await mail.send(answer)
            await mail.send(third)
            with pytest.raises(ReceiveTimeout):
                await lead.receive(timeout=0.1)
            stats = lead.statistics()
            assert (stats.duplicates_dropped, stats.duplicate_responses) == (2, 2)
            assert stats.unacked == 0 and stats.late_responses == 0
        await _restart_gets_nothing(backing)


async def test_an_answer_routed_while_a_commit_is_in_flight_is_committed_after_it(
    backing: Backing,
) -> None:
    """A commit of the lead's cursor is held in flight; meanwhile a request is answered (the
    answer routed, its ack pending). The commit completes; flush() then commits the answer's
    ack too: the next process gets neither the message nor the answer again."""
    with anyio.fail_after(20):
        async with backing.open(commit_delay=3600) as mail:
            lead = await mail.open_inbox("lead")
            await mail.send(Envelope.message("worker", "lead", "m"))
            message = await lead.receive(timeout=10)
            reader = lead._reading
            real_commit = reader.commit
            gate = anyio.Event()
            entered = anyio.Event()
            calls = 0

            async def held_commit(cursor: Any) -> None:
                nonlocal calls
                calls += 1
                if calls == 1:
                    entered.set()
                    await gate.wait()
                await real_commit(cursor)

            reader.commit = held_commit  # type: ignore[method-assign]
            async with anyio.create_task_group() as tg:
                tg.start_soon(lead.ack, message)
                await entered.wait()
                await _ask_once(mail)  # routed while the commit waits
                gate.set()
            await lead.flush()
            assert lead.statistics().unacked == 0
            assert calls >= 2
        await _restart_gets_nothing(backing)


async def test_the_answer_a_request_returned_cannot_be_released_to_receive(
    backing: Backing,
) -> None:
    """The answer was handled by request(): releasing it is handing it out twice, a usage
    error (as for any acked envelope), and receive() never gets it."""
    async with backing.open(commit_delay=3600) as mail:
        lead = await mail.open_inbox("lead")
        _, response = await _ask_once(mail)
        with pytest.raises(UsageError):
            lead.release(response)
        with pytest.raises(ReceiveTimeout):
            await lead.receive(timeout=0.05)


async def test_an_answer_that_arrives_during_the_liveness_check_is_not_lost(
    local_backing: Backing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker answers and stops (its lease gone) while the requester asks the store
    whether it is alive; another task's read routes the answer meanwhile. The caller gets the
    answer, or TeammateGone and then the answer from receive(): not neither."""
    from teamrt.errors import TeammateGone
    from teamrt.mail import mailboxes as mailboxes_module

    monkeypatch.setattr(mailboxes_module, "LIVENESS_GRACE", 0.01)
    async with local_backing.open() as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        request = Envelope.request("lead", "worker", "q")
        real_alive = mail.store.member_alive

        async def alive_but_answered_meanwhile(name: str) -> bool | None:
            await mail.send(Envelope.response(request, "a"))
            assert lead.drain_nowait() == []  # this read routes the answer to the request
            await anyio.lowlevel.checkpoint()
            return False  # it answered, then stopped

        monkeypatch.setattr(mail.store, "member_alive", alive_but_answered_meanwhile)
        outcome: object
        try:
            outcome = (await mail.request(request, timeout=10)).body
        except TeammateGone:
            monkeypatch.setattr(mail.store, "member_alive", real_alive)
            try:
                outcome = ("gone, then received", (await lead.receive(timeout=0.1)).body)
            except ReceiveTimeout:
                outcome = "lost"
        del worker
        assert outcome in ("a", ("gone, then received", "a"))


async def test_a_restart_from_the_cursor_with_answers_pending_their_ack(
    local_backing: Backing,
) -> None:
    """The inbox reloads from its committed cursor (another holder committed meanwhile: what
    `_check_lease` does) while an answer's ack is still pending: the answer read again is a
    duplicate response, not mail for receive()."""
    with anyio.fail_after(20):
        async with local_backing.open(commit_delay=3600) as mail:
            lead = await mail.open_inbox("lead")
            await _ask_once(mail)
            assert lead._routed  # the ack is pending
            lead._restart(await lead._reading.start())
            with pytest.raises(ReceiveTimeout):
                await lead.receive(timeout=0.05)
            stats = lead.statistics()
            assert stats.duplicate_responses == 1 and stats.unacked == 0
            # (that its ack is committed: test_a_second_answer_read_after_the_last_commit...)


async def test_a_second_answer_read_after_the_last_commit_is_committed_before_exit(
    backing: Backing,
) -> None:
    """The request's answer is committed (flush); a second answer to it arrives and is read
    (a duplicate response, not for receive). The process exits cleanly: the next one must not
    receive the second answer."""
    with anyio.fail_after(20):
        async with backing.open() as mail:
            lead = await mail.open_inbox("lead")
            request, _ = await _ask_once(mail)
            await lead.flush()
            await mail.send(Envelope.response(request, "again"))
            with pytest.raises(ReceiveTimeout):
                await lead.receive(timeout=0.1)
            assert lead.statistics().duplicate_responses == 1
            await lead.flush()
        await _restart_gets_nothing(backing)  # not the second answer again


async def test_a_process_killed_right_after_its_request_returned(tmp_path: Path) -> None:
    """The child's request returns and the child is killed at once (SIGKILL, before any
    commit of the answer's ack). The next process: the worker does not get the request again
    (it acked it before answering); the answer comes to receive() at most once, as a response
    to that request (nothing else is lost or doubled)."""
    team = tmp_path / "team"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    proc = _spawn("request-then-die", str(team))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    request_id, response_id = out.decode().split()
    async with FileMailboxes(team) as mail:
        lead = await mail.open_inbox("lead")
        worker = await mail.open_inbox("worker")
        got: list[Envelope] = []
        with contextlib.suppress(ReceiveTimeout):
            while True:
                got.append(await lead.receive(timeout=0.2))
        with pytest.raises(ReceiveTimeout):
            await worker.receive(timeout=0.05)
        assert len(got) <= 1
        for envelope in got:
            assert isinstance(envelope, Response)
            assert (envelope.id, envelope.in_reply_to) == (response_id, request_id)
        assert lead.statistics().late_responses == 0


# --- the reader's first read without a seek ---------------------------------------------------


def _sized(seq: int, size: int, team: bytes = b"team") -> tuple[Envelope, bytes]:
    """A message to the worker whose log line (stamped with `seq`, newline included) is
    exactly `size` bytes, and that line."""
    envelope = Envelope.message("lead", "worker", "")
    pad = size - len(stamp(encode(envelope, finite=True), seq, team))
    assert pad >= 0, size
    envelope = envelope.model_copy(update={"body": "x" * pad})
    line = stamp(encode(envelope, finite=True), seq, team)
    assert len(line) == size
    return envelope, line


def _audit_reads(reader: FileReader, violations: list[str]) -> None:
    """Check every read of `reader`: when it says it caught up, it read every byte that was in
    its segment before the read began (writers only append, so this holds with other writers
    running too)."""
    real = reader.read_nowait

    def size() -> int:  # of the reader's file (found by name while the reader is parked)
        if reader.fd >= 0:
            return os.fstat(reader.fd).st_size
        rotated = reader.paths.segment(reader.segment)
        return os.stat(rotated if rotated.exists() else reader.paths.log).st_size

    def read_nowait() -> list[Any]:
        segment, before = reader.segment, size()
        entries = real()
        if reader.caught_up and reader.segment == segment and reader.decoder.offset < before:
            violations.append(f"caught up at {reader.decoder.offset} of {before} bytes")
        return entries

    reader.read_nowait = read_nowait  # type: ignore[method-assign]


def _log_lines(store: FileStore, name: str) -> list[bytes]:
    paths = store.inbox_paths(name)
    data = b"".join(path.read_bytes() for path in paths.segments())
    assert data.endswith(b"\n") or not data
    return data.splitlines()


def _assert_dense(lines: list[bytes], ids: list[str] | None = None) -> None:
    """Every line an envelope, seq 0, 1, 2, ... in log order, each id once (and exactly
    `ids`, in any order, if given)."""
    decoded = [decode_line(line) for line in lines]
    assert all(isinstance(e, Envelope) for e in decoded)
    assert [e.seq for e in decoded] == list(range(len(decoded)))  # type: ignore[union-attr]
    found = [e.id for e in decoded]  # type: ignore[union-attr]
    assert len(set(found)) == len(found)
    if ids is not None:
        assert sorted(found) == sorted(ids)


LIMIT = 600 << 10  # the stores' max_envelope here: records at the limit stay quick
SIZES = [
    FIRST_READ - 1,
    FIRST_READ,
    FIRST_READ + 1,
    READ_CHUNK - 1,
    READ_CHUNK,
    READ_CHUNK + 1,
    FIRST_READ + READ_CHUNK,
    FIRST_READ + READ_CHUNK + 1,
]


@pytest.mark.parametrize("lead_in", [0, 300, 4097, FIRST_READ - 300, FIRST_READ - 1])
@pytest.mark.parametrize("live", [False, True], ids=["backlog", "live"])
async def test_records_around_the_read_sizes_arrive_whole_and_in_order(
    tmp_path: Path, lead_in: int, live: bool
) -> None:
    """Lines of FIRST_READ and READ_CHUNK bytes, one less and one more, and at the envelope
    limit, each behind a lead-in line (of `lead_in` bytes) that moves it across read
    boundaries; written before the
    reader starts (a backlog) or while it waits: each arrives whole, in order, once, and no
    read says it caught up while complete lines are unread."""
    # claim checks off (max_blob=0): an envelope over the limit is refused whole
    async with file_mail(tmp_path, store={"max_envelope": LIMIT, "max_blob": 0}) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        worker = await mail.open_inbox("worker")
        violations: list[str] = []
        _audit_reads(worker._reading, violations)  # type: ignore[arg-type]
        plan: list[Envelope] = []
        seq = 0
        for size in [*SIZES, -1]:  # -1: at the envelope limit
            if lead_in:
                plan.append(_sized(seq, lead_in)[0])
                seq += 1
            envelope: Envelope
            if size < 0:
                envelope = Envelope.message("lead", "worker", "")
                pad = LIMIT - len(encode(envelope, finite=True))
                envelope = envelope.model_copy(update={"body": "z" * pad})
                assert len(encode(envelope, finite=True)) == LIMIT
            else:
                envelope, _ = _sized(seq, size)
            plan.append(envelope)
            seq += 1
        got: list[Envelope] = []
        with anyio.fail_after(30):
            if not live:
                for envelope in plan:
                    await mail.send(envelope)
                while len(got) < len(plan):
                    got.append(await worker.receive(timeout=10))
            else:
                for envelope in plan:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(mail.send, envelope)
                        got.append(await worker.receive(timeout=10))
            with pytest.raises(ReceiveTimeout):
                await worker.receive(timeout=0)
        assert [(e.id, e.body) for e in got] == [(e.id, e.body) for e in plan]
        assert violations == []
        big = Envelope.message("lead", "worker", "z" * (LIMIT + 1))
        with pytest.raises(EnvelopeTooLarge):
            await mail.send(big)
        _assert_dense(_log_lines(store, "worker"), [e.id for e in plan])


@pytest.mark.parametrize("wake", ["notification", "rescan"])
@pytest.mark.parametrize(
    ("size", "first"),
    [
        (300, 1),
        (300, 299),
        (FIRST_READ + 10, FIRST_READ),
        (FIRST_READ + 10, FIRST_READ - 1),
        (FIRST_READ + 10, FIRST_READ + 1),
        (READ_CHUNK + FIRST_READ + 5, READ_CHUNK + FIRST_READ),
        (READ_CHUNK + 5, READ_CHUNK),
    ],
)
async def test_a_line_written_in_two_halves_with_a_pause_comes_once_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, first: int, wake: str
) -> None:
    """Another writer's line arrives in two writes with a pause between (the reader sees the
    torn tail, even a first half of exactly FIRST_READ bytes, and catches up on it); the
    second half completes it: a waiting receiver gets it once, whole; the next send continues
    seq after it."""
    if wake == "rescan":
        from teamrt.mail import inotify

        monkeypatch.setattr(inotify, "available", lambda: False)
    async with file_mail(tmp_path, store={"max_envelope": LIMIT}) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        worker = await mail.open_inbox("worker")
        violations: list[str] = []
        _audit_reads(worker._reading, violations)  # type: ignore[arg-type]
        await mail.send(Envelope.message("lead", "worker", "before"))
        assert (await worker.receive(timeout=5)).body == "before"
        envelope, line = _sized(1, size)
        fd = os.open(store.inbox_paths("worker").log, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line[:first])
            with pytest.raises(ReceiveTimeout):
                await worker.receive(timeout=0.05)  # reads the torn tail, waits on
            assert worker._reading.caught_up or first >= FIRST_READ
            got: list[Envelope] = []
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:

                    async def receiver() -> None:
                        got.append(await worker.receive(timeout=15))

                    tg.start_soon(receiver)
                    await anyio.sleep(0.02)
                    os.write(fd, line[first:])
        finally:
            os.close(fd)
        assert [(e.id, e.body) for e in got] == [(envelope.id, envelope.body)]
        await mail.send(Envelope.message("lead", "worker", "after"))
        after = await worker.receive(timeout=5)
        assert (after.body, after.seq) == ("after", 2)
        with pytest.raises(ReceiveTimeout):
            await worker.receive(timeout=0)
        assert violations == []
        _assert_dense(_log_lines(store, "worker"))


async def test_a_backlog_of_small_lines_across_rotations_read_every_way(tmp_path: Path) -> None:
    """Thousands of small lines (far more than one read) over several segments, while
    another process appends more: receive, receive_nowait, drain and receive_batch_nowait
    in turn get every one once, in order, and no read claims to have caught up early."""
    async with file_mail(tmp_path, store={"segment_bytes": 50_000}) as mail:
        worker = await mail.open_inbox("worker")
        violations: list[str] = []
        _audit_reads(worker._reading, violations)  # type: ignore[arg-type]
        local = [f"l{i}" for i in range(2500)]
        await mail.send_many([Envelope.message("lead", "worker", b) for b in local[:1500]])
        proc = _spawn("send", str(tmp_path / "team"), "800")
        got: list[str] = []

        async def send_the_rest() -> None:
            for body in local[1500:]:
                await mail.send(Envelope.message("lead", "worker", body))
                await anyio.lowlevel.checkpoint()

        try:
            with anyio.fail_after(40):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_the_rest)
                    step = 0
                    while len(got) < len(local) + 800:
                        step += 1
                        batch: list[Any]
                        if step % 4 == 0:
                            batch = [await worker.receive(timeout=30)]
                        elif step % 4 == 1:
                            try:
                                batch = [worker.receive_nowait()]
                            except anyio.WouldBlock:
                                batch = []
                        elif step % 4 == 2:
                            batch = worker.drain_nowait(max=97)
                        else:
                            batch = worker.receive_batch_nowait(max=31)
                        got.extend(str(e.body) for e in batch)
                        if batch:
                            worker.ack_nowait(*batch)
                        else:
                            await anyio.sleep(0.001)
        finally:
            _finish(proc)
        assert Counter(got) == Counter([*local, *(f"p{i}" for i in range(800))])
        assert [b for b in got if b[0] == "l"] == local  # each writer's order kept
        assert [b for b in got if b[0] == "p"] == [f"p{i}" for i in range(800)]
        assert violations == []
        assert worker._reading.segment >= 3  # type: ignore[attr-defined]  # read across rotations
        _assert_dense(_log_lines(mail.store, "worker"))  # type: ignore[arg-type]


@pytest.mark.parametrize("delta", [-1, 0, 1])
@pytest.mark.parametrize("live", [False, True], ids=["backlog", "live"])
async def test_segments_of_about_one_first_read(tmp_path: Path, delta: int, live: bool) -> None:
    """The segment size is FIRST_READ (one byte less or more), and the lines fill segments to
    exactly that size: the reader's full first read ends at a segment's end, the rotated
    segment is left and the next one read; every line arrives once, in order, and no read
    claims to have caught up early."""
    segment = FIRST_READ + delta
    async with file_mail(tmp_path, store={"segment_bytes": segment}) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        worker = await mail.open_inbox("worker")
        violations: list[str] = []
        _audit_reads(worker._reading, violations)  # type: ignore[arg-type]
        exact = [FIRST_READ // 4] * 3 + [FIRST_READ - 3 * (FIRST_READ // 4)]  # 64 KiB in all
        sizes = [*exact, FIRST_READ, 300, FIRST_READ - 300, FIRST_READ + 1, 500, *exact]
        plan = [_sized(seq, size)[0] for seq, size in enumerate(sizes)]
        got: list[Envelope] = []
        with anyio.fail_after(30):
            for envelope in plan:
                if live:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(mail.send, envelope)
                        got.append(await worker.receive(timeout=10))
                else:
                    await mail.send(envelope)
            while len(got) < len(plan):
                got.append(await worker.receive(timeout=10))
        assert [e.id for e in got] == [e.id for e in plan]
        assert violations == []
        assert len(store.inbox_paths("worker").segments()) >= 3
        _assert_dense(_log_lines(store, "worker"), [e.id for e in plan])


async def test_a_log_truncated_or_deleted_after_a_short_read_is_reported_not_skipped(
    tmp_path: Path,
) -> None:
    """After a short first read that caught up, the log shrinks below the read position (or
    is deleted): the next read reports the damage instead of waiting forever or reading on."""
    async with file_mail(tmp_path) as mail:
        worker = await mail.open_inbox("worker")
        await mail.send(Envelope.message("lead", "worker", "x" * 1000))
        await worker.receive(timeout=5)
        assert worker._reading.caught_up
        log_path = mail.store.inbox_paths("worker").log  # type: ignore[attr-defined]
        os.truncate(log_path, 10)
        worker.wake()
        with pytest.raises(StoreCorrupt, match="truncated"):
            await worker.receive(timeout=5)
    async with file_mail(tmp_path / "again") as mail:
        worker = await mail.open_inbox("worker")
        await mail.send(Envelope.message("lead", "worker", "x"))
        await worker.receive(timeout=5)
        os.unlink(mail.store.inbox_paths("worker").log)  # type: ignore[attr-defined]
        worker.wake()
        with pytest.raises(StoreCorrupt, match="deleted"):
            await worker.receive(timeout=5)
        with pytest.raises(StoreCorrupt, match="missing"):
            await mail.send(Envelope.message("lead", "worker", "y"))


@pytest.mark.parametrize("size", [100, FIRST_READ + 1, READ_CHUNK + FIRST_READ])
async def test_a_watched_request_gets_an_answer_longer_than_the_first_read(
    backing: Backing, size: int
) -> None:
    """request(consume=False) reads the sender's inbox from its end without owning it; the
    answer is longer than the reader's first read (or not): it comes whole."""
    async with backing.open(commit_delay=0.001) as mail:
        worker = await mail.open_inbox("worker")
        request = Envelope.request("lead", "worker", "q")

        async def answer() -> None:
            asked = await worker.receive(timeout=10)
            await mail.send(Envelope.response(asked, "r" * size))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer)
                response = await mail.request(
                    request, timeout=15, consume=False, require_live=False
                )
        assert response.body == "r" * size and response.in_reply_to == request.id


# --- the file store's one-step append -----------------------------------------------------------


def _lock_free(store: FileStore, name: str) -> bool:
    """True if nobody holds `name`'s append lock (taken and dropped on a descriptor of ours)."""
    fd = os.open(store.inbox_paths(name).lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # drops it
    return True


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(1, b"held\\n")
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize("durability", ["none", "fsync"])
@pytest.mark.parametrize("holder", ["thread", "process"])
async def test_one_step_appends_racing_the_lock_held_elsewhere(
    tmp_path: Path, holder: str, durability: str
) -> None:
    """Tasks of this process send to one inbox at once while the append lock is taken
    elsewhere: by a thread of this process on its own descriptor (over and over), or by
    another process for a while. Every acknowledged send is in the log once, seq dense, and
    the lock is free afterwards."""
    tasks, each = 8, 25 if durability == "none" else 6
    async with file_mail(tmp_path, store={"durability": durability}) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        await mail.send(Envelope.message("lead", "worker", "first"))  # the appender exists
        acknowledged: list[str] = [decode_line(_log_lines(store, "worker")[0]).id]  # type: ignore[union-attr]
        lock = str(store.inbox_paths("worker").lock)
        stop = sending = False
        holds = 0

        def toggle() -> None:
            """Hold the lock until the senders have started (their first appends find it
            taken), then take and drop it over and over until they are done."""
            nonlocal holds
            fd = os.open(lock, os.O_RDWR)
            try:
                while not stop:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    holds += 1
                    while not sending and not stop:
                        time.sleep(0.001)
                    time.sleep(0.0003)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    time.sleep(0.0002)
            finally:
                os.close(fd)

        async def sender(k: int) -> None:
            for i in range(each):
                envelope = Envelope.message("lead", "worker", f"{k}-{i}")
                if k == 0 and i % 2:  # a batch of three between the single sends
                    batch = [envelope, *(Envelope.message("lead", "worker", n) for n in "ab")]
                    await mail.send_many(batch)
                    acknowledged.extend(e.id for e in batch)
                    continue
                await mail.send(envelope)
                acknowledged.append(envelope.id)
                if i % 3 == k % 3:
                    await anyio.lowlevel.checkpoint()

        with anyio.fail_after(30):
            if holder == "thread":
                async with anyio.create_task_group() as tg:
                    tg.start_soon(anyio.to_thread.run_sync, toggle)
                    try:
                        await until(lambda: holds > 0)
                        assert not _lock_free(store, "worker")
                        async with anyio.create_task_group() as senders:
                            for k in range(tasks):
                                senders.start_soon(sender, k)
                            await anyio.lowlevel.checkpoint()  # they start, and wait
                            sending = True
                    finally:
                        stop = True
                appender = store._appenders["worker"]
                assert appender.spins_won + appender.spins_lost + appender.spins_skipped > 0
            else:
                proc = await anyio.open_process(
                    [sys.executable, "-c", HOLD_LOCK, lock, "0.2"], stderr=subprocess.PIPE
                )
                try:
                    assert proc.stdout is not None
                    assert await proc.stdout.receive() == b"held\n"
                    assert not _lock_free(store, "worker")
                    async with anyio.create_task_group() as senders:
                        for k in range(tasks):
                            senders.start_soon(sender, k)
                finally:
                    assert await proc.wait() == 0
        assert _lock_free(store, "worker")
        assert len(acknowledged) == 1 + tasks * each + 2 * (each // 2)
        _assert_dense(_log_lines(store, "worker"), acknowledged)
        worker = await mail.open_inbox("worker")
        got = [e.id for e in worker.drain_nowait(max=1000)]
        assert sorted(got) == sorted(acknowledged)


class _FullDisk:
    """`os` as the file store's writes see it: once `armed`, a write fails with ENOSPC (after
    writing `keep` bytes of it first, as a short write)."""

    def __init__(self) -> None:
        self.armed = False
        self.keep = 0

    def write(self, fd: int, data: Any) -> int:
        if not self.armed:
            return os.write(fd, data)
        if self.keep:
            written = os.write(fd, bytes(data[: self.keep]))
            self.keep = 0
            return written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.parametrize("keep", [0, 1, 50], ids=["nothing", "one-byte", "part"])
async def test_a_full_disk_in_the_one_step_append_leaves_no_part_and_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int
) -> None:
    async with file_mail(tmp_path) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        worker = await mail.open_inbox("worker")
        acknowledged = []
        for i in range(3):
            envelope = Envelope.message("lead", "worker", i)
            await mail.send(envelope)
            acknowledged.append(envelope.id)
        log_path = store.inbox_paths("worker").log
        before = log_path.read_bytes()
        disk = _FullDisk()
        monkeypatch.setattr(fileio, "os", disk)
        disk.armed, disk.keep = True, keep
        with pytest.raises(DiskFull, match="nothing was written"):
            await mail.send(Envelope.message("lead", "worker", "lost"))
        assert log_path.read_bytes() == before
        assert _lock_free(store, "worker")
        disk.armed = False
        for i in range(2):
            envelope = Envelope.message("lead", "worker", f"after {i}")
            await mail.send(envelope)
            acknowledged.append(envelope.id)
        got = [await worker.receive(timeout=5) for _ in acknowledged]
        assert [e.id for e in got] == acknowledged
        assert [e.seq for e in got] == list(range(len(acknowledged)))
        assert worker.statistics().quarantined == 0


async def test_a_deleted_log_fails_the_one_step_append_and_frees_the_lock(
    tmp_path: Path,
) -> None:
    async with file_mail(tmp_path) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        await mail.send(Envelope.message("lead", "worker", 1))
        log_path = store.inbox_paths("worker").log
        os.unlink(log_path)
        for _ in range(2):  # and again: the appender does not recreate it
            with pytest.raises(StoreCorrupt, match="missing"):
                await mail.send(Envelope.message("lead", "worker", 2))
            assert _lock_free(store, "worker")
            assert not log_path.exists()


@pytest.mark.parametrize("delta", [-1, 0, 1])
async def test_rotation_at_the_segment_boundary_with_two_writers(
    tmp_path: Path, delta: int
) -> None:
    """Lines that fill a segment to exactly its size, one byte less or more; two stores of
    this process (two descriptors: each finds the other's rotation) send in turn: every
    segment ends on a line boundary and is rotated once it reaches the size, seq is dense
    across segments, and the reader gets every line once, in order."""
    segment = 4096
    async with (
        file_mail(tmp_path, store={"segment_bytes": segment}) as mail,
        file_mail(tmp_path, store={"segment_bytes": segment}) as other,
    ):
        store: FileStore = mail.store  # type: ignore[assignment]
        worker = await mail.open_inbox("worker")
        sizes = [1000, 1000, 1000, 1096 + delta, segment + delta, 700, 700, 300]
        sizes += [segment - 1700 + delta, 2100, 1996 + delta, 999, 500, 300]
        sent: list[Envelope] = []
        for seq, size in enumerate(sizes):
            envelope, _ = _sized(seq, size)
            await (mail if seq % 2 else other).send(envelope)
            sent.append(envelope)
        got = [await worker.receive(timeout=5) for _ in sent]
        assert [e.id for e in got] == [e.id for e in sent]
        paths = store.inbox_paths("worker")
        segments = paths.segments()
        assert len(segments) >= 3
        for path in segments[:-1]:
            data = path.read_bytes()
            assert data.endswith(b"\n")
            last = data[:-1].rfind(b"\n") + 1
            assert len(data) >= segment > last  # rotated once full, not before, not after
        _assert_dense(_log_lines(store, "worker"), [e.id for e in sent])


async def test_a_send_after_the_mailboxes_closed_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    mail = file_mail(tmp_path)
    async with mail:
        await mail.send(Envelope.message("lead", "worker", 1))
    log_path = tmp_path / "team" / "inboxes" / "worker.jsonl"
    before = log_path.read_bytes()
    with pytest.raises(MailboxClosed):
        await mail.send(Envelope.message("lead", "worker", 2))
    with pytest.raises(MailboxClosed):
        await mail.send_many([Envelope.message("lead", "worker", 3)])
    assert log_path.read_bytes() == before


# --- one envelope encoded the short way ----------------------------------------------------------


class _Typed(BaseModel):
    n: int


TYPED = "hostile-rtt2-typed"
register_payload(TYPED, _Typed)


def _envelopes() -> list[Envelope]:
    request = Envelope.request("lead", "worker", {"a": [1, 2.5, None, "é\n"]}, timeout=30)
    return [
        Envelope.message("lead", "worker", "plain"),
        Envelope.message("lead", "worker", {"nested": {"x": [True, None]}}, type="t"),
        Envelope.message("lead", "worker", "traced", trace_id="my-trace"),
        Envelope.message("lead", "worker", ""),
        request,
        Envelope.request("lead", "worker", 1).with_deadline(time.time() + 5),
        Envelope.response(request, "answer"),
        Envelope.error(request, ValueError("bad")),
        Envelope.broadcast("lead", "news"),
        Envelope.message("lead", "worker", {"n": 3}, type=TYPED),
        Envelope.message("lead", "worker", "x" * 5000),
        Envelope.message("lead", "worker", "team set", type="t").model_copy(
            update={"team": "team"}
        ),
    ]


def _outcome(encode_one: Callable[[], bytes]) -> object:
    try:
        return encode_one()
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def _same_both_ways(mail: Mailboxes, envelopes: list[Envelope]) -> list[object]:
    """Each envelope through `_encode` and `_encode_many`; asserts they agree byte for byte
    (or raise the same error); returns the outcomes."""
    outcomes = []
    for envelope in envelopes:
        short = _outcome(lambda e=envelope: mail._encode(e))  # type: ignore[misc]
        batched = _outcome(lambda e=envelope: mail._encode_many((e,))[0])  # type: ignore[misc]
        assert short == batched, envelope
        outcomes.append(short)
    return outcomes


@pytest.mark.parametrize("context", ["plain", "task-trace", "telemetry", "signed"])
async def test_the_short_encoding_is_the_batched_one_byte_for_byte(
    tmp_path: Path, context: str
) -> None:
    key = "k" * 32 if context == "signed" else None
    async with file_mail(tmp_path, key=key) as mail:
        with contextlib.ExitStack() as stack:
            if context == "task-trace":
                stack.enter_context(tracing("task-trace-1"))
            if context == "telemetry":
                from opentelemetry.sdk.trace import TracerProvider

                from teamrt import telemetry

                telemetry.enable(TracerProvider())
                stack.callback(telemetry.disable)
                stack.enter_context(telemetry.span("outer"))
            envelopes = _envelopes()
            outcomes = _same_both_ways(mail, envelopes)
            for envelope, outcome in zip(envelopes, outcomes, strict=True):
                assert isinstance(outcome, bytes), (envelope, outcome)
        lines = [o for o in outcomes if isinstance(o, bytes)]
        if context == "task-trace":  # the task's trace, where the envelope had none
            assert all(b'"trace_id":' in line for line in lines)
        if context == "telemetry":
            assert all(b'"traceparent":"00-' in line for line in lines)
        if context == "signed":
            assert all(
                mail._signer is not None and mail._signer.verify(stamp(line, 0, b"team"), "team")
                for line in lines
            )
        else:
            assert all(b'"sig":' not in line for line in lines)


async def test_the_short_encoding_refuses_what_the_batched_one_refuses(tmp_path: Path) -> None:
    """A body that does not fit its registered payload model, an envelope of another team, an
    envelope over the limit (one byte over, and far over): the same error either way, and
    send() writes nothing."""
    # claim checks off (max_blob=0): an envelope over the limit is refused whole
    async with file_mail(tmp_path, store={"max_envelope": 4096, "max_blob": 0}) as mail:
        store: FileStore = mail.store  # type: ignore[assignment]
        await mail.send(Envelope.message("lead", "worker", "first"))
        at_limit = Envelope.message("lead", "worker", "")
        pad = 4096 - len(encode(at_limit, finite=True))
        at_limit = at_limit.model_copy(update={"body": "x" * pad})
        over = at_limit.model_copy(update={"body": "x" * (pad + 1)})
        bad = [
            Envelope.message("lead", "worker", {"n": "not a number"}, type=TYPED),
            Envelope.message("lead", "worker", "x").model_copy(update={"team": "elsewhere"}),
            over,
            Envelope.message("lead", "worker", "y" * 10_000),
            Envelope.broadcast("lead", "z" * 10_000),
        ]
        outcomes = _same_both_ways(mail, bad)
        assert [o[0] for o in outcomes] == [  # type: ignore[index]
            "PayloadError",
            "UsageError",
            "EnvelopeTooLarge",
            "EnvelopeTooLarge",
            "EnvelopeTooLarge",
        ]
        log_path = store.inbox_paths("worker").log
        before = log_path.read_bytes()
        for envelope in bad:
            with pytest.raises((PayloadError, UsageError, EnvelopeTooLarge)):
                await mail.send(envelope)
        assert log_path.read_bytes() == before
        assert _same_both_ways(mail, [at_limit]) != []
        await mail.send(at_limit)  # exactly at the limit: sent
        assert len(_log_lines(store, "worker")) == 2


# --- the child -----------------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


async def _request_then_die(team: str) -> None:
    """Ask the worker (answered by a task here), print the ids, die at once by SIGKILL."""
    async with FileMailboxes(team) as mail:
        worker = await mail.open_inbox("worker")
        await mail.open_inbox("lead")
        request = Envelope.request("lead", "worker", "q")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: answer_all(mail, worker, count=1))
            response = await mail.request(request, timeout=30, require_live=False)
        os.write(1, f"{request.id} {response.id}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)


async def _send_messages(team: str, count: str) -> None:
    """Send `count` messages to the worker as fast as possible."""
    async with FileMailboxes(team) as mail:
        for i in range(int(count)):
            await mail.send(Envelope.message("lead", "worker", f"p{i}"))


if __name__ == "__main__":
    signal.alarm(60)
    mode, *rest = sys.argv[1:]
    if mode == "request-then-die":
        anyio.run(_request_then_die, rest[0])
    else:
        assert mode == "send"
        anyio.run(_send_messages, rest[0], rest[1])

"""Leases fence effects: an incarnation that lost its lease hands its application nothing more,
starts no task and runs no tool call; tools see the fencing token."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis
from anyio import WouldBlock

from teamrt import Envelope, FileMailboxes
from teamrt.agents import Toolbox, current_fence, tool
from teamrt.agents.tools import _current_fence
from teamrt.errors import LeaseLost, StoreError
from teamrt.mail.inbox import Inbox
from teamrt.mail.log import encode
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore, parse_locator
from teamrt.mail.redisstore.keys import TeamKeys
from teamrt.mail.store import LeaseRecord
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolCall, ToolSpec, call
from teamrt.team import Team, Teammate
from tests.support.fencing_procs import task_of
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer, needs_redis, redis_server, shared_redis

__all__ = ["redis_server", "shared_redis"]  # the fixtures


def _child(*args: str) -> subprocess.Popen[bytes]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.fencing_procs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )


async def _line(child: subprocess.Popen[bytes]) -> bytes:
    assert child.stdout is not None
    with anyio.fail_after(30):
        return await anyio.to_thread.run_sync(child.stdout.readline)


async def _eventually(check: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 -- polled: another process changes it
            await anyio.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGCONT)
        child.kill()
    child.wait(10)
    if child.stdout is not None:
        child.stdout.close()


@needs_redis
async def test_a_consumer_paused_past_its_lease_hands_out_nothing_after_it_resumes(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url("paused-consumer")
    creator = RedisStore(url, lease_ttl=2.0)
    await creator.open(["lead", "worker"])
    out = tmp_path / "handed-out"
    child = _child("consumer", url, str(out))
    view = creator.view()
    try:
        assert await _line(child) == b"holding\n"
        for i in range(3):
            await creator.append("worker", encode(Envelope.message("lead", "worker", i)))
        await _eventually(lambda: len(_lines(out)) == 3)
        child.send_signal(signal.SIGSTOP)
        # mail that reaches the stopped process's pending read: it is there when it resumes
        later = [Envelope.message("lead", "worker", f"later {i}") for i in range(5)]
        for envelope in later:
            await creator.append("worker", encode(envelope))
        await _eventually(lambda: view.holder("worker") is None)  # its lease lapsed
        async with Mailboxes(RedisStore(url)) as successor:
            inbox = await successor.open_inbox("worker")  # takes the lease over
            handled = [await inbox.receive(timeout=10) for _ in later]
            assert [e.id for e in handled] == [e.id for e in later]
            await inbox.ack(*handled)
            child.send_signal(signal.SIGCONT)
            assert await _line(child) == b"lost\n"
        assert len(_lines(out)) == 3  # nothing handed out after SIGCONT
    finally:
        _stop(child)
        view.close()
        await creator.close()


@needs_redis
async def test_a_teammate_paused_past_its_lease_runs_no_tool_call_and_starts_no_task(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url("paused-teammate")
    creator = RedisStore(url, lease_ttl=2.0)
    await creator.open(["lead", "worker"])
    out = tmp_path / "effects"
    child = _child("team", url, str(out))
    view = creator.view()
    try:
        assert await _line(child) == b"ready\n"
        tasks = [Envelope.request("lead", "worker", name, type="task") for name in ("slow", "next")]
        await creator.append_many("worker", [encode(task) for task in tasks])
        await _eventually(lambda: "waiting" in _lines(out))  # its model holds the process up
        child.send_signal(signal.SIGSTOP)
        await _eventually(lambda: view.holder("worker") is None)  # its lease lapsed
        async with Mailboxes(RedisStore(url)) as successor:
            await successor.open_inbox("worker")  # takes the lease over
            (tmp_path / "effects.go").touch()  # the model answers with a tool call once resumed
            child.send_signal(signal.SIGCONT)
            assert await _line(child) == b"lease lost\n"
        assert _lines(out) == ["model slow", "waiting"]  # no effect, and `next` never started
    finally:
        _stop(child)
        view.close()
        await creator.close()


@needs_redis
async def test_a_teammate_whose_lease_was_taken_mid_task_starts_no_further_task(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url("taken-mid-task")
    keys = TeamKeys("teamrt", parse_locator(url).team)
    client: Any = redis.Redis(port=redis_server.port, protocol=2)
    shown: list[str] = []
    async with Mailboxes(RedisStore(url), members=["lead", "worker"]) as successor:

        async def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
            task = task_of(messages)
            shown.append(task)
            if task == "first":  # meanwhile the lease lapsed and another process took it
                client.delete(keys.lease("worker"))
                await successor.open_inbox("worker")
            return f"done {task}"

        tasks = [Envelope.request("lead", "worker", t, type="task") for t in ("first", "second")]
        for task in tasks:  # both waiting at the start: the desk has both at once
            await successor.send(task)
        try:
            async with (
                Mailboxes(RedisStore(url, lease_ttl=2.0)) as mail,
                Team(mail, [Teammate("worker", FunctionModel(brain))]) as team,
            ):
                status = team.status["worker"]
                with anyio.fail_after(30):
                    while status.last != "lease lost":  # noqa: ASYNC110 -- polled
                        await anyio.sleep(0.02)
        finally:
            client.close()
    assert shown == ["first"]  # the second task was never started


@needs_redis
async def test_a_tool_sees_the_fencing_token_and_it_grows_with_each_incarnation(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url("fence-grows")
    seen: list[int | None] = []

    @tool
    def effect() -> str:
        """Write somewhere, carrying the fencing token."""
        seen.append(current_fence())
        return "written"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("effect")

    for _ in range(2):  # two processes' worth of the team, one after the other
        async with (
            Mailboxes(RedisStore(url), members=["lead", "worker"]) as mail,
            Team(mail, [Teammate("worker", FunctionModel(brain), tools=[effect])]) as team,
        ):
            await team.ask("worker", "write", timeout=30)
    assert seen[0] is not None and seen[1] is not None
    assert seen[1] > seen[0] > 0
    assert current_fence() is None  # outside a tool


async def test_a_file_lease_cannot_be_taken_from_a_paused_process_while_it_lives(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "worker"]):
        pass
    holder = _child("hold", str(team), "-")
    try:
        assert await _line(holder) == b"holding\n"
        holder.send_signal(signal.SIGSTOP)  # an flock has no time limit: paused, it still holds
        for _ in range(2):
            taker = _child("take", str(team), "-")
            try:
                told = await _line(taker)
            finally:
                _stop(taker)
            assert told.startswith(b"busy") and b"already running" in told
        holder.kill()  # the flock dies with its process, and only then
        holder.wait(10)
        taker = _child("take", str(team), "-")
        try:
            assert await _line(taker) == b"took\n"
        finally:
            _stop(taker)
    finally:
        _stop(holder)


async def _consume(
    url: str, *, plain: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], int]:
    """Send 60 messages in bursts and receive them all; the bodies received, in order, and the
    round trips the read fence made (`plain`: the fence's plain path, a check every time)."""
    with monkeypatch.context() as patch:
        if plain:
            patch.setattr(Inbox, "_fenced", lambda self: False)
        store = RedisStore(url)
        checks = 0
        confirm = store.confirm_lease

        async def counted(record: LeaseRecord) -> None:
            nonlocal checks
            checks += 1
            await confirm(record)

        patch.setattr(store, "confirm_lease", counted)
        got: list[Any] = []
        async with Mailboxes(store, members=["lead", "worker"]) as mail:
            inbox = await mail.open_inbox("worker")
            for burst in range(6):
                for i in range(10):
                    await mail.send(Envelope.message("lead", "worker", [burst, i]))
                for _ in range(10):
                    envelope = await inbox.receive(timeout=10)
                    got.append(envelope.body)
                    await inbox.ack(envelope)
        return got, checks


@needs_redis
async def test_the_read_fences_fast_path_hands_out_what_its_plain_path_does(
    shared_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, fast_checks = await _consume(shared_redis.url("fence-fast"), plain=False,
                                       monkeypatch=monkeypatch)  # fmt: skip
    plain, plain_checks = await _consume(shared_redis.url("fence-plain"), plain=True,
                                         monkeypatch=monkeypatch)  # fmt: skip
    assert fast == plain == [[b, i] for b in range(6) for i in range(10)]
    assert plain_checks >= 60  # one round trip per envelope handed out
    assert fast_checks < plain_checks


@needs_redis
@pytest.mark.parametrize("plain", [False, True])
async def test_mail_already_buffered_is_not_handed_out_once_the_lease_is_lost(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, plain: bool
) -> None:
    url = redis_server.url("buffered")
    keys = TeamKeys("teamrt", parse_locator(url).team)
    client: Any = redis.Redis(port=redis_server.port, protocol=2)
    if plain:
        monkeypatch.setattr(Inbox, "_fenced", lambda self: False)
    try:
        async with Mailboxes(RedisStore(url), members=["lead", "worker"]) as mail:
            inbox = await mail.open_inbox("worker")
            for i in range(3):
                await mail.send(Envelope.message("lead", "worker", i))  # read at once, locally
            assert inbox._reading.has_new()  # waiting in the reader's buffer
            record = mail.store.lease_record("worker")
            assert record is not None
            # a pause past the time limit: the lease lapsed and was taken, and this process
            # has not renewed since (its local flag still says held)
            record.valid_until = -math.inf
            client.delete(keys.lease("worker"))
            async with Mailboxes(RedisStore(url)) as successor:
                await successor.open_inbox("worker")
                assert not record.expired
                with pytest.raises(WouldBlock):
                    inbox.receive_nowait()  # it cannot tell without asking: nothing
                assert inbox.receive_batch_nowait() == []
                with pytest.raises(LeaseLost, match="fence 1"):
                    await inbox.receive(timeout=5)
                assert record.expired
                with pytest.raises(LeaseLost):
                    inbox.receive_nowait()
    finally:
        client.close()


def fence_in_a_process() -> int | None:
    """A `process=True` tool: what `current_fence()` says in its worker process."""
    return current_fence()


async def test_a_tool_in_a_worker_process_sees_the_fencing_token() -> None:
    box = Toolbox([tool(process=True)(fence_in_a_process)])
    tool_call = ToolCall(id="c1", name="fence_in_a_process", arguments="{}")
    token = _current_fence.set(7)
    try:
        result = await box.run(tool_call)
    finally:
        _current_fence.reset(token)
    assert result.ok
    assert result.content == "7"


@needs_redis
async def test_a_fence_check_waits_out_a_store_outage_instead_of_failing(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url("fence-outage"), socket_timeout=0.3, connect_timeout=0.3)
    failed = anyio.Event()
    confirm = store.confirm_lease

    async def watched(record: LeaseRecord) -> None:
        try:
            await confirm(record)
        except StoreError:
            failed.set()
            raise

    async with Mailboxes(store, members=["lead", "worker"]) as mail:
        await mail.open_inbox("worker")
        fence = store.fence("worker")
        store.confirm_lease = watched  # type: ignore[method-assign]
        checked = anyio.Event()

        async def check() -> None:
            await fence.check()
            checked.set()

        async with anyio.create_task_group() as tg:
            with redis_server.outage():
                tg.start_soon(check)
                with anyio.fail_after(30):
                    await failed.wait()  # the server did not answer: the check goes on
                assert not checked.is_set()
            with anyio.fail_after(30):
                await checked.wait()  # answered once the server is back: the lease is held

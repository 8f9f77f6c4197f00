"""Cancelling one task: a cancelled `ask` (or `team.withdraw`) drops its task if it is queued (it
never reaches the model) and stops it at its next step boundary if it runs (answered
`cancelled`, and the journal says so), on every store. A running task's tool in flight is
cancelled, as at a deadline."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes, MemoryMailboxes
from teamrt.errors import RequestTimeout
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore
from teamrt.team import Team
from tests.support.redis_server import RedisServer, needs_redis, shared_redis
from tests.team.helpers import Worker, cancelled_answers, until

__all__ = ["shared_redis"]  # the fixture
Store = Callable[[], AbstractAsyncContextManager[Mailboxes]]


@pytest.fixture(params=["memory", "files", pytest.param("redis", marks=needs_redis)])
def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[], AbstractAsyncContextManager[Mailboxes]]:
    """Opens the team's mailboxes on each store."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Mailboxes]:
        members = ["lead", "w"]
        if request.param == "memory":
            async with MemoryMailboxes(members=members) as mail:
                yield mail
        elif request.param == "files":
            async with FileMailboxes(tmp_path / "t", members=members) as mail:
                yield mail
        else:
            server: RedisServer = request.getfixturevalue("shared_redis")
            url = server.url(f"cancel-{tmp_path.name}"[:60].replace(".", "-"))
            async with Mailboxes(RedisStore(url), members=members) as mail:
                yield mail

    return opened


def journal(tmp_path: Path) -> list[dict[str, object]]:
    """The teammate's journal records, the previous task's file (kept at a new task) first."""
    records = []
    for name in ("w.state.prev.jsonl", "w.state.jsonl"):
        path = tmp_path / "agents" / name
        if path.exists():
            records += [json.loads(line) for line in path.read_text().splitlines()]
    return records


async def test_cancelling_an_ask_drops_its_queued_task(store: Store, tmp_path: Path) -> None:
    worker = Worker()
    agents = tmp_path / "agents"
    async with store() as mail, Team(mail, [worker.teammate], agent_dir=agents) as team:
        second = anyio.CancelScope()

        async def ask_second() -> None:
            with second:
                await team.ask("w", "second", timeout=60)

        async with anyio.create_task_group() as tg:
            tg.start_soon(team.ask, "w", "hold")
            await worker.holding.wait()
            tg.start_soon(ask_second)
            await until(lambda: team.status["w"].queued == 1)
            second.cancel()
            await until(lambda: team.status["w"].queued == 0)
            worker.gate.set()
            await until(lambda: bool(cancelled_answers(team)))
            [dropped] = cancelled_answers(team)
            assert dropped.steps == 0 and "never ran" in dropped.detail
            assert (await team.ask("w", "third", timeout=60)).answer == "done: third"
    assert "second" not in worker.calls
    incidents = [r["detail"] for r in journal(tmp_path) if r["t"] == "withdrawn"]
    assert len(incidents) == 1 and "never ran" in str(incidents[0])


async def test_cancelling_an_ask_stops_its_running_task_cutting_its_tool_short(
    store: Store, tmp_path: Path
) -> None:
    worker = Worker()
    agents = tmp_path / "agents"
    async with store() as mail, Team(mail, [worker.teammate], agent_dir=agents) as team:
        async with anyio.create_task_group() as tg:
            tg.start_soon(team.ask, "w", "hold")
            await worker.holding.wait()  # in its tool, during its first step
            tg.cancel_scope.cancel()
        await until(lambda: bool(cancelled_answers(team)))  # the gate never opens
        [stopped] = cancelled_answers(team)
        assert (await team.ask("w", "next", timeout=60)).answer == "done: next"
    assert stopped.steps == 1 and "tools in flight were cut short" in stopped.detail
    assert worker.calls == ["hold", "next"]  # no model call after the withdrawal
    stops = [r["stop"] for r in journal(tmp_path) if r["t"] == "stop"]
    assert [s["reason"] for s in stops] == ["cancelled", "answer"]  # type: ignore[index]


async def test_withdraw_drops_a_task_whose_ask_timed_out(store: Store, tmp_path: Path) -> None:
    worker = Worker()
    async with store() as mail, Team(mail, [worker.teammate]) as team:
        async with anyio.create_task_group() as tg:
            tg.start_soon(team.ask, "w", "hold")
            await worker.holding.wait()
            with pytest.raises(RequestTimeout) as info:
                await team.ask("w", "late", timeout=0.2)
            request = info.value.request
            await team.withdraw(request.id, member=request.recipient)
            await until(lambda: team.status["w"].queued == 0)
            worker.gate.set()
        await until(lambda: bool(cancelled_answers(team)))
        assert (await team.ask("w", "next", timeout=60)).answer == "done: next"
    assert worker.calls == ["hold", "hold", "next"]

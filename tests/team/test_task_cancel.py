"""Cancelling one task: a cancelled `ask` (or `team.withdraw`) drops its task if it is queued (it
never reaches the model) and stops it at its next step boundary if it runs (answered
`cancelled`, and the journal says so), on every store. A running task's tool in flight is
cancelled, as at a deadline."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes, MemoryMailboxes
from teamrt.agents import tool
from teamrt.envelopes import Envelope
from teamrt.errors import RequestTimeout
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import TaskResult, Team, Teammate
from tests.support.redis_server import RedisServer, needs_redis, shared_redis

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


class Worker:
    """A teammate whose task "hold" waits in a tool until `gate` opens; it records the tasks
    its model is given (first call of each) and the model calls of each."""

    def __init__(self) -> None:
        self.gate, self.holding = anyio.Event(), anyio.Event()
        self.calls: list[str] = []

        @tool
        async def wait_for_gate() -> str:
            """Wait."""
            self.holding.set()
            await self.gate.wait()
            return "open"

        def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
            task = next(m.content or "" for m in reversed(messages) if m.role == "user")
            self.calls.append(task)
            if task == "hold" and messages[-1].role == "user":
                return call("wait_for_gate")
            return f"done: {task}"

        self.teammate = Teammate("w", FunctionModel(brain), tools=[wait_for_gate])


async def until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 -- polled: the teammate's task decides
            await anyio.sleep(0.01)


_late_mail: dict[int, list[Envelope]] = {}


def lead_mail_so_far(team: Team) -> list[Envelope]:
    """Everything the lead's mail stream has brought (late answers arrive there), kept."""
    seen = _late_mail.setdefault(id(team), [])
    seen.extend(team.lead_mail_nowait())
    return seen


def cancelled_answers(team: Team) -> list[TaskResult]:
    return [
        TaskResult.model_validate(e.body)
        for e in lead_mail_so_far(team)
        if e.kind == "response"
        and isinstance(e.body, dict)
        and e.body.get("stop_reason") == "cancelled"
    ]


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

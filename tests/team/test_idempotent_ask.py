"""Idempotent asks: `team.ask(..., key=)` never runs a task twice for one key, from any process
(a lead restarted after kill -9 included), on files and on Redis, and returns the first
outcome."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from teamrt.envelopes import Envelope
from teamrt.errors import MemberBusy, RemoteError, UsageError
from teamrt.mail import MemoryMailboxes
from teamrt.mail.locator import open_mailboxes
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore
from teamrt.models import ChatMessage, FunctionModel, ToolSpec
from teamrt.team import Team, Teammate
from teamrt.team.lead import keyed_id
from tests.support.redis_server import RedisServer, needs_redis, redis_server
from tests.team.helpers import kill, slow_w, spawn_lead

__all__ = ["redis_server"]  # the fixture


def counting(calls: list[str], answer: str = "done") -> Teammate:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        calls.append(messages[-1].content or "")
        return answer

    return Teammate("w", FunctionModel(brain))


async def test_a_second_ask_with_the_same_key_returns_the_first_outcome() -> None:
    calls: list[str] = []
    async with MemoryMailboxes() as mail, Team(mail, [counting(calls)]) as team:
        first = await team.ask("w", "charge the card", timeout=30, key="order-1")
        again = await team.ask("w", "charge the card", timeout=30, key="order-1")
        other = await team.ask("w", "charge the card", timeout=30, key="order-2")
    assert first == again and other.answer == "done"
    assert len(calls) == 2  # order-1 once, order-2 once


async def test_two_asks_with_one_key_at_once_run_the_task_once() -> None:
    calls: list[str] = []
    results = []
    async with MemoryMailboxes() as mail, Team(mail, [counting(calls)]) as team:

        async def ask() -> None:
            results.append(await team.ask("w", "charge the card", timeout=30, key="order-1"))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(ask)
    assert len(calls) == 1
    assert len(results) == 3 and results[0] == results[1] == results[2]


async def test_a_key_reused_for_another_ask_is_refused() -> None:
    async with MemoryMailboxes() as mail, Team(mail, [counting([])]) as team:
        await team.ask("w", "charge the card", timeout=30, key="order-1")
        with pytest.raises(UsageError, match=r"order-1.*was used for another ask"):
            await team.ask("w", "refund the card", timeout=30, key="order-1")


async def test_an_error_outcome_is_the_outcome_of_every_retry() -> None:
    """A key whose ask was refused stays refused (a new ask needs a new key)."""
    async with MemoryMailboxes(members=["lead", "w"]) as mail, Team(mail, [counting([])]) as team:
        # the record as a refusal (w's queue was full) leaves it
        request = Envelope.request("lead", "w", "charge it", type="task")
        request = request.model_copy(update={"id": keyed_id(mail.team, "lead", "k")})
        refusal = Envelope.error(request, "Busy", "w's queue is full")
        record = {"key": "k", "member": "w", "text": "charge it"}
        await mail.store.task_record_create(request.id, record)
        await mail.store.task_record_settle(request.id, refusal.model_dump(mode="json"))
        for _ in range(2):
            with pytest.raises(RemoteError, match="queue is full") as caught:
                await team.ask("w", "charge it", timeout=30, key="k")
            assert caught.value.error_type == "Busy"


async def test_an_ask_whose_caller_died_before_the_send_runs_once_on_retry() -> None:
    """The record was written and the request never sent: the retry sends it."""
    calls: list[str] = []
    async with MemoryMailboxes() as mail, Team(mail, [counting(calls)]) as team:
        request_id = keyed_id(mail.team, "lead", "k")
        record = {"key": "k", "member": "w", "text": "charge it", "request": {}}
        await mail.store.task_record_create(request_id, record)
        result = await team.ask("w", "charge it", timeout=30, key="k")
        assert (await team.ask("w", "charge it", timeout=30, key="k")) == result
    assert calls == ["charge it"]


# --- a lead killed while its keyed ask waits, retried by its successor ----------------------


@asynccontextmanager
async def successor_lead(locator: str) -> AsyncIterator[Team]:
    """A lead Team on `locator`, once the killed lead's lease is gone (on Redis it expires)."""
    async with open_mailboxes(locator) as mail:
        while True:
            try:
                async with Team(mail, [], remote=["w"]) as team:
                    yield team
                    return
            except MemberBusy:
                await anyio.sleep(0.05)


async def retried_after_a_kill(mail: Mailboxes, locator: str, out: Path) -> list[str]:
    """The ask of a lead killed while w works on it, retried by a successor: w's calls."""
    started, release = anyio.Event(), anyio.Event()
    calls: list[str] = []
    async with Team(mail, [slow_w(started, release, calls)], lead_here=False):
        lead = spawn_lead(locator, out, "answer-1")
        with anyio.fail_after(30):
            await started.wait()
        kill(lead)
        async with successor_lead(locator) as successor:
            release.set()  # answered to the dead lead's inbox, maybe before the retry
            result = await successor.ask("w", "what is the answer?", timeout=30, key="answer-1")
            again = await successor.ask("w", "what is the answer?", timeout=30, key="answer-1")
        assert result.answer == again.answer == "forty-two"
    assert not out.exists()
    return calls


async def test_a_keyed_ask_retried_after_a_kill_of_the_lead_runs_once_on_files(
    tmp_path: Path,
) -> None:
    locator = str(tmp_path / "t")
    async with open_mailboxes(locator, members=["lead", "w"]) as mail:
        calls = await retried_after_a_kill(mail, locator, tmp_path / "answer")
    assert calls == ["what is the answer?"]


@needs_redis
async def test_a_keyed_ask_retried_after_a_kill_of_the_lead_runs_once_on_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    locator = redis_server.url("idem")
    async with Mailboxes(RedisStore(locator, lease_ttl=2.0), members=["lead", "w"]) as mail:
        calls = await retried_after_a_kill(mail, locator, tmp_path / "answer")
    assert calls == ["what is the answer?"]

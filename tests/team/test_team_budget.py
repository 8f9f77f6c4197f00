"""The team's budget holds as a brake in every process and on every store: a model call that
would start after the spend that exhausted the budget is recorded is refused, even when the
member checked before that spend landed; and spend charged before the team publishes its
ledger counts for every member, a remote one too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes, MemoryMailboxes
from teamrt.agents import Agent, AgentState
from teamrt.errors import LimitExceeded
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage
from teamrt.team import Team, TeamBudget
from tests.support.redis_server import RedisServer, shared_redis
from tests.support.remote import exit_code, run_agent, until_running

__all__ = ["shared_redis"]  # the fixture

STORES = ["files", "memory", "redis"]


@pytest.fixture(params=STORES)
def mail(request: pytest.FixtureRequest, tmp_path: Path) -> Mailboxes:
    """Mailboxes of a team of lead, a and b on each store (not open yet)."""
    members = ["lead", "a", "b"]
    if request.param == "files":
        return FileMailboxes(tmp_path / "t", members=members)
    if request.param == "memory":
        return MemoryMailboxes(members=members)
    server: RedisServer = request.getfixturevalue("shared_redis")
    return Mailboxes(RedisStore(server.url()), members=members)


def _spending(tokens: int, calls: list[int]) -> FunctionModel:
    def reply(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        calls.append(1)
        return ModelReply(text="done", usage=Usage(requests=1, input_tokens=tokens))

    return FunctionModel(reply)


async def test_a_call_that_would_start_after_the_last_tokens_were_spent_is_refused(
    mail: Mailboxes,
) -> None:
    async with mail:
        await _race(mail)


async def _race(mail: Mailboxes) -> None:
    await TeamBudget(max_tokens=100).publish(mail.store)  # the lead's ledger
    a_calls: list[int] = []
    b_calls: list[int] = []
    a_spent = anyio.Event()

    async def b_waits_for_a(state: AgentState) -> list[ChatMessage]:
        await a_spent.wait()  # b checked the budget before a's spend: it was not spent then
        return []

    # two members, each with its own view of the team's ledger (as in two processes)
    a = Agent("a", _spending(150, a_calls), budget=await TeamBudget.follow(mail.store))
    b = Agent(
        "b",
        _spending(150, b_calls),
        budget=await TeamBudget.follow(mail.store),
        on_step=b_waits_for_a,
    )
    async with anyio.create_task_group() as tg:

        async def run_a() -> None:
            await a.run("spend")
            a_spent.set()

        tg.start_soon(run_a)
        report = await b.run("spend too")
    assert a_calls == [1]
    assert b_calls == []  # refused: the spend was recorded before its call would start
    assert report.stop.reason == "limit" and "team_max_tokens=100" in report.stop.detail
    follower = await TeamBudget.follow(mail.store)
    assert follower.usage.total_tokens == 150  # b charged nothing


async def test_spend_charged_before_the_ledger_is_published_counts_for_every_member(
    mail: Mailboxes,
) -> None:
    budget = TeamBudget(max_tokens=100)
    await budget.charge(Usage(requests=1, input_tokens=120), None)  # before any team
    async with mail, Team(mail, [], budget=budget):
        member = await TeamBudget.follow(mail.store)  # another process's view
        assert member.usage.total_tokens == 120
        with pytest.raises(LimitExceeded, match="team_max_tokens"):
            await member.check()


async def test_a_remote_member_is_refused_a_budget_spent_before_publishing(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "spender")
        await until_running(mail, proc)
        budget = TeamBudget(max_tokens=1_000)
        await budget.charge(Usage(requests=7, input_tokens=1_000), None)  # spent by earlier work
        async with Team(mail, [], remote=["w"], budget=budget) as lead:
            with anyio.fail_after(30):
                result = await lead.ask("w", "think", timeout=60)
        code, _ = await exit_code(proc)
    assert result.stop_reason == "limit" and "team_max_tokens=1000" in result.detail
    assert budget.usage.total_tokens == 1_000  # the remote member made no call
    assert code == 0

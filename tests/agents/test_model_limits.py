"""The agent's side of real models: truncated replies, time spent on the model, retries in the
report, and cost budgets that hold for any model name."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from teamrt import MemoryMailboxes
from teamrt.agents import Agent, Limits
from teamrt.agents.limits import PRICES, cost_of, prices_from_env
from teamrt.errors import ModelError, UsageError
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, Usage
from teamrt.team import Team, TeamBudget, Teammate


def cut(text: str) -> ModelReply:
    return ModelReply(text=text, finish_reason="length")


async def test_a_truncated_reply_is_continued_once_then_joined() -> None:
    model = ScriptedModel([cut("The loop calls the model, "), "then runs the tools."])
    report = await Agent("a", model).run("explain")
    assert report.ok and report.answer == "The loop calls the model, then runs the tools."
    assert "cut off by the output length limit" in (model.calls[1][-1].content or "")


async def test_a_reply_truncated_twice_stops_as_truncated_with_the_partial_text() -> None:
    report = await Agent("a", ScriptedModel([cut("one, "), cut("two, "), "never"])).run("count")
    assert (report.stop.reason, report.answer, report.partial) == ("truncated", None, "one, two, ")


async def test_a_model_call_past_its_timeout_stops_the_run() -> None:
    async def hung(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(30)
        return "late"

    with anyio.fail_after(5):
        report = await Agent("a", FunctionModel(hung), limits=Limits(model_timeout=0.05)).run("x")
    assert report.stop.limit == "model_timeout"
    assert report.model_time >= 0.05


async def test_the_time_spent_on_the_model_has_a_limit_per_run() -> None:
    from teamrt.models import call

    async def slow(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        await anyio.sleep(0.03)
        return call("note", text=str(len(messages)))

    def note(text: str) -> str:
        """Note."""
        return text

    limits = Limits(max_model_time=0.05, max_repeats=100, max_stale_steps=100)
    report = await Agent("a", FunctionModel(slow), tools=[note], limits=limits).run("x")
    assert report.stop.limit == "max_model_time" and report.steps >= 1
    assert report.model_time <= 0.05 + 0.03  # the last call was cut where the time ran out


async def test_retries_and_rate_limits_are_counted_in_the_report() -> None:
    replies = [ModelReply(text="ok", attempts=3, rate_limited=2)]
    report = await Agent("a", ScriptedModel(replies)).run("x")
    assert (report.attempts, report.retries, report.rate_limited) == (3, 2, 2)
    assert "2 retries (2 rate limited)" in report.summary()

    def refuse(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        error = ModelError("HTTP 429 after 5 attempts", status=429, attempts=5)
        error.__dict__["rate_limited"] = 5  # what the adapter counts: 429 answers
        raise error

    stopped = await Agent("a", FunctionModel(refuse)).run("x")
    assert stopped.stop.reason == "model_error"
    assert "5 of 5 attempts were rate limited" in stopped.stop.detail
    assert stopped.rate_limited == 5


async def test_usage_the_server_did_not_send_is_marked_estimated() -> None:
    estimated = ModelReply(text="ok", usage=Usage(requests=1, input_tokens=9), usage_estimated=True)
    report = await Agent("a", FunctionModel(lambda m, t: estimated)).run("x")
    assert report.usage_estimated
    assert f"{report.usage.total_tokens} (estimated) tokens" in report.summary()


def test_prices_for_dated_snapshots_and_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usage = Usage(input_tokens=1_000_000)
    assert cost_of(usage, "gpt-4o-2024-08-06", PRICES) == PRICES["gpt-4o"][0]
    assert cost_of(usage, "llama3.1:8b", PRICES) is None
    monkeypatch.setenv("TEAMRT_PRICES", '{"llama3.1:8b": [0.1, 0.2]}')
    assert prices_from_env() == {"llama3.1:8b": (0.1, 0.2)}
    monkeypatch.setenv("TEAMRT_PRICES", "llama=cheap")
    with pytest.raises(UsageError, match="TEAMRT_PRICES must be a JSON object"):
        prices_from_env()


async def test_a_team_cost_budget_refuses_an_unpriced_model_and_holds_with_a_price() -> None:
    def local(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        usage = Usage(requests=1, input_tokens=500_000, output_tokens=500_000)
        return ModelReply(text="an answer", usage=usage)

    def llama() -> FunctionModel:
        return FunctionModel(local, name="llama3.1:8b")

    with pytest.raises(UsageError, match=r"the team's cost budget .* 'llama3\.1:8b'"):
        Agent("a", llama(), budget=TeamBudget(max_cost=1.0))
    tokens_only = Agent("a", llama(), budget=TeamBudget(max_cost=1.0, unpriced="tokens"))
    assert (await tokens_only.run("x")).cost is None

    budget = TeamBudget(max_cost=1.0)
    async with MemoryMailboxes() as mail:
        team = Team(mail, [Teammate("w", llama)], budget=budget, prices={"llama3.1:8b": (1, 1)})
        async with team:
            first = await team.ask("w", "one", timeout=5)
            second = await team.ask("w", "two", timeout=5)
    assert first.cost == 1.0 and budget.cost == 1.0
    assert second.stop_reason == "limit" and "team_max_cost" in second.detail

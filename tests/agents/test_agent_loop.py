"""The agent loop: every stop reason with its report, nudges, resume, memory, files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt.agents import Agent, Limits, Memory, RunReport, Tool, tool
from teamrt.agents.loop import Answer, CallTools, Malformed, decide
from teamrt.agents.memory import SUMMARY_PREFIX, context_tokens
from teamrt.errors import ModelError, ToolCrashed, UsageError
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    ScriptedModel,
    ToolSpec,
    Usage,
    call,
    calls,
    reply,
)

STOCK = {"EARBUDS": 14, "CABLE": 3}


@tool
def check_stock(sku: str) -> dict[str, int | str]:
    """How many of a SKU are in stock."""
    if sku not in STOCK:
        raise KeyError(f"unknown sku {sku}")
    return {"sku": sku, "quantity": STOCK[sku]}


@tool
def echo(i: int) -> dict[str, int]:
    """Echo a number."""
    return {"i": i}


@tool
def constant(i: int) -> str:
    """Always says the same."""
    return "nothing new"


def agent(
    script: Sequence[ModelReply | str],
    *,
    tools: Sequence[Tool] = (check_stock, echo, constant),
    **kwargs: Any,
) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    return Agent("clerk", model, instructions="You check stock.", tools=tools, **kwargs), model


def test_decide_is_pure() -> None:
    assert decide(reply("done")) == Answer("done")
    assert isinstance(decide(call("echo", i=1)), CallTools)
    assert decide(ModelReply(text="  ")) == Malformed("it had neither text nor a tool call")
    assert "not valid JSON" in decide(call("echo", "{i: 1")).reason  # type: ignore[union-attr]
    assert "not a JSON object" in decide(call("echo", "[1]")).reason  # type: ignore[union-attr]
    both = ModelReply(text="thinking", tool_calls=call("echo", i=1).tool_calls)
    assert isinstance(decide(both), CallTools)


async def test_answer_after_tools_with_errors_as_data() -> None:
    clerk, model = agent(
        [
            call("check_stock", sku="EARBUDS"),
            call("check_stock", sku="NOPE"),
            call("check_stock", skew="CABLE"),
            "14 earbuds; NOPE is not a SKU.",
        ]
    )
    report = await clerk.run("How many earbuds? And NOPE?")
    model.assert_done()
    assert report.ok and report.answer == "14 earbuds; NOPE is not a SKU."
    assert (report.steps, report.tool_calls, report.tool_errors) == (4, 3, 2)
    assert report.usage.requests == 4 and report.usage.input_tokens > 0
    assert report.cost == 0.0
    assert clerk.state is not None
    results = [m.content or "" for m in clerk.state.messages if m.role == "tool"]
    assert json.loads(results[1]) == {"error": "KeyError: 'unknown sku NOPE'"}
    assert "sku: Field required" in results[2]
    # the model saw each tool's schema and the error results, in order
    assert model.calls[3][-1].content == results[2]


async def test_max_steps_reports_partial_work() -> None:
    clerk, _ = agent([call("echo", i=i) for i in range(10)], limits=Limits(max_steps=3))
    report = await clerk.run("count")
    assert (report.stop.reason, report.stop.limit, report.stop.value, report.stop.used) == (
        "limit",
        "max_steps",
        3,
        3,
    )
    assert report.stop.detail == "the next model call would exceed max_steps=3 (used 3)"
    assert report.answer is None and report.partial == '{"i": 2}'
    assert "stopped (limit)" in report.summary()


async def test_max_tool_calls_mid_reply_keeps_the_conversation_whole() -> None:
    clerk, _ = agent(
        [calls(*(call("echo", i=i) for i in range(5)))], limits=Limits(max_tool_calls=3)
    )
    report = await clerk.run("count")
    assert (report.stop.limit, report.tool_calls) == ("max_tool_calls", 3)
    results = [m for m in clerk.state.messages if m.role == "tool"]  # type: ignore[union-attr]
    assert len(results) == 5  # every call has a result, the last two "not run"
    assert "NotRun" in (results[4].content or "")


async def test_consecutive_errors() -> None:
    clerk, _ = agent(
        [call("check_stock", sku=f"BAD{i}") for i in range(5)],
        limits=Limits(max_consecutive_errors=3),
    )
    report = await clerk.run("find")
    assert (report.stop.limit, report.stop.used, report.tool_errors) == (
        "max_consecutive_errors",
        3,
        3,
    )
    assert "tool calls keep failing" in report.stop.detail


async def test_token_budget() -> None:
    script = [
        ModelReply(
            tool_calls=call("echo", i=i).tool_calls, usage=Usage(requests=1, output_tokens=400)
        )
        for i in range(5)
    ]
    clerk, _ = agent(script, limits=Limits(max_tokens=1000))
    report = await clerk.run("count")
    assert (report.stop.limit, report.steps) == ("max_tokens", 3)
    assert report.usage.total_tokens >= 1000


async def test_cost_budget_needs_and_uses_prices() -> None:
    with pytest.raises(UsageError, match="cannot be kept with model 'mystery', which has no price"):
        Agent("a", ScriptedModel([], name="mystery"), limits=Limits(max_cost=1.0))
    script = [
        ModelReply(
            tool_calls=call("echo", i=i).tool_calls, usage=Usage(requests=1, output_tokens=100_000)
        )
        for i in range(5)
    ]
    model = ScriptedModel(script, name="pricey")
    clerk = Agent(
        "a", model, tools=[echo], limits=Limits(max_cost=0.25), prices={"pricey": (0.0, 1.0)}
    )  # $1 per million output tokens
    report = await clerk.run("spend")
    assert (report.stop.limit, report.steps) == ("max_cost", 3)
    assert report.cost == pytest.approx(0.3)
    unpriced = await Agent("b", ScriptedModel(["hi"], name="unpriced")).run("x")
    assert unpriced.cost is None and "cost unknown" in unpriced.summary()


async def test_deadline_with_a_clock() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 4.0  # every look at the clock: 4 s later
        return now[0]

    clerk, _ = agent(
        [call("echo", i=i) for i in range(10)], limits=Limits(deadline=10), clock=clock
    )
    report = await clerk.run("slowly")
    assert report.stop.limit == "deadline" and report.steps < 10


async def test_deadline_interrupts_a_hung_model() -> None:
    async def hang(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(30)
        return "too late"

    report = await Agent("a", FunctionModel(hang), limits=Limits(deadline=0.05)).run("x")
    assert report.stop.limit == "deadline"
    assert "passed during a model call" in report.stop.detail


async def test_same_call_repeated_is_no_progress() -> None:
    clerk, _ = agent([call("check_stock", sku="CABLE")] * 5, limits=Limits(max_repeats=2))
    report = await clerk.run("check")
    assert (report.stop.limit, report.tool_calls) == ("max_repeats", 2)
    assert 'check_stock({"sku": "CABLE"}) was already called' in report.stop.detail


async def test_steps_that_bring_nothing_new() -> None:
    clerk, _ = agent([call("constant", i=i) for i in range(10)], limits=Limits(max_stale_steps=3))
    report = await clerk.run("look")
    assert (report.stop.limit, report.steps) == ("max_stale_steps", 4)


async def test_malformed_reply_nudged_once_then_recovers() -> None:
    clerk, model = agent([call("echo", "{i: oops"), call("echo", i=1), "fine"])
    report = await clerk.run("go")
    assert report.ok and report.steps == 3
    nudge = model.calls[1][-1]
    assert nudge.role == "user" and "could not be used" in (nudge.content or "")
    assert "MalformedToolCall" in (model.calls[1][-2].content or "")


async def test_malformed_twice_stops_cleanly() -> None:
    clerk, _ = agent([call("echo", "{bad"), ModelReply(text="")])
    report = await clerk.run("go")
    assert report.stop.reason == "malformed_reply"
    assert "neither text nor a tool call" in report.stop.detail


async def test_model_errors_stop_with_a_report() -> None:
    clerk, _ = agent([call("echo", i=1)])  # the script ends too early
    report = await clerk.run("go")
    assert report.stop.reason == "model_error"
    assert "called a 2th time, but the script has 1 replies" in report.stop.detail

    def broken(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise ModelError("HTTP 500: upstream broke", status=500)

    report = await Agent("a", FunctionModel(broken)).run("x")
    assert (report.stop.reason, report.steps) == ("model_error", 0)


class Crash(BaseException):
    """Stands for the process dying in the middle of a step."""


async def test_resumed_run_ends_as_the_uninterrupted_run(tmp_path: Path) -> None:
    script: list[ModelReply | str] = [
        call("echo", i=0),
        call("check_stock", sku="CABLE"),
        call("echo", i=2),
        call("check_stock", sku="X"),
        "all checked",
    ]
    whole, _ = agent(script, directory=tmp_path / "whole")
    expected = await whole.run("check things")

    crashed = {"now": False}

    @tool(name="check_stock")
    def check_stock_then_die(sku: str) -> dict[str, int | str]:
        """Like check_stock, but the process dies the first time it is asked for X."""
        if sku == "X" and not crashed["now"]:
            crashed["now"] = True
            raise Crash
        return check_stock.fn(sku)  # type: ignore[no-any-return]

    flaky = check_stock_then_die
    first, _ = agent(script, directory=tmp_path / "run", tools=[flaky, echo])
    with pytest.raises(ToolCrashed) as died:  # a BaseException is a crash, not data
        await first.run("check things")
    assert isinstance(died.value.__cause__, Crash)
    # a new process: the reply of the interrupted step is in the journal, so its tool call runs
    # again (with the same call id) and the model is asked only for what comes after
    second, model = agent(script[4:], directory=tmp_path / "run", tools=[flaky, echo])
    resumed = await second.run("check things", resume=True)
    model.assert_done()
    for field in ("stop", "answer", "steps", "tool_calls", "tool_errors"):
        assert getattr(resumed, field) == getattr(expected, field), field
    assert second.state is not None and whole.state is not None
    assert [m.content for m in second.state.messages] == [m.content for m in whole.state.messages]
    assert await second.resume() == resumed.model_copy(update={"elapsed": resumed.elapsed})


async def test_journal_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    clerk, _ = agent([call("echo", i=0), call("echo", i=1), "ok"], directory=tmp_path)
    await clerk.run("go")
    path = tmp_path / "clerk.state.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-2]) + lines[-2][:25])  # stop record gone, a step torn
    again, _ = agent(["ok"], directory=tmp_path)
    report = await again.resume()
    assert report.ok and report.steps == 3  # steps 1-2 from the journal, the torn one again


async def test_memory_keeps_context_under_budget_and_task_pinned() -> None:
    @tool
    def fetch(page: int) -> str:
        """A long page."""
        return f"page {page}: " + "lorem ipsum " * 200

    budget = 1500
    script = [call("fetch", page=i) for i in range(12)] + ["the answer is 42"]
    model = ScriptedModel(script)
    clerk = Agent(
        "reader",
        model,
        instructions="Read pages.",
        tools=[fetch],
        memory=Memory(max_context_tokens=budget, keep_recent=4, used_result_chars=100),
    )
    report = await clerk.run("What is on the pages?")
    assert report.ok and report.answer == "the answer is 42"
    assert report.compactions > 0
    for sent in model.calls:
        assert sent[0].content == "Read pages." and sent[1].content == "What is on the pages?"
        # a tool result of ~600 tokens arrives each step; nothing older survives at full size
        assert context_tokens(sent) <= budget + 700
    last = model.calls[-1]
    assert any((m.content or "").startswith(SUMMARY_PREFIX) for m in last)
    summary = next(m.content for m in last if (m.content or "").startswith(SUMMARY_PREFIX))
    assert "Tools called: fetch" in (summary or "")
    for i, m in enumerate(last):  # tool results still follow the call they answer
        if m.role == "tool":
            assert last[i - 1].role in ("assistant", "tool")


async def test_memory_uses_a_summariser_model() -> None:
    @tool
    def fetch(page: int) -> str:
        """A long page."""
        return f"page {page} " + "lorem " * 400

    summariser = ScriptedModel(["They read pages 0-5."] * 10, name="summariser")
    clerk = Agent(
        "r",
        ScriptedModel([call("fetch", page=i) for i in range(8)] + ["done"]),
        tools=[fetch],
        memory=Memory(max_context_tokens=900, keep_recent=2, summariser=summariser),
    )
    report = await clerk.run("read")
    assert report.ok and summariser.calls
    assert any(m.content == f"{SUMMARY_PREFIX} They read pages 0-5." for m in clerk.state.messages)  # type: ignore[union-attr]


async def test_transcript_records_every_call(tmp_path: Path) -> None:
    clerk, _ = agent([call("echo", i=7), "seven"], transcript=tmp_path / "t.jsonl")
    await clerk.run("say seven")
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert [m["role"] for m in lines[0]["sent"]] == ["system", "user"]
    assert [m["role"] for m in lines[1]["sent"]] == ["assistant", "tool"]
    assert lines[1]["reply"]["text"] == "seven"


async def test_report_round_trips_as_json() -> None:
    clerk, _ = agent(["hello"])
    report = await clerk.run("hi")
    assert RunReport.model_validate_json(report.model_dump_json()) == report


async def test_deadline_cancels_a_hung_tool() -> None:
    @tool
    async def hang(i: int) -> str:
        """Never returns."""
        await anyio.sleep(30)
        return "too late"

    model = ScriptedModel([call("hang", i=1), "unreachable"])
    report = await Agent("a", model, tools=[hang], limits=Limits(deadline=0.05)).run("x")
    assert report.stop.limit == "deadline"
    assert "passed while hang ran" in report.stop.detail
    assert report.tool_calls == 1

"""The tool calls of one reply: concurrent (bounded), results in call order, `sequential=True`
tools alone, call ids as idempotency keys; a conversation kept across runs; the bench figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from teamrt.agents import Agent, current_call_id, tool
from teamrt.errors import ToolCrashed
from teamrt.models import ModelReply, ScriptedModel, call, calls


async def test_parallel_tool_calls_overlap_and_come_back_in_call_order() -> None:
    started = {"a": anyio.Event(), "b": anyio.Event()}

    @tool
    async def meet(me: str, other: str) -> str:
        """Wait until the other call has started too: only possible if both run at once."""
        started[me].set()
        await started[other].wait()
        return f"{me} met {other}"

    model = ScriptedModel(
        [calls(call("meet", me="a", other="b"), call("meet", me="b", other="a")), "ok"]
    )
    with anyio.fail_after(5):  # one after the other would wait forever
        report = await Agent("a", model, tools=[meet]).run("meet")
    assert report.ok
    results = [m.content for m in model.calls[1] if m.role == "tool"]
    assert results == ["a met b", "b met a"]  # call order, whatever finished first


async def test_a_sequential_tool_runs_alone_between_the_others() -> None:
    events: list[str] = []

    @tool
    async def work(i: int) -> str:
        """Concurrent work."""
        events.append(f"start {i}")
        await anyio.sleep(0.01 * (3 - i))
        events.append(f"end {i}")
        return str(i)

    @tool(sequential=True)
    def commit() -> str:
        """Must not overlap with anything."""
        events.append("commit")
        return "committed"

    script: list[ModelReply | str] = [
        calls(call("work", i=1), call("work", i=2), call("commit"), call("work", i=0)),
        "ok",
    ]
    report = await Agent("a", ScriptedModel(script), tools=[work, commit]).run("go")
    assert report.ok
    before, after = events[: events.index("commit")], events[events.index("commit") + 1 :]
    assert sorted(before) == ["end 1", "end 2", "start 1", "start 2"]
    assert after == ["start 0", "end 0"]


async def test_parallelism_is_bounded() -> None:
    running = peak = 0

    @tool
    async def busy(i: int) -> str:
        """Counts how many run at once."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.005)
        running -= 1
        return "ok"

    model = ScriptedModel([calls(*(call("busy", i=i) for i in range(10))), "done"])
    report = await Agent("a", model, tools=[busy], max_parallel_tools=3).run("go")
    assert report.ok and peak == 3


async def test_a_tool_sees_its_call_id_and_a_resumed_call_keeps_it(tmp_path: Path) -> None:
    seen: list[str | None] = []

    class Crash(BaseException):
        pass

    @tool
    def charge(amount: int) -> str:
        """A side effect keyed by the call id."""
        seen.append(current_call_id())
        if len(seen) == 1:
            raise Crash  # the process dies while the call is in flight
        return f"charged {amount}"

    script: list[ModelReply | str] = [call("charge", amount=5), "charged once"]
    first = Agent("a", ScriptedModel(script), tools=[charge], directory=tmp_path)
    with pytest.raises(ToolCrashed) as crashed:  # a BaseException is a crash, not data
        await first.run("charge 5")
    assert isinstance(crashed.value.__cause__, Crash)
    second = Agent("a", ScriptedModel(script[1:]), tools=[charge], directory=tmp_path)
    report = await second.run("charge 5", resume=True)
    assert report.answer == "charged once"
    assert seen[0] is not None and seen == [seen[0], seen[0]]  # same key both times
    assert current_call_id() is None


async def test_keep_context_carries_the_conversation_and_counts_per_task() -> None:
    model = ScriptedModel([call("note", text="x"), "first", "second"])

    @tool
    def note(text: str) -> str:
        """Note."""
        return text

    agent = Agent("a", model, tools=[note], keep_context=True, instructions="be brief")
    first = await agent.run("one")
    second = await agent.run("two")
    assert (first.answer, first.steps, second.answer, second.steps) == ("first", 2, "second", 1)
    roles = [m.role for m in model.calls[2]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    fresh = Agent("a", ScriptedModel(["a", "b"]))
    await fresh.run("one")
    await fresh.run("two")
    assert fresh.state is not None and [m.content for m in fresh.state.messages] == ["two", "b"]


@pytest.mark.stress
def test_bench_team_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "teamrt", "bench", "--only", "teamwork", "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    figures = {f["name"]: f for f in json.loads(result.stdout)["figures"]}
    for name in (
        "service, 20 concurrent requests, pool of 5, p50",
        "20 tool calls in one reply, 20 ms each",
        "lead after 1,000 asks: cursor file",
    ):
        assert figures[name]["value"] > 0 and figures[name]["baseline_value"] > 0

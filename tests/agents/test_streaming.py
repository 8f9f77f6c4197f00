"""Seeing a run as it happens: an agent's events, a teammate's task streamed to the lead (in this
process or from another), and the status text the live view shows."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes, MemoryMailboxes, RemoteError
from teamrt.agents import Agent, RunReport, ToolCallFinished, ToolCallStarted, tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, TextDelta, ToolSpec, call
from teamrt.team import ProgressBody, TaskResult, Team, Teammate
from tests.support.remote import exit_code, run_agent, until_running


@tool
def note(text: str) -> str:
    """Write a note."""
    return text


def look_then_say(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "the note says: " + (messages[-1].content or "")
    return call("note", text="inotify watches files")


async def test_an_agent_streams_text_tool_calls_and_its_report() -> None:
    agent = Agent("a", FunctionModel(look_then_say), tools=[note])
    async with agent.stream("what does the note say?") as events:
        seen = [event async for event in events]
    kinds = [type(e).__name__ for e in seen]
    assert kinds[:2] == ["ToolCallStarted", "ToolCallFinished"]
    assert isinstance(seen[-1], RunReport) and seen[-1].ok
    text = "".join(e.text for e in seen if isinstance(e, TextDelta))
    assert text == seen[-1].answer == "the note says: inotify watches files"
    assert sum(isinstance(e, TextDelta) for e in seen) > 1  # in pieces, as it was written
    finished = next(e for e in seen if isinstance(e, ToolCallFinished))
    assert (finished.name, finished.ok) == ("note", True)


async def test_leaving_an_agents_stream_early_cancels_the_run() -> None:
    started = anyio.Event()

    @tool
    async def slow() -> str:
        """Takes forever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    agent = Agent("a", FunctionModel(lambda m, t: call("slow")), tools=[slow])
    with anyio.fail_after(5):
        async with agent.stream("go") as events:
            async for event in events:
                if isinstance(event, ToolCallStarted):
                    break
    assert started.is_set()


async def test_a_teammates_task_streams_to_the_lead() -> None:
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [Teammate("w", FunctionModel(look_then_say), tools=[note])]) as team,
    ):
        async with team.stream("w", "what does the note say?", timeout=10) as events:
            seen = [event async for event in events]
        plain = await team.ask("w", "again?", timeout=10)  # not streamed: no progress
    progress = [e for e in seen if isinstance(e, ProgressBody)]
    assert [e.event for e in progress[:2]] == ["tool_call", "tool_result"]
    assert "".join(e.text for e in progress if e.event == "text") == (
        "the note says: inotify watches files"
    )
    assert isinstance(seen[-1], TaskResult) and seen[-1].answer == plain.answer
    assert not [n for n in team.notices if n.type == "task_progress"]


async def test_a_streamed_task_raises_the_errors_of_ask() -> None:
    def crash(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise RuntimeError("boom")

    async def consume(team: Team) -> None:
        async with team.stream("w", "crash", timeout=10) as events:
            async for _ in events:
                pass

    async with MemoryMailboxes() as mail, Team(mail, [Teammate("w", FunctionModel(crash))]) as team:
        with pytest.raises(RemoteError, match="TeammateCrashed"):
            await consume(team)


async def test_a_task_streams_from_a_teammate_in_another_process(tmp_path: Path) -> None:
    team_dir = tmp_path / "t"
    async with FileMailboxes(team_dir, members=["lead", "w"]) as mail:
        proc = run_agent(team_dir, "looker")
        await until_running(mail, proc)
        try:
            async with (
                Team(mail, [], remote=["w"]) as team,
                team.stream("w", "what does the note say?", timeout=20) as events,
            ):
                seen = [event async for event in events]
        finally:
            code, _ = await exit_code(proc)
    assert code == 0
    progress = [e for e in seen if isinstance(e, ProgressBody)]
    assert {"tool_call", "tool_result", "text"} <= {e.event for e in progress}
    assert isinstance(seen[-1], TaskResult)
    assert seen[-1].answer == "the note says: inotify watches files"


async def test_the_live_view_shows_what_a_streaming_teammate_writes() -> None:
    from teamrt.demos.live import live_view

    out = io.StringIO()
    writer = Teammate("w", FunctionModel(lambda m, t: "drafting the intro now"), stream=True)
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [writer]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: live_view(team, interval=0.01, out=out))
        await team.ask("w", "write", timeout=5)
        assert team.status["w"].text == "drafting the intro now"
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert "drafting the intro now" in out.getvalue()

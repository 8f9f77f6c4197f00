"""Trace ids: a task starts (or continues) a trace, and every envelope sent while handling it
carries the id, through sub-requests to other teammates and across processes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from teamrt import FileMailboxes
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.replay import Filter, select, timeline
from teamrt.team import Team, Teammate
from tests.support.remote import exit_code, run_agent, until_running


def asker(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "b said: " + (messages[-1].content or "")
    return call("request", to="b", text="what do you know?")


def knower(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "told the lead"
    return call("send_message", to="lead", text="FYI: someone asked me")


async def test_every_envelope_of_a_task_carries_its_trace(tmp_path: Path) -> None:
    team_dir = tmp_path / "t"
    members = [Teammate("a", FunctionModel(asker)), Teammate("b", FunctionModel(knower))]
    async with FileMailboxes(team_dir) as mail, Team(mail, members) as team:
        result = await team.ask("a", "ask b", timeout=10)
        other = await team.ask("b", "unrelated", timeout=10)
        continued = await team.ask("b", "part two", timeout=10, trace_id=result.trace_id)
    assert result.trace_id and other.trace_id and result.trace_id != other.trace_id
    assert continued.trace_id == result.trace_id
    traced = list(select(timeline(team_dir), Filter(trace=result.trace_id)))
    hops = {(e.sender, e.recipient, e.type) for e in traced}
    assert {
        ("lead", "a", "task"),  # the task
        ("a", "b", "request"),  # a's sub-request
        ("b", "lead", "text"),  # b's message while handling it
        ("b", "a", "task_result"),  # b's answer
        ("a", "lead", "task_result"),  # a's answer
    } <= hops
    untraced = [
        e for e in timeline(team_dir) if e.type in ("task", "task_result") and not e.trace_id
    ]
    assert untraced == []


async def test_a_trace_crosses_into_a_teammate_in_another_process(tmp_path: Path) -> None:
    team_dir = tmp_path / "t"
    async with FileMailboxes(team_dir, members=["lead", "w"]) as mail:
        proc = run_agent(team_dir, "looker")
        await until_running(mail, proc)
        try:
            async with Team(mail, [], remote=["w"]) as team:
                result = await team.ask("w", "look", timeout=20)
        finally:
            await exit_code(proc)
    traced = list(select(timeline(team_dir), Filter(trace=result.trace_id)))
    assert {(e.sender, e.type) for e in traced} >= {("lead", "task"), ("w", "task_result")}

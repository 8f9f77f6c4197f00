"""OpenTelemetry: spans for a team task, the agent run, each model and tool call and each
envelope sent, joined into one trace across processes through the envelopes' `traceparent`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from teamrt import FileMailboxes, MemoryMailboxes, telemetry
from teamrt.team import Team
from tests.support.paths import SUPPORT

CHILD = str(SUPPORT / "otel_child.py")


async def test_spans_for_a_task_follow_the_genai_conventions(
    exporter: InMemorySpanExporter,
) -> None:
    from tests.support.remote_specs import looker

    async with MemoryMailboxes() as mail, Team(mail, [looker]) as team:
        await team.ask("w", "look", timeout=10)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    task, agent = spans["task w"], spans["invoke_agent w"]
    chat, tool = spans["chat function"], spans["execute_tool note"]
    assert agent.parent is not None and agent.parent.span_id == task.context.span_id
    assert chat.attributes is not None and chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "function"
    assert "gen_ai.usage.input_tokens" in chat.attributes
    assert tool.attributes is not None and tool.attributes["gen_ai.tool.name"] == "note"
    sent, answered = spans["send task"], spans["send task_result"]
    assert task.parent is not None and task.parent.span_id == sent.context.span_id
    one_trace = {s.context.trace_id for s in (sent, task, agent, chat, tool, answered)}
    assert one_trace == {sent.context.trace_id}


async def test_a_trace_joins_spans_from_another_process(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    team_dir, out = tmp_path / "t", tmp_path / "spans.json"
    async with FileMailboxes(team_dir, members=["lead", "w"]) as mail:
        proc = subprocess.Popen([sys.executable, CHILD, str(team_dir), str(out)])  # noqa: ASYNC220
        try:
            deadline = time.monotonic() + 30
            while not Path(str(out) + ".ready").exists():
                assert proc.poll() is None and time.monotonic() < deadline
                await anyio.sleep(0.02)
            async with Team(mail, [], remote=["w"]) as team:
                result = await team.ask("w", "look", timeout=20)
            await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert result.answer == "the note says: inotify watches files"
    ours = {s.name: s for s in exporter.get_finished_spans()}
    sent = ours["send task"]
    theirs = json.loads(out.read_text())
    task = next(s for s in theirs if s["name"] == "task w")
    assert task["trace"] == format(sent.context.trace_id, "032x")
    assert task["parent"] == format(sent.context.span_id, "016x")
    names = {s["name"] for s in theirs if s["trace"] == task["trace"]}
    assert {"invoke_agent w", "chat function", "execute_tool note", "send task_result"} <= names


def test_off_it_makes_no_spans() -> None:
    assert not telemetry.enabled()
    with telemetry.span("nothing") as span:
        assert span is None
    assert telemetry.traceparent() is None


def test_the_commands_turn_telemetry_on_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from teamrt.cli.main import main

    anyio.run(_make_team, tmp_path / "t")
    monkeypatch.setenv("TEAMRT_OTEL", "1")
    try:
        assert main(["inspect", str(tmp_path / "t")]) == 0
        assert telemetry.enabled()
    finally:
        telemetry.disable()


async def _make_team(path: Path) -> None:
    async with FileMailboxes(path, members=["lead"]):
        pass

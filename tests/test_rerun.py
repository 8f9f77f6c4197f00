"""Deterministic re-runs against a recorded transcript find the first step that changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes, MemoryMailboxes
from teamrt.agents import Agent, tool
from teamrt.cli.main import main
from teamrt.demos import research_writer as demo
from teamrt.models import FunctionModel, ScriptedModel, call
from teamrt.rerun import rerun
from teamrt.team import Team, Teammate

SAMPLE = Path(__file__).parent.parent / "mailboxes" / "samples" / "research-writer"


@tool
def price(sku: str) -> dict[str, float]:
    """The price of a SKU."""
    return {"sku_price": {"A": 2.0, "B": 3.5}[sku]}


@tool
def new_price(sku: str) -> dict[str, float]:
    """The price of a SKU, after a change in the code."""
    return {"sku_price": {"A": 2.0, "B": 4.0}[sku]}


async def _record(directory: Path) -> None:
    model = ScriptedModel([call("price", sku="A"), call("price", sku="B"), "A is 2, B is 3.5"])
    agent = Agent("clerk", model, instructions="Quote prices.", tools=[price], directory=directory)
    assert (await agent.run("Price A and B.")).ok


async def test_an_unchanged_agent_reruns_the_same(tmp_path: Path) -> None:
    await _record(tmp_path)
    report, divergence, steps = await rerun(tmp_path, "clerk", [price], "Quote prices.")
    assert divergence is None and steps == 3
    assert report is not None and report.answer == "A is 2, B is 3.5"


async def test_a_changed_tool_is_found_at_the_step_that_saw_it(tmp_path: Path) -> None:
    await _record(tmp_path)
    changed = dataclasses.replace(new_price, name="price")
    _, divergence, _ = await rerun(tmp_path, "clerk", [changed], "Quote prices.")
    assert divergence is not None and divergence.step == 3
    assert "recorded tool: '{\"sku_price\": 3.5}', now tool: '{\"sku_price\": 4.0}'" in str(
        divergence
    )


async def test_changed_instructions_differ_at_the_first_step(tmp_path: Path) -> None:
    await _record(tmp_path)
    _, divergence, _ = await rerun(tmp_path, "clerk", [price], "Quote prices politely.")
    assert divergence is not None and divergence.step == 1


def test_rerun_command_on_the_recorded_sample() -> None:
    code = main(
        [
            "rerun",
            str(SAMPLE),
            "--agent",
            "researcher",
            "--spec",
            "teamrt.demos.research_writer:researcher",
        ]
    )
    assert code == 0


async def test_a_teammate_that_kept_its_context_over_two_tasks_reruns_the_same(
    tmp_path: Path,
) -> None:
    from teamrt import Envelope
    from teamrt.models import ChatMessage, ModelReply, ToolSpec
    from teamrt.team import Team

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        text = messages[-1].content or ""
        if messages[-1].role == "user" and "Price" in text:
            return call("price", sku=text.split()[-1])
        return f"{len(messages)} messages so far"

    async with MemoryMailboxes() as mail:
        clerk = Teammate("clerk", FunctionModel(brain), instructions="Quote.", tools=[price])
        async with Team(mail, [clerk], agent_dir=tmp_path) as team:
            await team.ask("clerk", "Price A", timeout=5)
            await mail.send(Envelope.message("lead", "clerk", "a note in between"))
            await team.ask("clerk", "Price B", timeout=5)
    report, divergence, steps = await rerun(tmp_path, "clerk", [price], "Quote.")
    assert divergence is None and steps >= 5
    assert report is not None and report.ok


# --- what users and models may well give ---


def test_rerun_team_with_a_spec_that_names_none_of_the_agents_is_a_mistake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec whose teammates are none of the team's agents re-runs nothing: that is not a
    pass (exit 0), it is a mistake (exit 2) that names whom the team has."""
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    team_dir = tmp_path / "team"

    async def run() -> None:
        async with (
            FileMailboxes(team_dir) as mail,
            Team(mail, demo.teammates("offline"), agent_dir=team_dir / "agents") as team,
        ):
            await team.ask("researcher", demo.TASK, timeout=30)

    anyio.run(run)
    capsys.readouterr()
    assert (
        main(["rerun", str(team_dir), "--team", "--spec", "tests.support.eval_targets:team"]) == 2
    )
    err = capsys.readouterr().err
    assert "none of the teammates --spec tests.support.eval_targets:team names" in err
    assert "researcher, writer" in err

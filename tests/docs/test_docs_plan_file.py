"""The plan file the conductor's page shows (examples/plan.json and plan.yaml) is accepted in
JSON and in YAML, each of its fields is explained on the page, and it carries a conductor on
the conductor demo's package through to an accepted run."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from teamrt import FileMailboxes
from teamrt.conductor import Conductor, Plan, Policy
from teamrt.conductor.plan import Subtask
from teamrt.demos import conductor as demo
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec
from teamrt.team import Team, Teammate
from tests.support.paths import ROOT

PLAN = ROOT / "examples" / "plan.json"
PAGE = (ROOT / "docs" / "how-to" / "conductor.md").read_text()


def test_the_plan_file_is_accepted_in_json_and_yaml() -> None:
    plan = Plan.load(PLAN)
    assert plan == Plan.load(ROOT / "examples" / "plan.yaml")
    assert [s.id for s in plan.subtasks] == ["add", "mul", "cli"]
    assert plan.get("cli").depends_on == ("add", "mul") and plan.get("mul").role == "builder"


def test_the_page_shows_both_files_and_explains_every_field() -> None:
    assert '--8<-- "examples/plan.json"' in PAGE and '--8<-- "examples/plan.yaml"' in PAGE
    explained = PAGE[PAGE.index("## The plan file") :]
    for field in (*Plan.model_fields, *Subtask.model_fields):
        assert f"- `{field}` (" in explained, field  # each field has its bullet


def _builder(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    return demo.builder_brain(messages, tools)


async def test_the_plan_file_runs_to_an_accepted_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan as it stands (`python -m pytest ...` checks), on the conductor demo's package
    and builders, with a pool named `builder` for the subtask that names that role."""
    plan = Plan.load(PLAN)
    workdir = tmp_path / "work"
    for path, text in demo.SCAFFOLD.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text(text)
    # `python` is this interpreter (with pytest); no plugins: a check takes 0.3 s, not 2 s
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    tools = demo.builders(workdir)[0].tools
    pool = Teammate("builder", FunctionModel(_builder), tools=tools, replicas=2)
    async with (
        FileMailboxes(tmp_path / "team") as mail,
        Team(mail, [pool], agent_dir=tmp_path / "team" / "agents") as team,
    ):
        conductor = Conductor(
            team,
            "make calc pass its tests",
            plan=plan,
            workdir=workdir,
            policy=Policy.prefixes("python -m pytest"),
        )
        state = await conductor.run()
    assert state.outcome == "accepted", [d.detail for d in state.decisions]
    mul = [d for d in state.decisions if d.subtask == "mul" and d.action == "assign"]
    assert mul and all(d.detail.startswith("to builder-") for d in mul)
    failed = [d for d in state.decisions if d.evidence is not None and not d.evidence.passed]
    assert failed and "assert 5 == 6" in (failed[0].evidence.tail if failed[0].evidence else "")

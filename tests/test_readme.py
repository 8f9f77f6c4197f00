"""The README says what the code does: its command summary names every option each command has
(and none it lacks), and its plan file example is accepted, in JSON and in YAML, and carries a
conductor through to an accepted run."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from teamrt import FileMailboxes
from teamrt.cli.main import build_parser
from teamrt.conductor import Conductor, Plan, Policy
from teamrt.conductor.plan import Subtask
from teamrt.demos import conductor as demo
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec
from teamrt.team import Team, Teammate

README = (Path(__file__).parent.parent / "README.md").read_text()


def _block(after: str, language: str = "") -> str:
    """The first fenced block of `language` after the line `after`."""
    rest = README[README.index(after) :]
    found = re.search(rf"^```{language}\n(.*?)^```", rest, re.S | re.M)
    assert found, f"no ```{language} block after {after!r}"
    return found.group(1)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **subparsers.choices}


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """The option strings of each option a command documents in its --help (not -h, not the
    hidden ones): `("-q", "--quiet")`."""
    return [
        tuple(action.option_strings)
        for action in parser._actions
        if action.option_strings
        and action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction)
    ]


def _summary() -> dict[str, str]:
    """The README's command summary: each command's lines, keyed by the command's name."""
    lines: dict[str, str] = {}
    current = ""
    for line in _block("## The command line").splitlines():
        words = line.split()
        if words[:1] == ["teamrt"]:
            current = "" if words[1].startswith("[") else words[1]
        lines[current] = lines.get(current, "") + " " + line.split("#")[0]
    return lines


def test_the_command_summary_has_every_command_and_option() -> None:
    summary = _summary()
    commands = _commands()
    assert set(summary) == set(commands)
    for name, parser in commands.items():
        shown = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", summary[name]))
        options = _options(parser)
        missing = [o for o in options if not shown & set(o)]
        assert not missing, f"teamrt {name}: the summary lacks {missing}"
        unknown = shown - {s for o in options for s in o}
        assert not unknown, f"teamrt {name}: the summary shows {unknown}, which it does not have"


def test_each_option_choice_in_the_summary_is_the_command_s() -> None:
    summary = _summary()
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.choices and not isinstance(action, argparse._SubParsersAction):
                if action.option_strings and action.dest != "only":  # --only GROUP
                    assert "|".join(str(c) for c in action.choices) in summary[name], action.dest
                elif not action.option_strings:  # the demo's name
                    assert "|".join(str(c) for c in action.choices) in summary[name], name


def test_the_plan_file_example_is_accepted_in_json_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(_block("### The plan file", "json"))
    (tmp_path / "plan.yaml").write_text(_block("### The plan file", "yaml"))
    plan = Plan.load(tmp_path / "plan.json")
    assert plan == Plan.load(tmp_path / "plan.yaml")
    assert [s.id for s in plan.subtasks] == ["add", "mul", "cli"]
    assert plan.get("cli").depends_on == ("add", "mul") and plan.get("mul").role == "builder"
    explained = README[README.index("### The plan file") :]
    for field in (*Plan.model_fields, *Subtask.model_fields):
        assert f"- `{field}` (" in explained, field  # each field has its bullet


def _builder(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    return demo.builder_brain(messages, tools)


async def test_the_plan_file_example_runs_to_an_accepted_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's plan as it stands (`python -m pytest ...` checks), on the conductor demo's
    package and builders, with a pool named `builder` for the subtask that names that role."""
    plan = Plan.parse(_block("### The plan file", "json"))
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

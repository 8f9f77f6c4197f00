"""The team directory's layout has one owner (teamrt.teamdir), and the runner knows its team
only through `TeamContext`.

- every path of the layout, as TeamDir and AgentDir give it;
- no module outside teamrt.teamdir spells an agent's file names or the roster's in code (the
  mail stores' own files excepted: the roster is the file store's format);
- teamrt.teamdir imports nothing above the names and errors;
- teamrt.team.runner imports no `Team`, and `TeamContext` is all it is handed.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import teamrt
from teamrt.agents.journal import Journal
from teamrt.team.runner import Runner, TeamContext
from teamrt.teamdir import AgentDir, TeamDir, previous_journal

ROOT = Path(teamrt.__file__).parent
SPELLED = (".state.jsonl", ".state.prev.jsonl", ".transcript.jsonl", "team.json", "state.json")
#: may spell them: the owner itself, and the stores (the roster is the file store's own file)
OWNERS = ("teamdir.py", "mail/")
#: spell a path of the layout until they are pointed at teamrt.teamdir (owned elsewhere)
BELOW = {"teamrt.names", "teamrt.errors", "teamrt.private_files"}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (TeamDir.at("t").roster, "t/team.json"),
        (TeamDir.at("t").agents.path, "t/agents"),
        (TeamDir.at("t").agents.journal("ann"), "t/agents/ann.state.jsonl"),
        (TeamDir.at("t").agents.transcript("ann"), "t/agents/ann.transcript.jsonl"),
        (TeamDir.at("t").scratch, "t/scratch"),
        (TeamDir.at("t").demo_lock, "t/.demo.lock"),
        (TeamDir.at("t").conductor_state, "t/conductor/state.json"),
        (AgentDir(Path("elsewhere")).journal("bo"), "elsewhere/bo.state.jsonl"),
        (previous_journal(Path("a/bo.state.jsonl")), "a/bo.state.prev.jsonl"),
        (previous_journal(Path("a/custom.jsonl")), "a/custom.prev.jsonl"),
    ],
)
def test_the_layout(path: Path, expected: str) -> None:
    assert path == Path(expected)


def test_a_journal_keeps_its_previous_task_where_the_layout_says(tmp_path: Path) -> None:
    journal = TeamDir(tmp_path).agents.journal("ann")
    assert Journal(journal).previous_path == previous_journal(journal)


def test_transcribed_lists_the_agents_with_a_transcript_sorted(tmp_path: Path) -> None:
    agents = TeamDir(tmp_path).agents
    agents.path.mkdir()
    for name in ("zed", "ann"):
        agents.transcript(name).write_text("")
    agents.journal("bo").write_text("")  # a journal alone is no transcript
    assert agents.transcribed() == ["ann", "zed"]


def test_holds_team_is_whether_the_roster_is_a_file(tmp_path: Path) -> None:
    team = TeamDir(tmp_path)
    assert not team.holds_team()
    team.roster.mkdir()
    assert not team.holds_team()
    team.roster.rmdir()
    team.roster.write_text("{}")
    assert team.holds_team()


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module's code (docstrings left out: they may describe it)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def test_only_teamdir_spells_the_layout() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(OWNERS):
            continue
        for line, text in _code_strings(path):
            prose = any(c.isspace() for c in text)  # a message or help text, naming a file
            if not prose and any(spelled in text for spelled in SPELLED):
                found.append(f"{relative}:{line}: {text!r}")
    assert found == [], "use teamrt.teamdir for these paths"


def test_teamdir_imports_nothing_above_names_and_errors() -> None:
    tree = ast.parse((ROOT / "teamdir.py").read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("teamrt")
    }
    imported |= {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("teamrt")
    }
    assert imported <= BELOW


def test_the_runner_knows_no_team() -> None:
    source = (ROOT / "team" / "runner.py").read_text()
    tree = ast.parse(source)
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "teamrt.team.team" not in modules
    assert "teamrt.team" not in modules  # the package re-exports Team
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "Team" not in names


def test_the_runner_is_handed_a_team_context() -> None:
    assert Runner.__init__.__annotations__["context"] == "TeamContext"
    fields = {f.name for f in dataclasses.fields(TeamContext)}
    assert fields == {
        "mail",
        "lead",
        "agents",
        "prices",
        "budget",
        "started",
        "shutdown_deadline",
        "pick",
        "waiting",
        "enforce_deadline",
    }

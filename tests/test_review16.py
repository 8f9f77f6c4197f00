"""A hostile review of typed answers, MCP tools, evals and forks: each test is a bug found by
using them as the README says, or by feeding them what a user or a model may well give."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from teamrt import FileMailboxes, MemoryMailboxes
from teamrt.agents import Agent, Limits, MCPTools
from teamrt.cli.main import main
from teamrt.demos import research_writer as demo
from teamrt.errors import InvalidOutput, UsageError
from teamrt.evals import (
    Case,
    FunctionTarget,
    cases_from_run,
    compare,
    format_text,
    load_cases,
    make_target,
    run_eval,
)
from teamrt.evals.compare import format_comparison
from teamrt.fork import fork_team
from teamrt.models import FunctionModel, ScriptedModel, call
from teamrt.team import Team, Teammate

README = Path(__file__).parent.parent / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


# --- typed answers ---------------------------------------------------------------------------


class Reading(BaseModel):
    """A measurement."""

    value: float


async def test_a_typed_answer_with_a_number_too_big_for_a_float_is_corrected() -> None:
    """`1e999` is JSON, but no float: taken as infinity it was accepted, then written out as
    `null`, which a lead's `ask` refused as not matching the very type the teammate declared.
    It is a rejected answer, and the model gets its one correction."""
    model = ScriptedModel(['{"value": 1e999}', '{"value": 2.5}'], structured_output=True)
    report = await Agent("meter", model, output_type=Reading).run("Measure.")
    assert (report.stop.reason, report.output, report.answer) == (
        "answer",
        Reading(value=2.5),
        '{"value":2.5}',
    )
    correction = [m.content or "" for m in model.calls[1] if m.role == "user"][-1]
    assert "1e999" in correction and "finite" in correction

    teammate = Teammate(
        "meter",
        lambda: ScriptedModel([call("final_answer", '{"value": 1e999}')] * 2),
        output_type=Reading,
    )
    async with MemoryMailboxes() as mail, Team(mail, [teammate]) as team:
        with pytest.raises(InvalidOutput, match="meter gave no valid Reading"):
            await team.ask("meter", "Measure.", output_type=Reading, timeout=10)


# --- forks -----------------------------------------------------------------------------------


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
    assert main(["rerun", str(team_dir), "--team", "--spec", "tests.eval_targets:team"]) == 2
    err = capsys.readouterr().err
    assert "none of the teammates --spec tests.eval_targets:team names" in err
    assert "researcher, writer" in err


def test_a_fork_with_an_agent_dir_that_is_not_there_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt `--agent-dir` would fork the team without any journal or transcript, so that
    every agent starts its task afresh: it is refused, and nothing is written."""
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    team_dir = tmp_path / "team"

    async def run() -> None:
        async with (
            FileMailboxes(team_dir) as mail,
            Team(mail, demo.teammates("offline"), agent_dir=team_dir / "agents") as team,
        ):
            await team.ask("researcher", demo.TASK, timeout=30)

    anyio.run(run)
    task = json.loads((team_dir / "inboxes" / "researcher.jsonl").read_text().splitlines()[0])
    with pytest.raises(UsageError, match=r"no agents' folder at .*agnets"):
        fork_team(team_dir, task["id"], tmp_path / "fork", agent_dir=tmp_path / "agnets")
    assert not (tmp_path / "fork").exists()


# --- evals -----------------------------------------------------------------------------------


def test_cases_from_a_run_of_a_member_with_a_long_name(tmp_path: Path) -> None:
    """A member's name may be 64 characters, as long as a case id may be: the derived ids are
    shortened to fit, and stay unique, instead of failing validation."""
    long, longer = "w" * 64, "w" * 63 + "x"

    async def run() -> None:
        teammates = [Teammate(name, lambda: ScriptedModel(["done"] * 5)) for name in (long, longer)]
        async with (
            FileMailboxes(tmp_path / "team") as mail,
            Team(mail, teammates, agent_dir=tmp_path / "team" / "agents") as team,
        ):
            for name in (long, longer, long):
                await team.ask(name, "do it", timeout=10)

    anyio.run(run)
    found = cases_from_run(tmp_path / "team")
    ids = [case.id for case in found.cases]
    assert len(ids) == len(set(ids)) == 3
    assert all(len(i) <= 64 for i in ids)
    assert [case.member for case in found.cases] == [long, longer, long]


async def test_an_error_of_several_lines_is_one_line_in_the_text_reports() -> None:
    """A target's error keeps its text in the report, but the text report and the comparison
    give each case's error one line, so that the next case's line is not taken for part of it."""

    async def fails(text: str) -> str:
        raise RuntimeError("kaboom\n  at line 2\nand more")

    case = Case.model_validate(
        {"id": "c", "input": "q", "checks": [{"kind": "contains", "text": "x"}]}
    )
    report = await run_eval([case], FunctionTarget(fails, "fails"))
    assert report.cases[0].error is not None and "\n" in report.cases[0].error
    text = format_text(report)
    assert "         error: RuntimeError: kaboom at line 2 and more" in text.splitlines()
    comparison = format_comparison(compare(report, report))
    assert comparison.splitlines()[-1].endswith("RuntimeError: kaboom at line 2 and more")


async def test_runs_replaces_a_team_directory_of_an_earlier_eval_and_nothing_else(
    tmp_path: Path,
) -> None:
    """`--runs DIR` replaces `DIR/<case id>` when it holds a case's team from an earlier eval;
    a directory or file of the user's that has a case's name (`--runs .` and a case named like
    a source folder) is left alone, and the eval stops saying why."""
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "precious.txt").write_text("keep me")
    (runs / "b").write_text("a file of mine")
    a, b, c = (
        Case.model_validate(
            {"id": name, "input": "q", "checks": [{"kind": "contains", "text": "x"}]}
        )
        for name in ("a", "b", "c")
    )
    target = make_target(Teammate("w", lambda: ScriptedModel(["x"] * 5)), "team", runs=runs)
    for case in (a, b):
        with pytest.raises(UsageError, match=r"runs/[ab] is there and is not a team directory"):
            await run_eval([case], target)
    assert (runs / "a" / "precious.txt").read_text() == "keep me"
    assert (runs / "b").read_text() == "a file of mine"

    # the team of an earlier eval is replaced
    for _ in range(2):
        report = await run_eval([c], target)
        assert report.cases[0].passed and (runs / "c" / "team.json").is_file()


async def test_a_command_check_of_an_answer_holding_a_nul_character() -> None:
    """A NUL cannot be in an environment variable: the answer (and the input) holding one are
    still on standard input, and the variable is empty, as for one too long for it; the eval
    does not stop on a ValueError."""
    case = Case.model_validate(
        {
            "id": "nul",
            "input": "in\x00put",
            "checks": [
                {"kind": "command", "run": 'test "$(wc -c)" -eq 7'},  # an, NUL, swer
                {"kind": "command", "run": 'test -z "$TEAMRT_ANSWER$TEAMRT_INPUT"'},
                {"kind": "command", "run": "true\x00"},  # a command no shell can be given
            ],
        }
    )  # fmt: skip
    report = await run_eval([case], FunctionTarget(lambda text: "an\x00swer", "nul"))
    assert report.cases[0].error is None
    first, second, third = report.cases[0].checks
    assert (first.passed, second.passed, third.passed) == (True, True, False)
    assert third.detail == "could not start: embedded null byte"


def test_a_task_that_stopped_without_an_answer_makes_no_case(tmp_path: Path) -> None:
    """A task that stopped at a limit sends its partial work as `answer`: checks derived from
    it would hold the next run to the failure, so it makes no case and is listed with why."""

    async def run() -> None:
        teammates = [
            Teammate("fine", lambda: ScriptedModel(["the answer"])),
            Teammate(
                "loopy", lambda: ScriptedModel([call("nothing")] * 5), limits=Limits(max_steps=2)
            ),
        ]
        async with (
            FileMailboxes(tmp_path / "team") as mail,
            Team(mail, teammates, agent_dir=tmp_path / "team" / "agents") as team,
        ):
            assert (await team.ask("loopy", "go round", timeout=10)).stop_reason == "limit"
            await team.ask("fine", "answer", timeout=10)

    anyio.run(run)
    found = cases_from_run(tmp_path / "team")
    assert [case.id for case in found.cases] == ["fine-1"]
    (skipped,) = found.skipped
    assert skipped.endswith("to loopy: stopped (limit) without an answer")


def test_cases_without_ids_in_a_directory_get_ids_of_their_own(tmp_path: Path) -> None:
    """In a directory, two `.jsonl` files' cases without an id are not both `line-1`, and a
    file whose name is no valid id (`capitals.v2.json`) still names its case."""
    case = '{"input": "q", "checks": [{"kind": "contains", "text": "x"}]}'
    (tmp_path / "maths.jsonl").write_text(case + "\n" + case + "\n")
    (tmp_path / "capitals.jsonl").write_text(case + "\n")
    (tmp_path / "capitals.v2.json").write_text(case)
    (tmp_path / "héllo wörld.json").write_text(f"[{case}]")
    ids = [c.id for c in load_cases(tmp_path)]
    assert ids == [
        "capitals-line-1",
        "capitals_v2",
        "h_llo_w_rld-1",
        "maths-line-1",
        "maths-line-2",
    ]
    # a file alone keeps the README's line-<n>
    assert [c.id for c in load_cases(tmp_path / "maths.jsonl")] == ["line-1", "line-2"]


def test_a_cases_file_saved_with_a_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    """An editor on Windows saves UTF-8 with a byte order mark and CRLF line ends: the cases
    are read all the same, in a JSONL file and in a directory's JSON file."""
    case = '{"id": "%s", "input": "q", "checks": [{"kind": "contains", "text": "x"}]}'
    (tmp_path / "cases.jsonl").write_bytes(
        b"\xef\xbb\xbf" + (case % "a").encode() + b"\r\n" + (case % "b").encode() + b"\r\n"
    )
    assert [c.id for c in load_cases(tmp_path / "cases.jsonl")] == ["a", "b"]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "one.json").write_bytes(b"\xef\xbb\xbf" + (case % "c").encode())
    assert [c.id for c in load_cases(tmp_path / "dir")] == ["c"]


async def test_a_judge_s_reason_of_several_lines_is_one_line_in_the_text_reports() -> None:
    case = Case.model_validate(
        {"id": "c", "input": "q", "checks": [{"kind": "judge", "rubric": "Be right."}]}
    )
    judge = ScriptedModel(['{"verdict": "fail", "reason": "wrong:\\n- this\\n- that"}'])
    report = await run_eval([case], FunctionTarget(lambda text: "an answer", "f"), judge=judge)
    assert report.cases[0].checks[0].detail == "wrong:\n- this\n- that"
    assert "         x judge: Be right.: wrong: - this - that" in format_text(report).splitlines()
    comparison = format_comparison(compare(report, report))
    assert comparison.splitlines()[-1].endswith("wrong: - this - that")


async def test_a_judge_whose_model_raises_fails_its_check_and_the_eval_goes_on() -> None:
    """A judge of the user's own (`--judge module:object`) that raises is a model error: its
    check fails saying so, the other checks and cases run, and the eval ends with a report."""

    def broken(messages: object, tools: object) -> str:
        raise RuntimeError("judge down")

    case = Case.model_validate(
        {
            "id": "c",
            "input": "q",
            "checks": [{"kind": "judge", "rubric": "r"}, {"kind": "contains", "text": "an"}],
        }
    )
    report = await run_eval(
        [case], FunctionTarget(lambda text: "an answer", "f"), judge=FunctionModel(broken)
    )
    judged, contains = report.cases[0].checks
    assert (judged.passed, judged.detail) == (False, "the judge failed: RuntimeError: judge down")
    assert contains.passed and report.cases[0].score == 0.5


@pytest.mark.parametrize(
    "ref", ["http://127.0.0.1:9/elsewhere.json", "#/$defs/missing", "other.json#/a"]
)
async def test_a_schema_whose_ref_cannot_be_resolved_fails_its_check(ref: str) -> None:
    """A `$ref` to another document (never fetched) or to a definition that is not there is
    found only when an answer is checked: the check fails saying so; the eval goes on."""
    pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
    case = Case.model_validate(
        {"id": "c", "input": "q", "checks": [{"kind": "json_schema", "schema": schema}]}
    )
    report = await run_eval([case], FunctionTarget(lambda text: '{"a": 1}', "f"))
    (check,) = report.cases[0].checks
    assert not check.passed
    assert check.detail.startswith("the schema's $ref cannot be resolved: ")
    assert ref.split("#")[-1] in check.detail


# --- MCP tools -------------------------------------------------------------------------------

ONE_TOOL_SERVER = """
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("one", log_level="WARNING")


@server.tool(name=sys.argv[1])
def the_tool(to: str = "") -> str:
    return "from the server"


server.run()
"""


@pytest.mark.parametrize(
    ("clash", "where"),
    [
        ("send_message", "the team's tools"),
        ("request", "the team's tools"),
        ("delegate", "the team's tools"),
    ],
)
async def test_a_server_tool_named_like_a_team_tool_is_a_crash_that_says_which(
    tmp_path: Path, clash: str, where: str
) -> None:
    """A teammate's MCP tool named like one the team gives it (`send_message`, `request`,
    `delegate`, ...) is refused at the start as one named like a tool of its own is: naming
    the server, the tool, what it clashes with, and how to keep them apart."""
    pytest.importorskip("mcp")
    script = tmp_path / "one_tool.py"
    script.write_text(ONE_TOOL_SERVER)
    server = MCPTools.stdio(sys.executable, [str(script), clash], name="one")
    member = Teammate("calc", ScriptedModel([]), mcp=[server], delegate=clash == "delegate")
    async with MemoryMailboxes() as mail:
        with anyio.fail_after(30):
            async with Team(mail, [member]) as team:
                assert team.status["calc"].state == "crashed"
                last = team.status["calc"].last
    assert last.startswith(
        f"crashed: UsageError: calc: tool {clash!r} of MCP server 'one' has the name of a tool "
        f"in {where}; give the server a prefix="
    )

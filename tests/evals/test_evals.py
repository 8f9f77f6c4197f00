"""Evals: cases run on an agent or a team, every check kind, the judge, reports, comparing two
runs, and cases made from a recorded team run. Offline: every model is a function or a script."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import FileMailboxes
from teamrt.agents import Limits
from teamrt.cli.main import main
from teamrt.errors import UsageError
from teamrt.evals import (
    Case,
    CaseError,
    EvalReport,
    FunctionTarget,
    Outcome,
    cases_from_run,
    compare,
    format_text,
    load_cases,
    make_target,
    run_check,
    run_eval,
    write_html,
)
from teamrt.evals.checks import parse_verdict
from teamrt.evals.compare import format_comparison
from teamrt.models import FunctionModel, ScriptedModel, call
from teamrt.team import Team, Teammate
from tests.support import eval_targets
from tests.support.paths import ROOT

CASES = [
    {"id": "france", "input": "What is the capital of France?",
     "checks": [{"kind": "contains", "text": "Paris"}, {"kind": "not_contains", "text": "Lyon"}]},
    {"id": "sum", "input": "What is the sum of 2 and 2?",
     "checks": [{"kind": "equals", "text": "4"}, {"kind": "regex", "pattern": "^\\d+$"}]},
    {"id": "germany", "input": "What is the capital of Germany?",
     "checks": [{"kind": "contains", "text": "Berlin"}, {"kind": "contains", "text": "Germany"}]},
]  # fmt: skip

#: the module `--target` and `--judge` name (MODULE:NAME)
TARGETS = eval_targets.__name__


def _write(path: Path, cases: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


def _case(
    *checks: dict[str, Any], input: str = "the question", id: str = "c", member: str | None = None
) -> Case:
    return Case.model_validate({"id": id, "input": input, "checks": checks, "member": member})


EQUALS_X = {"kind": "equals", "text": "x"}


async def _check(answer: str, check: dict[str, Any], judge: Any = None) -> tuple[bool, str]:
    case = _case(check)
    result = await run_check(case.checks[0], answer, case, judge)
    return result.passed, result.detail


# --- a run: two cases pass, one fails --------------------------------------------------------


def test_two_cases_pass_and_one_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _write(tmp_path / "cases.jsonl", CASES)
    report_path, page = tmp_path / "run.json", tmp_path / "run.html"
    code = main(
        ["eval", str(cases), "--target", f"{TARGETS}:agent", "--json", str(report_path),
         "--html", str(page), "--concurrency", "2"]
    )  # fmt: skip
    assert code == 1  # a case failed: CI sees it
    out = capsys.readouterr().out
    assert "PASS   france" in out and "PASS   sum" in out and "FAIL   germany" in out
    assert "x contains 'Berlin': not in the answer 'The capital of Germany is Munich.'" in out
    assert "2/3 cases passed, 1 failed; score 0.83" in out

    report = json.loads(report_path.read_text())
    assert report["format"] == "teamrt-eval" and report["target"] == f"{TARGETS}:agent"
    assert report["summary"] == {
        "cases": 3, "passed": 2, "failed": 1, "errors": 0, "score": 0.8333,
        "tokens": 45, "cost": pytest.approx(3 * (10 * 1.0 + 5 * 2.0) / 1e6), "judge_tokens": 0,
    }  # fmt: skip
    by_id = {c["id"]: c for c in report["cases"]}
    assert [c["id"] for c in report["cases"]] == ["france", "sum", "germany"]  # the file's order
    germany = by_id["germany"]
    assert germany["passed"] is False and germany["score"] == 0.5
    assert germany["answer"] == "The capital of Germany is Munich."
    assert [c["passed"] for c in germany["checks"]] == [False, True]
    assert germany["stop_reason"] == "answer" and germany["steps"] == 1
    assert germany["tokens"] == 15 and germany["duration"] >= 0
    assert by_id["sum"]["checks"][1]["check"] == "matches /^\\d+$/"

    html = page.read_text()
    assert html.startswith("<!doctype html>") and "Content-Security-Policy" in html
    assert "<script" not in html and "http" not in html.replace("http-equiv", "")
    assert html.index("germany") < html.index("france")  # failed cases first


def test_every_case_passing_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _write(tmp_path / "cases.jsonl", CASES[:2])
    assert main(["eval", str(cases), "--target", f"{TARGETS}:agent"]) == 0
    assert "2/2 cases passed, 0 failed; score 1.00" in capsys.readouterr().out


def test_a_directory_of_case_files(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "france.json").write_text(
        json.dumps({k: v for k, v in CASES[0].items() if k != "id"})
    )
    (tmp_path / "cases" / "more.json").write_text(json.dumps(CASES[1:]))
    _write(
        tmp_path / "cases" / "z.jsonl",
        [{"input": "x", "checks": [{"kind": "equals", "text": "x"}]}],
    )
    (tmp_path / "cases" / "notes.txt").write_text("not a case")
    cases = load_cases(tmp_path / "cases")
    assert [c.id for c in cases] == ["france", "sum", "germany", "z-line-1"]


# --- what runs: an agent, a team, a function ----------------------------------------------------


async def test_a_run_stopped_at_a_limit_fails_even_when_its_partial_work_passes() -> None:
    target = make_target(eval_targets.looping_agent, "looper")
    report = await run_eval([_case({"kind": "contains", "text": "Paris"})], target)
    case = report.cases[0]
    assert case.checks[0].passed and case.score == 1.0
    assert not case.passed and case.stop_reason == "limit"
    assert "the run stopped (limit)" in format_text(report)


async def test_a_team_target_asks_the_member_a_case_names(tmp_path: Path) -> None:
    cases = [
        _case({"kind": "contains", "text": "Paris"}, input="capital of France?", id="default"),
        _case({"kind": "equals", "text": "HELLO"}, input="hello", id="loud", member="shouter"),
    ]
    target = make_target(eval_targets.team, "team", runs=tmp_path / "runs")
    report = await run_eval(cases, target)
    assert [c.passed for c in report.cases] == [True, True], format_text(report)
    assert report.cases[1].steps == 1 and report.cases[1].stop_reason == "answer"
    # each case's team was kept: a recorded run of its own, which makes the case again
    again = cases_from_run(tmp_path / "runs" / "loud")
    assert [(c.member, c.input, c.checks[0].kind) for c in again.cases] == [
        ("shouter", "hello", "equals")
    ]
    pool = make_target(
        lambda: [Teammate("pool", FunctionModel(lambda m, t: "hi"), replicas=2)], "p"
    )
    replica = _case({"kind": "equals", "text": "hi"}, member="pool-2")
    assert (await run_eval([replica], pool)).passed == 1  # a replica, asked by its name
    wrong = make_target(eval_targets.team, "team", member="nobody")
    with pytest.raises(UsageError, match="no teammate named 'nobody'"):
        await run_eval(cases[:1], wrong)


async def test_cases_run_side_by_side_up_to_the_limit_and_errors_are_reported() -> None:
    running, most = 0, 0

    async def slow(question: str) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.sleep(0.01)
        running -= 1
        if question == "boom":
            raise RuntimeError("the target broke")
        if question == "hang":
            await anyio.sleep(60)
        return question

    cases = [_case({"kind": "equals", "text": "q"}, input="q", id=f"c{i}") for i in range(6)]
    cases += [_case(EQUALS_X, input="boom", id="boom"), _case(EQUALS_X, input="hang", id="hang")]
    report = await run_eval(cases, FunctionTarget(slow, "slow"), concurrency=3, timeout=1.0)
    assert most == 3
    assert report.passed == 6 and report.errors == 2
    errors = {c.id: c.error for c in report.cases if c.error}
    assert errors == {"boom": "RuntimeError: the target broke", "hang": "no answer within 1s"}
    assert "ERROR  boom" in format_text(report)


def test_a_function_target_and_what_a_target_may_return() -> None:
    target = make_target(eval_targets.echo, "echo")
    assert isinstance(target, FunctionTarget)
    assert Outcome.of("x").answer == "x"
    with pytest.raises(UsageError, match="returned a int"):
        Outcome.of(3)
    with pytest.raises(UsageError, match="is a int"):
        make_target(3, "three")


# --- every check kind -------------------------------------------------------------------------


async def test_text_checks() -> None:
    assert await _check("Paris, France", {"kind": "contains", "text": "Paris"}) == (True, "")
    assert (await _check("paris", {"kind": "contains", "text": "Paris"}))[0] is False
    assert (await _check("paris", {"kind": "contains", "text": "Paris", "ignore_case": True}))[0]
    assert await _check("Lyon", {"kind": "not_contains", "text": "Paris"}) == (True, "")
    assert await _check("in Paris", {"kind": "not_contains", "text": "Paris"}) == (
        False, "found in the answer 'in Paris'",
    )  # fmt: skip
    assert (await _check("  4\n", {"kind": "equals", "text": "4"}))[0]
    assert (await _check("4 apples", {"kind": "equals", "text": "4"})) == (
        False, "the answer is '4 apples'",
    )  # fmt: skip
    assert (await _check("a\n42\nb", {"kind": "regex", "pattern": "^\\d+$"}))[0]  # per line
    assert not (await _check("abc", {"kind": "regex", "pattern": "\\d"}))[0]
    assert (await _check("ABC", {"kind": "regex", "pattern": "abc", "ignore_case": True}))[0]


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}


async def test_json_schema_checks() -> None:
    check = {"kind": "json_schema", "schema": SCHEMA}
    assert await _check('{"name": "Ada", "age": 36}', check) == (True, "")
    assert await _check(eval_targets.ANSWERS["json"], check) == (True, "")  # fenced block
    assert await _check('{"name": "Ada", "age": -1}', check) == (
        False, "age: -1 is less than the minimum of 0",
    )  # fmt: skip
    assert await _check('{"name": "Ada"}', check) == (
        False, "(the whole answer): 'age' is a required property",
    )  # fmt: skip
    passed, detail = await _check("Ada, 36", check)
    assert not passed and detail.startswith("the answer is not JSON")


async def test_command_checks(tmp_path: Path) -> None:
    assert await _check("Paris", {"kind": "command", "run": "grep -q Paris"}) == (True, "")
    assert await _check("Paris", {"kind": "command", "run": 'test "$TEAMRT_ANSWER" = Paris'}) == (
        True, "",
    )  # fmt: skip
    assert (await _check("x", {"kind": "command", "run": 'test "$TEAMRT_INPUT" = "the question"'}))[
        0
    ]
    assert (await _check("x", {"kind": "command", "run": 'test "$TEAMRT_CASE" = c'}))[0]
    # a fresh empty directory, not the caller's
    assert (await _check("x", {"kind": "command", "run": 'test -z "$(ls -A)" && touch mine'}))[0]
    assert await _check("Lyon", {"kind": "command", "run": "echo looked for Paris; exit 3"}) == (
        False, "exit status 3: looked for Paris",
    )  # fmt: skip
    passed, detail = await _check(
        "x", {"kind": "command", "run": "echo started; sleep 30", "timeout": 0.5}
    )
    assert not passed and detail.startswith("timed out after 0.5s")
    # a command that reads nothing from a big answer still gets its exit status
    assert (await _check("y" * 1_000_000, {"kind": "command", "run": "true"}))[0]
    assert not (await _check("x", {"kind": "command", "run": "no-such-command-here"}))[0]


async def test_a_judge_gives_a_structured_verdict() -> None:
    rubric = {"kind": "judge", "rubric": "Names the capital correctly."}
    scripted = ScriptedModel([call("verdict", verdict="pass", reason="it says Paris")])
    assert await _check("Paris", rubric, scripted) == (True, "it says Paris")
    sent = scripted.calls[0]
    assert sent[0].role == "system" and "rubric" in (sent[0].content or "")
    assert "The agent's answer:\nParis" in (sent[1].content or "")
    assert "Names the capital correctly." in (sent[1].content or "")
    # a judge without tools answers with the JSON object, in any case, in other text
    text = ScriptedModel(['Verdict: {"verdict": "FAIL", "reason": "wrong city"}'])
    assert await _check("Lyon", rubric, text) == (False, "wrong city")
    nonsense = ScriptedModel(["I think it is fine."])
    passed, detail = await _check("Paris", rubric, nonsense)
    assert not passed and detail.startswith("the judge's reply is not a verdict")
    broken = ScriptedModel([])  # raises ScriptExhausted, a ModelError
    passed, detail = await _check("Paris", rubric, broken)
    assert not passed and detail.startswith("the judge failed: scripted")
    with pytest.raises(ValueError, match="no JSON object"):
        parse_verdict("pass")
    # what the verdict took is counted apart from the target's tokens
    case = _case(rubric)
    again = ScriptedModel([call("verdict", verdict="pass", reason="ok")])
    assert (await run_check(case.checks[0], "Paris", case, again)).tokens > 0


def test_a_judge_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    judged = [{**c, "checks": [{"kind": "judge", "rubric": "Names the right capital."}]}
              for c in (CASES[0], CASES[2])]  # fmt: skip
    cases = _write(tmp_path / "cases.jsonl", judged)
    args = ["eval", str(cases), "--target", f"{TARGETS}:agent"]
    assert main([*args, "--judge", f"{TARGETS}:judge"]) == 1
    out = capsys.readouterr().out
    assert "PASS   france" in out
    assert (
        "x judge: Names the right capital.: the answer says 'The capital of Germany is Munich.'"
        in out
    )
    assert main(args) == 2  # judge checks, and no judge
    assert "name the judge model with --judge" in capsys.readouterr().err


# --- comparing two runs -------------------------------------------------------------------------


def test_comparing_two_runs_case_by_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _write(tmp_path / "cases.jsonl", CASES)
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    main(["eval", str(cases), "--target", f"{TARGETS}:agent", "--json", str(before)])
    main(["eval", str(cases), "--target", f"{TARGETS}:better_agent", "--json", str(after)])
    capsys.readouterr()

    changes = tmp_path / "changes.json"
    assert main(["eval", "--compare", str(before), str(after), "--json", str(changes)]) == 1
    out = capsys.readouterr().out
    assert (
        f"{before} -> {after}: 1 fixed, 1 broke, 1 unchanged; score 0.83 -> 0.83 (+0.00); REGRESSED"
        in out
    )
    lines = out.splitlines()[1:]
    assert lines[0].split()[:5] == ["broke", "sum", "1.00", "->", "0.50"]
    assert "(-0.50)  equals '4': the answer is '5'" in lines[0]
    assert lines[1].split()[:5] == ["fixed", "germany", "0.50", "->", "1.00"]
    assert lines[2].split()[:2] == ["unchanged", "france"]
    saved = json.loads(changes.read_text())
    assert saved["regressed"] is True
    assert {c["id"]: c["delta"] for c in saved["cases"]} == {
        "france": 0,
        "sum": -0.5,
        "germany": 0.5,
    }
    assert {c["id"]: c["change"] for c in saved["cases"]} == {
        "france": "unchanged", "sum": "broke", "germany": "fixed",
    }  # fmt: skip

    # only fixes: no regression, exit 0; a case only in one run is added or removed
    assert main(["eval", "--compare", str(before), str(before)]) == 0
    a, b = EvalReport.load(str(before)), EvalReport.load(str(after))
    b.cases = [c for c in b.cases if c.id != "sum"]
    fewer = compare(a, b)
    assert {c.id: c.change for c in fewer.cases} == {
        "france": "unchanged", "sum": "removed", "germany": "fixed",
    }  # fmt: skip
    assert not fewer.regressed
    assert [c.change for c in compare(b, a).cases] == ["unchanged", "broke", "added"]


def test_compare_refuses_what_is_not_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"figures": []}')
    assert main(["eval", "--compare", str(other), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"teamrt eval: {other}: not a report written by teamrt eval --json")
    assert len(err.splitlines()) == 1
    assert main(["eval", "--compare", str(tmp_path / "missing.json"), str(other)]) == 2
    assert "no such file" in capsys.readouterr().err


# --- cases from a recorded run ------------------------------------------------------------------


def test_cases_from_a_recorded_team_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The offline research-writer demo records a run; its two tasks (the lead's to the
    researcher, the researcher's to the writer) become cases that the same team passes again."""
    from teamrt.demos import research_writer

    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    assert anyio.run(research_writer.run, tmp_path, "offline", False) == 0
    capsys.readouterr()
    recorded = tmp_path / "research-writer"
    cases_file = tmp_path / "cases.jsonl"
    assert main(["eval", "--from-run", str(recorded), "-o", str(cases_file)]) == 0
    assert "2 cases from" in capsys.readouterr().err

    cases = load_cases(cases_file)
    assert [(c.id, c.member) for c in cases] == [
        ("researcher-1", "researcher"),
        ("writer-1", "writer"),
    ]
    researcher, writer = cases
    assert researcher.input == research_writer.TASK
    assert researcher.recorded is not None and researcher.recorded["asked_by"] == "lead"
    assert researcher.recorded["stop_reason"] == "answer"
    assert [c.kind for c in researcher.checks] == ["equals"]  # a one-line answer
    assert writer.input.startswith("Findings:\n- ")
    assert all(
        c.note and c.note.startswith("derived") for c in (*researcher.checks, *writer.checks)
    )

    code = main(["eval", str(cases_file), "--target", "teamrt.demos.research_writer:teammates"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2/2 cases passed" in out and "2 checks are still as derived from a recorded run" in out

    # only one member's tasks; to standard output
    assert main(["eval", "--from-run", str(recorded), "--member", "writer"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in printed] == ["writer-1"]


def test_a_multi_line_answer_gets_contains_checks() -> None:
    from teamrt.evals import derive_checks

    checks = derive_checks("# Title\n\nfirst line\n" + "x" * 300 + "\nlast line")
    assert [(c.kind, getattr(c, "text", "")) for c in checks] == [
        ("contains", "# Title"), ("contains", "first line"), ("contains", "x" * 120),
    ]  # fmt: skip


def test_a_run_with_no_tasks_makes_no_cases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from teamrt import FileMailboxes

    async def empty() -> None:
        async with FileMailboxes(tmp_path / "quiet", members=["lead", "worker"]):
            pass

    anyio.run(empty)
    assert main(["eval", "--from-run", str(tmp_path / "quiet")]) == 2
    assert "has no task answered with a result" in capsys.readouterr().err


# --- bad input: one line, exit status 2 -------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": "a", "input": "q", "checks": [{"kind": "contains", "text": "x"}]}\n{"id": "b",\n',
         "cases.jsonl:2: not JSON (Expecting property name enclosed in double quotes, column 12)"),
        ('{"id": "a", "input": "q", "checks": [{"kind": "sounds_like", "text": "x"}]}\n',
         "cases.jsonl:1: checks.0: unknown check kind (one of contains, not_contains, equals, "
         "regex, json_schema, command, judge)"),
        ('{"id": "a", "input": "q", "checks": [{"kind": "regex", "pattern": "("}]}\n',
         "cases.jsonl:1: checks.0.regex.pattern: not a regular expression: missing ), "
         "unterminated subpattern at position 0"),
        ('{"id": "a", "input": "q", "checks": [{"kind": "json_schema", "schema": {"type": 5}}]}\n',
         "cases.jsonl:1: checks.0.json_schema.schema: not a JSON schema: 5 is not valid under"),
        ('{"id": "a", "input": "q", "checks": []}\n',
         "cases.jsonl:1: checks: a case needs at least one check"),
        ('{"id": "a", "checks": [{"kind": "equals", "text": "x"}]}\n',
         "cases.jsonl:1: input: Field required"),
        ('{"id": "a b", "input": "q", "checks": [{"kind": "equals", "text": "x"}]}\n',
         "cases.jsonl:1: id: invalid case id 'a b'"),
        ('{"id": "a", "input": "q", "checks": [{"kind": "equals", "text": "x"}]}\n' * 2,
         "cases.jsonl: two cases have the id 'a'"),
        ('["a list"]\n', "cases.jsonl:1: a case is a JSON object, not list"),
        ("\n# only a comment\n", "cases.jsonl: no cases in it"),
    ],
)  # fmt: skip
def test_a_malformed_cases_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(content)
    with pytest.raises(CaseError):
        load_cases(path)
    assert main(["eval", str(path), "--target", f"{TARGETS}:agent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"teamrt eval: {tmp_path}/{message}"), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval"], "give a cases file"),
        (["eval", "CASES"], "--target module:object is required"),
        (["eval", "CASES", "--target", "nosuchmodule:x"], "no module named 'nosuchmodule'"),
        (["eval", "CASES", "--target", f"{TARGETS}:nothing"], "has no 'nothing'"),
        (["eval", "CASES", "--target", f"{TARGETS}:ANSWERS"], "is a dict"),
        (["eval", "CASES", "--target", f"{TARGETS}:agent",
          "--judge", f"{TARGETS}:ANSWERS"], "is a dict, not a model"),
        (["eval", "missing.jsonl", "--target", f"{TARGETS}:agent"], "no such file"),
        (["eval", "--compare", "a.json", "b.json", "--html", "x.html"],
         "--html cannot be used with --compare"),
        (["eval", "--from-run", "run", "--target", "x:y"],
         "--target cannot be used with --from-run"),
        (["eval", "CASES", "--target", f"{TARGETS}:agent", "--json", "nodir/x.json"],
         "there is no directory nodir"),
    ],
)  # fmt: skip
def test_command_line_mistakes_are_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    _write(tmp_path / "CASES", CASES[:1])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_the_page_escapes_what_the_cases_hold(tmp_path: Path) -> None:
    hostile = '</pre><script>alert("x")</script>'

    async def run() -> EvalReport:
        target = FunctionTarget(lambda q: hostile, "hostile")
        return await run_eval([_case({"kind": "equals", "text": hostile}, input=hostile)], target)

    report = anyio.run(run)
    page = tmp_path / "page.html"
    with page.open("w") as out:
        write_html(report, out)
    html = page.read_text()
    assert "<script" not in html and "&lt;script&gt;" in html


def test_the_docs_cases_are_accepted_and_their_command_check_works(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "how-to" / "evals.md").read_text()
    rest = page[page.index("A cases file is JSON Lines") :]
    block = rest[rest.index("```json\n") + 8 : rest.index("\n```", rest.index("```json\n"))]
    cases = load_cases(_write_text(tmp_path / "cases.jsonl", block + "\n"))
    assert [c.id for c in cases] == ["capital", "person", "tested", "tone"]
    assert {k.kind for c in cases for k in c.checks} == {
        "contains", "not_contains", "json_schema", "command", "judge",
    }  # fmt: skip
    tested = cases[2]

    async def check(answer: str) -> bool:
        return (await run_check(tested.checks[0], answer, tested)).passed

    assert anyio.run(check, "def add(a, b):\n    return a + b\n")
    assert not anyio.run(check, "def add(a, b):\n    return a - b\n")


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- what users and models may well give ---


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

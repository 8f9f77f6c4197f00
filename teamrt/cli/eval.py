"""`teamrt eval`: run cases on an agent or a team and report; compare two runs; make cases from
a recorded run. One command, three modes:

    teamrt eval CASES --target module:object [--judge SPEC] [--json FILE] [--html FILE]
    teamrt eval --compare A.json B.json
    teamrt eval --from-run TEAM [-o cases.jsonl]

Exit status: 0 when every case passed (no regression, for --compare; cases written, for
--from-run), 1 when a case failed or regressed, 2 for a mistake in the command or the cases.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from teamrt.cli.runner import positive_int, seconds
from teamrt.errors import UsageError
from teamrt.private_files import open_private, write_private

HELP = (
    "run an agent or a team over cases, score and report; compare two runs; make cases from "
    "a recorded run"
)
DESCRIPTION = """\
Runs each case (its input) on the target and checks the answer: contains, not_contains,
equals, regex, json_schema, command (a shell command given the answer, exit 0 passes) and judge
(a model's verdict against a rubric). A case scores the fraction of its checks passed and passes
when all pass and the run ended with an answer. Prints a line per case and the totals; --json
and --html save the report. Exit status 1 when a case failed.

The target (--target module:object) is an Agent, a Teammate or a list of them (each case then
runs on a team of its own), a function of no arguments returning one (called for each case),
or a function of the input returning the answer.

--compare A.json B.json: two saved reports case by case (fixed, broke, unchanged, score
changes); exit status 1 when a case broke or its score went down.

--from-run TEAM: each task of a recorded team run (a request answered with a task_result)
as a case, with checks derived from the recorded answer to edit; written as JSONL."""


def add_eval_command(commands: Any) -> None:
    """Register `eval` on the `teamrt` parser's subcommands."""
    parser = commands.add_parser(
        "eval",
        help=HELP,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "cases",
        nargs="?",
        metavar="CASES",
        help="a JSONL file of cases, or a directory of *.json / *.jsonl files",
    )
    parser.add_argument(
        "--target",
        metavar="MODULE:OBJECT",
        help="what to run: an Agent, Teammate(s), a function returning one, or a function of "
        "the input returning the answer (e.g. teamrt.demos.research_writer:teammates)",
    )
    parser.add_argument(
        "--member",
        metavar="NAME",
        help="for a team: the member asked when a case names none (default: the first "
        "teammate); with --from-run, only the tasks given to this member",
    )
    parser.add_argument(
        "--judge",
        metavar="SPEC",
        help="the model for judge checks: openai (OpenAIModel from OPENAI_MODEL, "
        "OPENAI_BASE_URL, OPENAI_API_KEY) or module:object naming a Model or a function "
        "returning one",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=4,
        metavar="N",
        help="cases run at the same time (default 4)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=300.0,
        metavar="SECONDS",
        help="time limit of one case (default 300); a case past it is an error",
    )
    parser.add_argument(
        "--runs",
        metavar="DIR",
        help="for a team: keep each case's team directory as DIR/<case id>, to replay it "
        "(a team an earlier eval left there is replaced; anything else there stops the eval; "
        "default: a scratch directory, removed)",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="also write the report (or comparison) as JSON"
    )
    parser.add_argument("--html", metavar="FILE", help="also write the report as one HTML page")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("A.json", "B.json"),
        help="compare two reports saved with --json, case by case",
    )
    parser.add_argument(
        "--from-run",
        metavar="TEAM",
        help="make cases from a recorded team run (a team directory or a store URL)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="with --from-run: write the cases here (default: standard output)",
    )
    parser.set_defaults(run=run_eval_command)


def _writable(option: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; name a file")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: there is no directory {path.parent}; create it first")
    return path


def _only(args: argparse.Namespace, mode: str, allowed: set[str]) -> None:
    """Refuse options that mean nothing in `mode`."""
    given = {
        "cases": args.cases is not None,
        "--target": args.target is not None,
        "--judge": args.judge is not None,
        "--runs": args.runs is not None,
        "--html": args.html is not None,
        "--json": args.json is not None,
        "-o": args.output is not None,
        "--member": args.member is not None,
    }
    extra = [name for name, present in given.items() if present and name not in allowed]
    if extra:
        raise UsageError(f"{', '.join(extra)} cannot be used with {mode}")


async def run_eval_command(args: argparse.Namespace) -> int:
    """`teamrt eval` in whichever mode its options choose."""
    if args.compare and args.from_run:
        raise UsageError("--compare and --from-run are two different modes: give one")
    if args.compare:
        _only(args, "--compare", {"--json"})
        return _compare(args)
    if args.from_run:
        _only(args, "--from-run", {"-o", "--member"})
        return _from_run(args)
    if args.cases is None:
        raise UsageError(
            "give a cases file (teamrt eval CASES --target module:object), --compare A B, "
            "or --from-run TEAM"
        )
    if args.target is None:
        raise UsageError("--target module:object is required to run cases")
    _only(args, "a run", {"cases", "--target", "--judge", "--runs", "--html", "--json", "--member"})
    return await _run(args)


async def _run(args: argparse.Namespace) -> int:
    from teamrt.evals import format_text, load_cases, load_judge, load_target, run_eval, write_html
    from teamrt.evals.checks import needs_judge

    json_path = _writable("--json", args.json)
    html_path = _writable("--html", args.html)
    cases = load_cases(args.cases)
    runs = Path(args.runs) if args.runs else None
    if runs is not None and runs.exists() and not runs.is_dir():
        raise UsageError(f"--runs {runs} is a file; give a directory")
    target = load_target(args.target, member=args.member, runs=runs)
    judge = load_judge(args.judge) if args.judge else None
    if judge is None and needs_judge(cases):
        raise UsageError(
            f"{args.cases} has judge checks: name the judge model with --judge (openai, or "
            "module:object)"
        )
    try:
        report = await run_eval(
            cases,
            target,
            concurrency=args.concurrency,
            timeout=args.timeout,
            judge=judge,
            cases_from=str(args.cases),
        )
    finally:
        close = getattr(judge, "aclose", None)
        if close is not None:
            await close()
    print(format_text(report), flush=True)
    if json_path is not None:
        write_private(json_path, report.to_json() + "\n")
    if html_path is not None:
        with open_private(html_path) as out:
            write_html(report, out)
    return 0 if report.passed == len(report.cases) else 1


def _compare(args: argparse.Namespace) -> int:
    from teamrt.evals import EvalReport, compare, format_comparison

    json_path = _writable("--json", args.json)
    first, second = args.compare
    comparison = compare(
        EvalReport.load(first), EvalReport.load(second), a_name=first, b_name=second
    )
    print(format_comparison(comparison))
    if json_path is not None:
        data = comparison.model_dump_json(indent=2)
        write_private(json_path, data + "\n")
    return 1 if comparison.regressed else 0


def _from_run(args: argparse.Namespace) -> int:
    from teamrt.cli.send import team_at
    from teamrt.evals import cases_from_run
    from teamrt.mail.locator import redacted

    output = _writable("-o", args.output)
    found = cases_from_run(team_at(args.from_run), member=args.member)
    lines = "".join(case.to_json_line() + "\n" for case in found.cases)
    if output is None:
        sys.stdout.write(lines)
    else:
        write_private(output, lines)
    where = f" to {output}" if output is not None else ""
    print(
        f"{len(found.cases)} cases from {redacted(args.from_run)}{where}; their checks are "
        "derived from the recorded answers: edit them to say what a right answer must have",
        file=sys.stderr,
    )
    for why in found.skipped:
        print(f"  no case for task {why}", file=sys.stderr)
    if not found.cases:
        raise UsageError(
            f"{redacted(args.from_run)} has no task answered with a result to make a case of"
        )
    return 0

"""Evals: run an agent or a team over cases, score each answer, report, compare two runs.

- `cases.py`: `Case` and its checks (`contains`, `not_contains`, `equals`, `regex`,
  `json_schema`, `command`, `judge`); `load_cases` reads a JSONL file or a directory;
- `targets.py`: what runs a case: an `Agent`, teammates (a team per case), or a function of
  the input; `load_target("module:object")`, `load_judge`;
- `checks.py`: each check run on an answer, into a `CheckResult`;
- `runner.py`: `run_eval` (cases side by side up to a limit) into an `EvalReport`;
- `report.py`: the report as text and as a self-contained HTML page;
- `compare.py`: two reports case by case (fixed, broke, unchanged, score deltas);
- `from_run.py`: cases from a recorded team run's tasks and results.

    cases = load_cases("evals/cases.jsonl")
    report = await run_eval(cases, load_target("mypkg.evals:make_agent"), concurrency=4)
    print(format_text(report))
"""

from teamrt.evals.cases import (
    CHECK_KINDS,
    Case,
    CaseError,
    Check,
    Command,
    Contains,
    Equals,
    JsonSchema,
    Judge,
    NotContains,
    Regex,
    load_cases,
    write_cases,
)
from teamrt.evals.checks import CheckResult, Verdict, run_check, run_checks
from teamrt.evals.compare import CaseChange, Comparison, compare, format_comparison
from teamrt.evals.from_run import FromRun, cases_from_run, derive_checks
from teamrt.evals.report import format_text, headline, write_html
from teamrt.evals.runner import CaseResult, EvalReport, run_case, run_eval
from teamrt.evals.targets import (
    AgentTarget,
    FunctionTarget,
    Outcome,
    Target,
    TeamTarget,
    load_judge,
    load_target,
    make_target,
)

__all__ = [
    "CHECK_KINDS",
    "AgentTarget",
    "Case",
    "CaseChange",
    "CaseError",
    "CaseResult",
    "Check",
    "CheckResult",
    "Command",
    "Comparison",
    "Contains",
    "Equals",
    "EvalReport",
    "FromRun",
    "FunctionTarget",
    "JsonSchema",
    "Judge",
    "NotContains",
    "Outcome",
    "Regex",
    "Target",
    "TeamTarget",
    "Verdict",
    "cases_from_run",
    "compare",
    "derive_checks",
    "format_comparison",
    "format_text",
    "headline",
    "load_cases",
    "load_judge",
    "load_target",
    "make_target",
    "run_case",
    "run_check",
    "run_checks",
    "run_eval",
    "write_cases",
    "write_html",
]

"""Running cases on a target, side by side up to a limit, into one `EvalReport`.

A case's score is the fraction of its checks that passed; it passes when every check passed
and the run ended with an answer (a run stopped at a limit, with partial work, fails even if
its partial text passes the checks). A case whose target raised or ran out of time scores 0,
with the error, and its checks are not run. The report's score is the mean of the cases'.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

import anyio
from pydantic import BaseModel, Field, ValidationError

from teamrt.errors import UsageError
from teamrt.evals.cases import Case
from teamrt.evals.checks import CheckResult, needs_judge, run_checks
from teamrt.evals.targets import Outcome, Target
from teamrt.models.base import Model

#: The report format's version: a report names it, and `compare` refuses another.
REPORT_VERSION = 1


class CaseResult(BaseModel):
    """One case's run: the answer, what it took, each check, the score."""

    id: str
    input: str
    member: str | None = None
    answer: str | None = None
    stop_reason: str | None = None
    detail: str = ""
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: float | None = None
    duration: float = 0.0  # seconds, the checks included
    error: str | None = None  # the target raised, or ran out of time
    checks: list[CheckResult] = Field(default_factory=list)
    score: float = 0.0  # the fraction of checks passed
    passed: bool = False

    @property
    def status(self) -> Literal["pass", "fail", "error"]:
        return "error" if self.error is not None else "pass" if self.passed else "fail"


class EvalReport(BaseModel):
    """A whole eval: every case's result and the totals. Saved with `--json`, compared by
    `teamrt eval --compare`."""

    format: Literal["teamrt-eval"] = "teamrt-eval"
    version: int = REPORT_VERSION
    target: str
    cases_from: str = ""
    started: str = ""  # ISO 8601, UTC
    duration: float = 0.0
    cases: list[CaseResult] = Field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(1 for c in self.cases if c.passed)

    @property
    def errors(self) -> int:
        return sum(1 for c in self.cases if c.error is not None)

    @property
    def failed(self) -> int:
        return len(self.cases) - self.passed

    @property
    def score(self) -> float:
        return sum(c.score for c in self.cases) / len(self.cases) if self.cases else 0.0

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.cases)

    @property
    def judge_tokens(self) -> int:
        """Tokens the judge's verdicts took (not in `tokens`, which are the target's)."""
        return sum(check.tokens for case in self.cases for check in case.checks)

    @property
    def cost(self) -> float | None:
        """The cases' total cost in USD; None if any case's is unknown."""
        costs = [c.cost for c in self.cases]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def totals(self) -> dict[str, object]:
        """The summary figures, as `--json` writes them beside the cases."""
        return {
            "cases": len(self.cases),
            "passed": self.passed,
            "failed": self.failed,
            "errors": self.errors,
            "score": round(self.score, 4),
            "tokens": self.tokens,
            "cost": self.cost,
            "judge_tokens": self.judge_tokens,
        }

    def to_json(self) -> str:
        """The report as JSON: its fields, with the totals added under `summary`."""
        data = self.model_dump(mode="json")
        data["summary"] = self.totals()

        return json.dumps(data, indent=2, ensure_ascii=False)

    @classmethod
    def load(cls, path: str) -> EvalReport:
        """A report saved with `--json`; `UsageError` when the file is not one."""
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except FileNotFoundError:
            raise UsageError(f"{path}: no such file (a report written by --json)") from None
        except IsADirectoryError:
            raise UsageError(f"{path} is a directory, not a report written by --json") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not a report written by --json (not UTF-8)") from None
        try:
            report = cls.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UsageError(
                f"{path}: not a report written by teamrt eval --json "
                f"({where + ': ' if where else ''}{first['msg']})"
            ) from None
        if report.version != REPORT_VERSION:
            raise UsageError(
                f"{path}: a report of format version {report.version}; this teamrt reads "
                f"version {REPORT_VERSION}"
            )
        return report


async def run_case(
    case: Case, target: Target, *, timeout: float = 300.0, judge: Model | None = None
) -> CaseResult:
    """Run one case on `target` and check its answer."""
    started = time.monotonic()
    result = CaseResult(id=case.id, input=case.input, member=case.member)
    try:
        with anyio.fail_after(timeout):
            outcome: Outcome = await target(case, timeout=timeout)
    except TimeoutError:
        result.error = f"no answer within {timeout:g}s"
    except UsageError:
        raise  # the eval is set up wrong (no such member): every case would fail the same
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    else:
        result.answer, result.stop_reason = outcome.answer, outcome.stop_reason
        result.detail, result.steps, result.tool_calls = (
            outcome.detail,
            outcome.steps,
            outcome.tool_calls,
        )
        result.tokens, result.cost = outcome.tokens, outcome.cost
        result.checks = await run_checks(case, outcome.answer or "", judge)
        passed = sum(1 for c in result.checks if c.passed)
        result.score = passed / len(result.checks)
        result.passed = passed == len(result.checks) and outcome.stop_reason in (None, "answer")
    result.duration = time.monotonic() - started
    return result


async def run_eval(
    cases: Sequence[Case],
    target: Target,
    *,
    concurrency: int = 4,
    timeout: float = 300.0,
    judge: Model | None = None,
    cases_from: str = "",
) -> EvalReport:
    """Run every case on `target`, at most `concurrency` at a time, each within `timeout`
    seconds; judge checks ask `judge`. The report keeps the cases' order."""
    if concurrency < 1:
        raise UsageError("concurrency must be at least 1")
    if needs_judge(cases) and judge is None:
        raise UsageError(
            "some cases have judge checks: name the judge model (--judge openai, or module:object)"
        )
    started = time.monotonic()
    report = EvalReport(
        target=target.name,
        cases_from=cases_from,
        started=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    results: list[CaseResult | None] = [None] * len(cases)
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(index: int, case: Case) -> None:
        async with limiter:
            results[index] = await run_case(case, target, timeout=timeout, judge=judge)

    try:
        async with anyio.create_task_group() as tg:
            for index, case in enumerate(cases):
                tg.start_soon(one, index, case)
    except BaseExceptionGroup as group:  # a mistake in the setup, found by the first case
        mistakes = group.subgroup(UsageError)
        if mistakes is None:
            raise
        mistake: BaseException = mistakes
        while isinstance(mistake, BaseExceptionGroup):
            mistake = mistake.exceptions[0]
        raise mistake from None
    report.cases = [r for r in results if r is not None]
    report.duration = time.monotonic() - started
    return report

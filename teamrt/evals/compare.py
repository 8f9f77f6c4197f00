"""Two eval reports side by side, case by case (matched by id).

Each case is `fixed` (failed before, passes now), `broke` (passed before, fails now),
`unchanged` (passes or fails in both; its score may still have moved), `added` (only in the
second run) or `removed` (only in the first). A comparison is a regression when a case broke
or a case's score went down.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

from teamrt.evals.report import one_line
from teamrt.evals.runner import CaseResult, EvalReport

Change = Literal["fixed", "broke", "unchanged", "added", "removed"]


class CaseChange(BaseModel):
    """One case in two runs."""

    id: str
    change: Change
    before: float | None  # score in the first run (None: not in it)
    after: float | None
    before_status: str | None = None  # pass, fail or error
    after_status: str | None = None
    why: str = ""  # for a case that now fails: its first failed check or its error

    @computed_field  # type: ignore[prop-decorator]
    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before


class Comparison(BaseModel):
    """Every case's change from run `a` to run `b`, and the overall scores."""

    a: str  # where each run came from (the report files)
    b: str
    score_a: float
    score_b: float
    cases: list[CaseChange] = Field(default_factory=list)

    def count(self, change: Change) -> int:
        return sum(1 for c in self.cases if c.change == change)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def regressed(self) -> bool:
        """A case broke, or a case's score went down."""
        return any(c.change == "broke" or (c.delta or 0.0) < 0 for c in self.cases)


def _why(result: CaseResult) -> str:
    if result.error is not None:
        return one_line(result.error)
    failed = next((c for c in result.checks if not c.passed), None)
    if failed is not None:
        return f"{failed.check}: {one_line(failed.detail)}" if failed.detail else failed.check
    if result.stop_reason not in (None, "answer"):
        return f"stopped ({result.stop_reason}): {one_line(result.detail)}"
    return ""


def compare(a: EvalReport, b: EvalReport, *, a_name: str = "a", b_name: str = "b") -> Comparison:
    """Case by case from `a` to `b`: in `a`'s order, then the cases only `b` has."""
    before = {c.id: c for c in a.cases}
    after = {c.id: c for c in b.cases}
    changes = []
    for case_id in [*before, *(i for i in after if i not in before)]:
        old, new = before.get(case_id), after.get(case_id)
        change: Change
        if old is None:
            change = "added"
        elif new is None:
            change = "removed"
        elif old.passed == new.passed:
            change = "unchanged"
        else:
            change = "fixed" if new.passed else "broke"
        changes.append(
            CaseChange(
                id=case_id,
                change=change,
                before=old.score if old is not None else None,
                after=new.score if new is not None else None,
                before_status=old.status if old is not None else None,
                after_status=new.status if new is not None else None,
                why=_why(new) if new is not None and not new.passed else "",
            )
        )
    return Comparison(a=a_name, b=b_name, score_a=a.score, score_b=b.score, cases=changes)


def format_comparison(comparison: Comparison) -> str:
    """The comparison as text: a headline, then one line per case (changed cases first)."""
    counts = ", ".join(
        f"{comparison.count(change)} {change}"
        for change in ("fixed", "broke", "unchanged", "added", "removed")
        if comparison.count(change) or change in ("fixed", "broke")
    )
    delta = comparison.score_b - comparison.score_a
    lines = [
        f"{comparison.a} -> {comparison.b}: {counts}; score {comparison.score_a:.2f} -> "
        f"{comparison.score_b:.2f} ({delta:+.2f})" + ("; REGRESSED" if comparison.regressed else "")
    ]
    order = {"broke": 0, "fixed": 1, "removed": 2, "added": 3, "unchanged": 4}
    width = max((len(c.id) for c in comparison.cases), default=4)
    for case in sorted(comparison.cases, key=lambda c: order[c.change]):
        before = "-" if case.before is None else f"{case.before:.2f}"
        after = "-" if case.after is None else f"{case.after:.2f}"
        moved = "" if case.delta is None or case.delta == 0 else f" ({case.delta:+.2f})"
        why = f"  {case.why}" if case.why else ""
        lines.append(f"  {case.change:9}  {case.id:{width}}  {before} -> {after}{moved}{why}")
    return "\n".join(lines)

"""The conductor's brakes, with no I/O: its budget, and the signs of a run going in circles.

A run goes in circles when work moves with no new check result: a subtask handed from worker
to worker (`bounce_cap` handoffs), or workers trading mail among themselves (`exchange_cap`
rounds of mail). A check result is new when it differs from that subtask's previous one (exit
code, error or output). What a brake shows a human is the tail of the exchange, as lines.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from teamrt.conductor.checks import Evidence
from teamrt.conductor.state import Decision
from teamrt.errors import LimitExceeded, UsageError

TAIL_LINES = 12  # lines of the exchange shown with a brake


@dataclass(frozen=True)
class Budget:
    """What a conductor may spend on its workers before the run stops with outcome `budget`.

    `max_cost` (USD) and `max_tokens` count what the workers' answers report; `max_worker_steps`
    counts their model steps on the conductor's subtasks (the conductor's own rounds are capped
    by `step_cap`). Checked before every assignment: work in flight is not interrupted by it.
    """

    max_cost: float | None = None
    max_tokens: int | None = None
    max_worker_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_cost", "max_tokens", "max_worker_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"Budget.{name} must not be negative (got {value})")

    def check(self, *, cost: float, tokens: int, worker_steps: int) -> None:
        """Raise `LimitExceeded` (with the numbers) if the next assignment would overspend."""
        spent = (
            ("conductor_max_cost", self.max_cost, round(cost, 6)),
            ("conductor_max_tokens", self.max_tokens, tokens),
            ("conductor_max_worker_steps", self.max_worker_steps, worker_steps),
        )
        for name, cap, used in spent:
            if cap is not None and used >= cap:
                raise LimitExceeded(name, cap, used, "the conductor's budget is spent:")


def fingerprint(evidence: Evidence) -> str:
    """What makes a check result the same as another: how it ended and what it said."""
    text = f"{evidence.exit_code}\0{evidence.error}\0{evidence.tail}"
    return hashlib.sha256(text.encode(errors="replace")).hexdigest()[:16]


def transcript_tail(
    decisions: Sequence[Decision],
    subtask: str,
    *,
    extra: Iterable[str] = (),
    lines: int = TAIL_LINES,
) -> list[str]:
    """The last `lines` decisions about `subtask` (who did what, the checks' verdicts), then
    `extra` lines (e.g. what the workers said in their mail rounds), one line each."""
    out = [_line(d) for d in decisions if d.subtask == subtask]
    out += [" ".join(e.split())[:300] for e in extra]
    return out[-lines:]


def _line(decision: Decision) -> str:
    detail = " ".join(decision.detail.split())[:300]
    verdict = f" [{decision.evidence.describe()}]" if decision.evidence is not None else ""
    return f"step {decision.step} {decision.by} {decision.action}: {detail}{verdict}"

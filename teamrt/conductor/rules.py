"""What the conductor does next, given the plan, the evidence and the brakes, with no I/O.

`Rules` is the conductor's judgement as values, in the spirit of `teamrt.agents.step`: it never
awaits and runs nothing. It is given the state (and the evidence of a check the driver ran) and
says what comes next: another wave of subtasks, the acceptance check, or a brake (`next`); what a
check's result means for a subtask (`check` and `integration`, each a `Ruling` the driver
records); whether a handoff or a round is one too many (`bounced`, `capped`); and which statuses
survive a new plan (`replanned`). The driver (`teamrt.conductor.conductor.Conductor`) does the
asking, the checking, the saving and the cancelling. The tests are table tests with no event loop
(tests/conductor/test_conductor_rules.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from teamrt.conductor.checks import Evidence
from teamrt.conductor.plan import Plan, Subtask, advance, pick
from teamrt.conductor.state import ConductorState

Verdict = Literal["done", "failed", "stuck", "check_error"]


def circling(why: str) -> str:
    """`why`, said of a brake that fired because nothing new came of the work."""
    return f"{why}, with no new check result"


@dataclass(frozen=True)
class Accept:
    """Every subtask is done: run the acceptance check."""


@dataclass(frozen=True)
class Stop:
    """End the run with `outcome`, for the reason in `detail`."""

    outcome: str
    detail: str


@dataclass(frozen=True)
class Wave:
    """Give these subtasks to workers, at once."""

    subtasks: tuple[Subtask, ...]


Next = Accept | Stop | Wave


@dataclass(frozen=True)
class Ruling:
    """What a check's result means for a subtask: the lifecycle event, the decision to record
    (its action and detail), and the round's verdict, or None when the next check decides.
    `feedback` goes back to the worker; `why`, if set, is why a human must be asked now."""

    event: str
    action: str
    detail: str
    verdict: Verdict | None = None
    feedback: str = ""
    why: str | None = None


@dataclass(frozen=True)
class Rules:
    """The conductor's caps: `parallel` subtasks at once, `step_cap` rounds in all, `round_cap`
    rounds of one subtask and `bounce_cap` handoffs of it before a human is asked."""

    parallel: int
    step_cap: int
    round_cap: int
    bounce_cap: int

    def next(self, state: ConductorState) -> Next:
        """What the run does now that no subtask is in flight."""
        if all(v == "done" for v in state.statuses.values()):
            return Accept()
        if state.step >= self.step_cap:
            return Stop("step cap", f"step cap {self.step_cap} reached")
        chosen = pick(state.plan, state.statuses, limit=self.parallel)
        if not chosen:
            return Stop("blocked", "nothing is ready and nothing runs")
        return Wave(tuple(chosen))

    def bounced(self, state: ConductorState, sid: str, worker: str) -> str | None:
        """Why giving `sid` to `worker` would be one handoff too many, if it would."""
        previous = state.assignees.get(sid)
        if previous is None or previous == worker:
            return None
        if state.handoffs.get(sid, 0) + 1 < self.bounce_cap:
            return None
        return circling(
            f"it went from worker to worker {state.handoffs.get(sid, 0)} times and would go "
            f"from {previous} to {worker} again"
        )

    def capped(self, state: ConductorState, sid: str) -> str | None:
        """Why `sid` goes to a human after a round that did not finish it, if it does."""
        rounds = state.rounds.get(sid, 0)
        if rounds >= self.round_cap:
            return f"it failed {rounds} rounds (round cap {self.round_cap})"
        return None


def check(subtask: Subtask, evidence: Evidence) -> Ruling:
    """What the result of the subtask's own check means; a pass leaves it to integration."""
    if evidence.error is not None:
        why = f"its check could not run: {evidence.error}"
        return Ruling("check_error", "check error", evidence.error, "check_error", why=why)
    if not evidence.passed:
        feedback = f"The check `{subtask.check}` failed:\n{evidence.tail}"
        return Ruling("fail", "verify", "check failed", "failed", feedback)
    return Ruling("pass", "verify", "check passed")


def integration(evidence: Evidence | None) -> Ruling:
    """What the integration check's result means (None: the plan has no integration check)."""
    if evidence is None:
        return Ruling("integrate", "integrate", "no integration check", "done")
    if evidence.error is not None:
        why = f"the integration check could not run: {evidence.error}"
        detail = f"integration: {evidence.error}"
        return Ruling("check_error", "check error", detail, "check_error", why=why)
    if evidence.passed:
        return Ruling("integrate", "integrate", "integration check passed", "done")
    feedback = "Your piece passes its own check but breaks the integration check:\n" + evidence.tail
    return Ruling("conflict", "conflict", "integration check failed", "failed", feedback)


def replanned(old: Plan, new: Plan, statuses: Mapping[str, str]) -> dict[str, str]:
    """The statuses under `new`: unchanged done work stands; changed work starts again."""
    before_plan = {s.id: s for s in old.subtasks}
    result: dict[str, str] = {}
    for s in new.subtasks:
        before = statuses.get(s.id, "pending")
        kept = before == "pending" or (before == "done" and before_plan.get(s.id) == s)
        result[s.id] = before if kept else advance(before, "reset")
    return result

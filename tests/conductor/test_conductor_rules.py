"""The conductor's pure parts under its driver, as tables with no event loop: what comes next
(`Rules.next`), the handoff and round caps, what a check's result means (`check`,
`integration`), which statuses survive a replan, and the ledger that records and saves them."""

from __future__ import annotations

from pathlib import Path

import pytest

from teamrt.conductor import ConductorState, Decision, Evidence, Plan, Subtask, advance
from teamrt.conductor.ledger import Ledger
from teamrt.conductor.rules import (
    Accept,
    Rules,
    Ruling,
    Stop,
    Wave,
    check,
    circling,
    integration,
    replanned,
)

RULES = Rules(parallel=2, step_cap=5, round_cap=3, bounce_cap=2)


def sub(id_: str, *deps: str, check: str = "true") -> Subtask:
    return Subtask(id=id_, description=f"make {id_}", check=check, depends_on=deps)


def state(statuses: dict[str, str], *subtasks: Subtask, step: int = 0) -> ConductorState:
    subtasks = subtasks or tuple(sub(sid) for sid in statuses)
    plan = Plan(subtasks=subtasks, acceptance_check="true")
    return ConductorState(goal="g", plan=plan, statuses=statuses, step=step)


def red(tail: str = "boom") -> Evidence:
    return Evidence(command="c", exit_code=1, tail=tail)


GREEN = Evidence(command="c", exit_code=0, tail="")
ERROR = Evidence(command="c", exit_code=None, tail="", error="not allowed")


# --- what comes next --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statuses", "step", "expected"),
    [
        ({"a": "done", "b": "done"}, 0, Accept()),
        ({"a": "done", "b": "done"}, 99, Accept()),  # done work is accepted even at the cap
        ({"a": "pending", "b": "done"}, 5, Stop("step cap", "step cap 5 reached")),
        ({"a": "escalated", "b": "done"}, 0, Stop("blocked", "nothing is ready and nothing runs")),
        ({"a": "pending", "b": "pending"}, 4, Wave((sub("a"), sub("b")))),
        ({"a": "assigned", "b": "pending"}, 0, Wave((sub("b"),))),
    ],
)
def test_next(statuses: dict[str, str], step: int, expected: object) -> None:
    assert RULES.next(state(statuses, step=step)) == expected


def test_a_wave_is_what_unblocks_most_first_and_no_more_than_parallel() -> None:
    plan = (sub("a"), sub("b"), sub("c", "b"), sub("d"))
    given = state({"a": "pending", "b": "pending", "c": "pending", "d": "pending"}, *plan)
    assert RULES.next(given) == Wave((sub("b"), sub("a")))
    blocked = state({"a": "done", "b": "failed", "c": "pending", "d": "done"}, *plan)
    assert RULES.next(blocked) == Stop("blocked", "nothing is ready and nothing runs")


# --- the caps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignee", "handoffs", "worker", "bounced"),
    [
        (None, 0, "w1", False),  # never given to anyone
        ("w1", 5, "w1", False),  # the same worker again is no handoff
        ("w1", 0, "w2", False),  # the first handoff: under a cap of 2
        ("w1", 1, "w2", True),  # the second would reach it
    ],
)
def test_bounced(assignee: str | None, handoffs: int, worker: str, bounced: bool) -> None:
    given = state({"a": "failed"})
    if assignee is not None:
        given.assignees["a"] = assignee
    given.handoffs["a"] = handoffs
    why = RULES.bounced(given, "a", worker)
    if not bounced:
        assert why is None
    else:
        assert why == circling(
            f"it went from worker to worker {handoffs} times and would go "
            f"from {assignee} to {worker} again"
        )


@pytest.mark.parametrize(("rounds", "capped"), [(0, False), (2, False), (3, True), (4, True)])
def test_capped(rounds: int, capped: bool) -> None:
    given = state({"a": "failed"})
    given.rounds["a"] = rounds
    expected = f"it failed {rounds} rounds (round cap 3)" if capped else None
    assert RULES.capped(given, "a") == expected


# --- what a check means -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (GREEN, Ruling("pass", "verify", "check passed")),
        (
            red("nope"),
            Ruling("fail", "verify", "check failed", "failed", "The check `true` failed:\nnope"),
        ),
        (
            ERROR,
            Ruling(
                "check_error",
                "check error",
                "not allowed",
                "check_error",
                why="its check could not run: not allowed",
            ),
        ),
    ],
)
def test_check(evidence: Evidence, expected: Ruling) -> None:
    assert check(sub("a"), evidence) == expected


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (None, Ruling("integrate", "integrate", "no integration check", "done")),
        (GREEN, Ruling("integrate", "integrate", "integration check passed", "done")),
        (
            red("seam"),
            Ruling(
                "conflict",
                "conflict",
                "integration check failed",
                "failed",
                "Your piece passes its own check but breaks the integration check:\nseam",
            ),
        ),
        (
            ERROR,
            Ruling(
                "check_error",
                "check error",
                "integration: not allowed",
                "check_error",
                why="the integration check could not run: not allowed",
            ),
        ),
    ],
)
def test_integration(evidence: Evidence | None, expected: Ruling) -> None:
    assert integration(evidence) == expected


@pytest.mark.parametrize("evidence", [GREEN, red(), ERROR])
def test_every_ruling_is_a_legal_move(evidence: Evidence) -> None:
    after_check = advance("submitted", check(sub("a"), evidence).event)
    assert after_check in ("verified", "failed", "check_error")
    for integrated in (evidence, None):
        assert advance("verified", integration(integrated).event) in (
            "done",
            "failed",
            "check_error",
        )


# --- replanning -------------------------------------------------------------------------------


def test_replanned_keeps_unchanged_done_work_and_restarts_the_rest() -> None:
    old = Plan(subtasks=(sub("a"), sub("b"), sub("c")), acceptance_check="true")
    new = Plan(
        subtasks=(sub("a"), sub("b", check="false"), sub("c"), sub("d")), acceptance_check="true"
    )
    statuses = {"a": "done", "b": "done", "c": "pending"}
    assert replanned(old, new, statuses) == {
        "a": "done",  # unchanged: it stands
        "b": "pending",  # its check changed: it starts again
        "c": "pending",
        "d": "pending",  # new
    }


# --- the ledger -------------------------------------------------------------------------------


def test_the_ledger_saves_each_change_and_shows_each_decision_once(tmp_path: Path) -> None:
    shown: list[Decision] = []
    path = tmp_path / "conductor" / "state.json"
    ledger = Ledger(path, shown.append)
    ledger.state = state({"a": "pending", "b": "pending"})
    ledger.move("a", "assign")
    ledger.current.decide("conductor", "assign", "a", "to w1")
    ledger.save()
    ledger.save()
    assert [d.action for d in shown] == ["assign"]
    ledger.take_back("the run stopped: budget")
    ledger.stop("budget", "spent")
    saved = ConductorState.load(path)
    assert saved is not None
    assert saved.statuses == {"a": "pending", "b": "pending"}
    assert saved.outcome == "budget"
    assert [d.action for d in shown] == ["assign", "take back", "brake"]
    assert shown[1].detail == "was assigned: the run stopped: budget"

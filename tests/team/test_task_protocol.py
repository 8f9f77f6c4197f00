"""The task protocol's decisions as tables, with no event loop (teamrt.team.task_protocol)."""

from __future__ import annotations

import pytest

from teamrt.agents.state import AgentState, Stop
from teamrt.envelopes import Envelope
from teamrt.errors import StopRequested, TaskWithdrawn
from teamrt.team.task_protocol import (
    ROUND,
    Move,
    gives_up,
    interrupted,
    is_round,
    next_move,
    queued_withdrawal,
    stop_between_steps,
)

MOVES: list[tuple[bool, bool, bool, bool, Move]] = [
    # resume_round, queued, mail_wakes, idle -> move
    (True, True, True, False, "resume_round"),
    (True, False, False, True, "resume_round"),
    (False, True, True, False, "work"),
    (False, True, False, True, "work"),
    (False, False, True, True, "round"),
    (False, False, True, False, "round"),
    (False, False, False, False, "announce"),
    (False, False, False, True, "wait"),
]


@pytest.mark.parametrize(("resume_round", "queued", "mail_wakes", "idle", "move"), MOVES)
def test_the_next_move_puts_what_was_interrupted_then_tasks_then_mail_first(
    resume_round: bool, queued: bool, mail_wakes: bool, idle: bool, move: Move
) -> None:
    assert (
        next_move(resume_round=resume_round, queued=queued, mail_wakes=mail_wakes, idle=idle)
        == move
    )


def _state(task_id: str | None, *, stopped: bool = False, steps: int = 0) -> AgentState:
    stop = Stop(reason="answer", detail="") if stopped else None
    return AgentState(agent="w", task="", messages=[], task_id=task_id, steps=steps, stop=stop)


@pytest.mark.parametrize(
    ("state", "left"),
    [
        (None, None),
        (_state(None), None),
        (_state("t1", stopped=True), None),
        (_state("t1"), "t1"),
        (_state(ROUND + "x"), ROUND + "x"),
    ],
)
def test_only_an_unfinished_task_is_interrupted(state: AgentState | None, left: str | None) -> None:
    assert interrupted(state) == left


@pytest.mark.parametrize(
    ("task_id", "round_"), [(None, False), ("t1", False), (ROUND + "abc", True)]
)
def test_a_round_of_mail_is_known_by_its_id(task_id: str | None, round_: bool) -> None:
    assert is_round(task_id) is round_


SHUTDOWN = Envelope.message("lead", "w", "stop")
WITHDRAWAL = Envelope.message("boss", "w", "withdraw")


@pytest.mark.parametrize(
    ("shutdown", "withdrawal", "kind", "text"),
    [
        (None, None, None, ""),
        (SHUTDOWN, None, StopRequested, "shutdown requested by lead"),
        (SHUTDOWN, WITHDRAWAL, StopRequested, "shutdown requested by lead"),
        (None, WITHDRAWAL, TaskWithdrawn, "withdrawn by boss after 3 steps"),
    ],
)
def test_a_shutdown_comes_before_a_withdrawal_at_a_step_boundary(
    shutdown: Envelope | None,
    withdrawal: Envelope | None,
    kind: type[Exception] | None,
    text: str,
) -> None:
    stop = stop_between_steps(shutdown, withdrawal, 3)
    if kind is None:
        assert stop is None
    else:
        assert isinstance(stop, kind)
        assert str(stop).startswith(text)


@pytest.mark.parametrize(
    ("state", "detail", "started"),
    [
        (None, "withdrawn before it started: never ran", False),
        (_state("other"), "withdrawn before it started: never ran", False),
        (_state("t1", stopped=True), "withdrawn before it started: never ran", False),
        (
            _state("t1", steps=4),
            "withdrawn after 4 steps (cut short by a restart): not resumed",
            True,
        ),
    ],
)
def test_a_queued_withdrawal_forgets_only_a_task_an_earlier_incarnation_started(
    state: AgentState | None, detail: str, started: bool
) -> None:
    assert queued_withdrawal("t1", "withdrawn", state) == (detail, started)


@pytest.mark.parametrize(
    ("cancelled", "restarting", "tries", "gives"),
    [
        (False, True, 1, False),
        (False, True, 2, False),
        (False, True, 3, True),
        (False, False, 1, True),
        (True, True, 1, True),
    ],
)
def test_a_crash_gives_up_on_a_cancelled_task_a_last_incarnation_or_the_last_try(
    cancelled: bool, restarting: bool, tries: int, gives: bool
) -> None:
    assert (
        gives_up(cancelled=cancelled, restarting=restarting, tries=tries, task_attempts=3) is gives
    )

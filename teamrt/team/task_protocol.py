"""The task protocol's decisions, pure: what an incarnation does next, what it does with a
shutdown or a withdrawal between two steps, what a crash does to the task it was on.

Nothing here touches the mailboxes or an event loop: the runner gathers the facts (its desk,
its agent's state), asks, and performs what it is told (tests/team/test_task_protocol.py holds
the rules as tables).
"""

from __future__ import annotations

from typing import Literal

from teamrt.agents.state import AgentState
from teamrt.envelopes import Envelope
from teamrt.errors import StopRequested, TaskWithdrawn

ROUND = "round:"  # task ids of rounds of mail start with this

#: What a serving incarnation does next: resume the interrupted round of mail, work the next
#: queued task, start a round of mail, announce itself idle, or wait on its desk.
Move = Literal["resume_round", "work", "round", "announce", "wait"]


def interrupted(state: AgentState | None) -> str | None:
    """The task (or round of mail) an earlier incarnation left unfinished, if any."""
    if state is None or state.stop is not None or state.task_id is None:
        return None
    return state.task_id


def is_round(task_id: str | None) -> bool:
    """Whether `task_id` names a round of mail rather than a task."""
    return task_id is not None and task_id.startswith(ROUND)


def next_move(*, resume_round: bool, queued: bool, mail_wakes: bool, idle: bool) -> Move:
    """The next move of a serving incarnation: what was interrupted first, then queued tasks,
    then mail that wakes it (or a full desk), then the idle notice, then waiting."""
    if resume_round:
        return "resume_round"
    if queued:
        return "work"
    if mail_wakes:
        return "round"
    if not idle:
        return "announce"
    return "wait"


def stop_between_steps(
    shutdown: Envelope | None, withdrawal: Envelope | None, steps: int
) -> Exception | None:
    """What ends the agent's run at a step boundary: a shutdown first, then the withdrawal of
    the task it is on; None to go on."""
    if shutdown is not None:
        return StopRequested(f"shutdown requested by {shutdown.sender}")
    if withdrawal is not None:
        return TaskWithdrawn(
            f"withdrawn by {withdrawal.sender} after {steps} steps: stopped at a step boundary"
        )
    return None


def queued_withdrawal(task_id: str, who: str, state: AgentState | None) -> tuple[str, bool]:
    """A withdrawn task dropped from the queue: the detail its `cancelled` answer gives, and
    whether an earlier incarnation had started it (then it must be forgotten, not resumed)."""
    if state is not None and state.task_id == task_id and state.stop is None:
        return f"{who} after {state.steps} steps (cut short by a restart): not resumed", True
    return f"{who} before it started: never ran", False


def gives_up(*, cancelled: bool, restarting: bool, tries: int, task_attempts: int) -> bool:
    """Whether a crash gives up on the task (or round of mail) it was on, rather than leave it
    for the next incarnation: a cancelled (hung) one, one with no next incarnation, or one
    tried as often as its policy allows."""
    return cancelled or not restarting or tries >= task_attempts

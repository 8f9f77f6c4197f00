"""Deadlines of an agent's run: the timer of its model calls, and what is left of its time.

`CallDeadlines` puts one call after another (a run's model calls) on one timer. `RunTime`
says how long until the nearest deadline (the run's own, or a shared budget's) and which one
it is, so that a call cut short by it can say which passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import Any

import anyio

from teamrt.agents.limits import Limits
from teamrt.errors import LimitExceeded

#: Says which deadline passed, given what was running then ("during a model call").
Passed = Callable[[str], LimitExceeded]

UNBOUNDED = contextlib.nullcontext()


def within(seconds: float) -> contextlib.AbstractContextManager[Any]:
    """A cancel scope that ends its block after `seconds`, or none at all when there is no
    bound: an outer cancellation reaches the block the same either way, and most steps have
    no deadline to keep."""
    return anyio.move_on_after(seconds) if seconds < math.inf else UNBOUNDED


class RunTime:
    """A run's time: `elapsed()` seconds so far, and what is left of it before the nearest
    deadline (the run's own in `limits`, or a shared budget's `time_left()`)."""

    __slots__ = ("_own", "budget", "elapsed", "limits")

    def __init__(self, limits: Limits, budget: Any, elapsed: Callable[[], float]) -> None:
        self.limits = limits
        self.budget = budget
        self.elapsed = elapsed
        self._own: Passed = self.deadline_passed

    def deadline_passed(self, during: str) -> LimitExceeded:
        """The error of the run's own deadline, passed `during` a call."""
        return LimitExceeded(
            "deadline",
            self.limits.deadline or 0.0,
            round(self.elapsed(), 3),
            f"the wall-clock deadline (s) passed {during}:",
        )

    def left(self) -> tuple[float, Passed]:
        """Seconds until the nearest deadline, and the error that says which one passed,
        given what was running."""
        limits, budget = self.limits, self.budget
        if limits.deadline is None and budget is None:
            return math.inf, self._own  # (never called: there is no deadline)
        left, which = math.inf, "deadline"
        if limits.deadline is not None:
            left = limits.deadline - self.elapsed()
        shared = getattr(budget, "time_left", None)
        team_left = shared() if shared is not None else None
        if team_left is not None and team_left < left:
            left, which = team_left, "team_deadline"
        if which == "deadline" or shared is None:
            return max(0.0, left), self._own

        def passed(during: str) -> LimitExceeded:
            deadline = getattr(budget, "deadline", 0.0) or 0.0
            return LimitExceeded(
                "team_deadline",
                deadline,
                round(deadline - (shared() or 0.0), 3),
                f"the team's wall-clock deadline (s) passed {during}:",
            )

        return max(0.0, left), passed


class CallDeadlines:
    """Deadlines of one call after another (a run's model calls) on one timer, not one each.

    `start(seconds)` says a call of the running task starts now and must end within `seconds`;
    `finish()` says it is over. The timer is set for the earliest deadline noted; when it fires,
    the call running then is cancelled if its own deadline has passed, or the timer is set again
    for that deadline; a call that ended in time leaves the timer for the next call. So a step
    that ends well within its deadline schedules and cancels no timer, and makes no
    `asyncio.Timeout` to enter and leave: the cancellation is made and taken back here the way
    `asyncio.timeout` does it (`Task.cancel`, then `Task.uncancel`, counted against the task's
    cancellations when the call started, so that a cancellation from elsewhere stays one).
    """

    def __init__(self) -> None:
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._when = math.inf
        self._cancelling = 0  # the task's pending cancellations when its call started
        self._cancelled = False  # this timer cancelled the running call

    def start(self, seconds: float) -> None:
        """A call of the running task starts, to end within `seconds` (finite)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a model call's deadline needs a task")  # pragma: no cover
        self._task, self._when = task, loop.time() + seconds
        self._cancelling, self._cancelled = task.cancelling(), False
        handle = self._handle
        if handle is None or handle.when() > self._when:
            if handle is not None:
                handle.cancel()
            self._handle = loop.call_at(self._when, self._fire)

    def finish(self) -> bool:
        """The call that started last is over (the timer, if set, stays for the next one).
        True if its deadline cancelled it and no other cancellation of the task is pending:
        its `CancelledError` is then the deadline's, to be taken as a timeout."""
        task, self._task = self._task, None
        if not self._cancelled or task is None:
            return False
        self._cancelled = False
        return task.uncancel() <= self._cancelling

    def close(self) -> None:
        """No more calls: the timer is cancelled."""
        self._task = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        task = self._task
        if task is None or self._cancelled:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._when:
            self._cancelled = True
            task.cancel()
        else:  # set for an earlier call's deadline: this call's is later
            self._handle = loop.call_at(self._when, self._fire)

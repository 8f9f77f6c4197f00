"""The conductor's state as the run changes it: each change saved to disk at once, each new
decision shown to whoever watches (`on_decision`), and the lifecycle moves and stops recorded
the same way by every part of the conductor."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from teamrt.conductor.plan import advance
from teamrt.conductor.state import ConductorState, Decision

log = logging.getLogger("teamrt.conductor")


class Ledger:
    """The state of one run (None until the run loads or makes it), saved to `path`."""

    def __init__(self, path: Path, on_decision: Callable[[Decision], None] | None) -> None:
        self.path = path
        self.on_decision = on_decision
        self.state: ConductorState | None = None
        self._shown = 0

    @property
    def current(self) -> ConductorState:
        """The run's state; only asked for once the run has one."""
        assert self.state is not None
        return self.state

    def save(self) -> None:
        """Write the state to disk and show the decisions not yet shown."""
        state = self.current
        state.save(self.path)
        if self.on_decision is not None:
            while self._shown < len(state.decisions):
                self.on_decision(state.decisions[self._shown])
                self._shown += 1

    def move(self, subtask_id: str, event: str) -> None:
        """Move a subtask along its lifecycle (an illegal move raises)."""
        state = self.current
        state.statuses[subtask_id] = advance(state.statuses.get(subtask_id, "pending"), event)

    def stop(self, outcome: str, detail: str) -> None:
        """End the run with `outcome`: recorded, saved, and said in the log unless a human
        aborted it (they know)."""
        state = self.current
        state.outcome = outcome
        state.decide("conductor", "brake", detail=detail)
        self.save()
        if outcome != "aborted":
            log.warning("the conductor stopped the run (%s): %s", outcome, detail)

    def take_back(self, why: str) -> None:
        """Take back every subtask in flight (not done, pending or with a human)."""
        state = self.current
        for sid, status in state.statuses.items():
            if status not in ("done", "pending", "escalated"):
                state.statuses[sid] = advance(status, "take_back")
                state.decide("conductor", "take back", sid, f"was {status}: {why}")
        self.save()

"""The conductor's state on disk (`conductor/state.json`): the goal, the plan, each subtask's
status and rounds, every decision with who made it and the evidence, and the spending. It is
replaced atomically after every decision, so a conductor killed mid-run resumes from it without
redoing accepted work."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from teamrt.conductor.checks import Evidence
from teamrt.conductor.plan import Plan
from teamrt.private_files import make_dirs, write_private


class Decision(BaseModel):
    step: int
    by: str  # "conductor", a worker's name, or "human"
    subtask: str | None = None
    action: str  # assign, verify, integrate, retry, escalate, resolve, accept, replan, ...
    detail: str = ""
    evidence: Evidence | None = None
    transcript: list[str] | None = None  # for a brake: the tail of the exchange that led to it


class ConductorState(BaseModel):
    goal: str
    plan: Plan
    statuses: dict[str, str] = Field(default_factory=dict)
    rounds: dict[str, int] = Field(default_factory=dict)
    decisions: list[Decision] = Field(default_factory=list)
    step: int = 0
    replans: int = 0
    tokens: int = 0
    cost: float = 0.0
    worker_steps: int = 0
    assignees: dict[str, str] = Field(default_factory=dict)  # who has (or last had) a subtask
    handoffs: dict[str, int] = Field(default_factory=dict)  # to another worker, no new result
    last_checks: dict[str, str] = Field(default_factory=dict)  # fingerprint of the last check
    #: accepted, budget, step cap, blocked, aborted, acceptance failed, check error, no workers
    outcome: str | None = None

    def decide(
        self,
        by: str,
        action: str,
        subtask: str | None = None,
        detail: str = "",
        evidence: Evidence | None = None,
        transcript: list[str] | None = None,
    ) -> Decision:
        decision = Decision(
            step=self.step,
            by=by,
            subtask=subtask,
            action=action,
            detail=detail,
            evidence=evidence,
            transcript=transcript,
        )
        self.decisions.append(decision)
        return decision

    def save(self, path: Path) -> None:
        make_dirs(path.parent)
        tmp = path.with_suffix(".json.tmp")
        write_private(tmp, self.model_dump_json(indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ConductorState | None:
        try:
            return cls.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None

"""Plans and the subtask lifecycle, with no I/O.

A plan is a list of subtasks, each with a check command and dependencies, plus the integration
check (the seams between pieces) and the acceptance check (the goal itself). Validation rejects
a subtask without a check, an unknown dependency, a cycle and a duplicate id, naming the culprit.
The lifecycle is one transition table; an illegal move raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from teamrt.errors import IllegalTransition as IllegalTransition
from teamrt.errors import PlanError as PlanError


class Subtask(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=64)
    description: str
    check: str  # a command whose exit code says done (0) or not
    depends_on: tuple[str, ...] = ()
    role: str | None = None  # which teammate should do it (any, if None)


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    subtasks: tuple[Subtask, ...]
    integration_check: str | None = None
    acceptance_check: str

    @classmethod
    def parse(cls, data: str | Mapping[str, Any]) -> Plan:
        """A plan from JSON text or a dict, validated (raises PlanError)."""
        try:
            raw = json.loads(data) if isinstance(data, str) else dict(data)
            plan = cls.model_validate(raw)
        except (ValueError, ValidationError) as exc:
            raise PlanError(f"not a plan: {exc}") from None
        return plan.validated()

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan from a JSON or YAML file (YAML needs PyYAML: `pip install 'teamrt[yaml]'`)."""
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlanError(f"{source}: no such plan file; check the path") from None
        except IsADirectoryError:
            raise PlanError(f"{source}: is a directory, not a plan file; name the file") from None
        except UnicodeDecodeError as exc:
            raise PlanError(f"{source}: not UTF-8 text ({exc.reason}); save it as UTF-8") from None
        except OSError as exc:
            raise PlanError(f"{source}: cannot be read ({exc.strerror or exc})") from None
        if source.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise PlanError(
                    f"{source}: reading YAML needs PyYAML (pip install 'teamrt[yaml]')"
                ) from None
            try:
                return cls.parse(yaml.safe_load(text))
            except yaml.YAMLError as exc:
                raise PlanError(f"{source}: not YAML: {exc}") from None
        return cls.parse(text)

    def validated(self) -> Plan:
        ids = [s.id for s in self.subtasks]
        seen: set[str] = set()
        for s in self.subtasks:
            if s.id in seen:
                raise PlanError(f"subtask id {s.id!r} is used twice")
            seen.add(s.id)
            if not s.check.strip():
                raise PlanError(
                    f"subtask {s.id!r} has no check command: a subtask that cannot "
                    "be checked cannot be accepted"
                )
            for dep in s.depends_on:
                if dep not in ids:
                    raise PlanError(
                        f"subtask {s.id!r} depends on {dep!r}, which is not in the plan"
                    )
        cycle = _find_cycle(self.subtasks)
        if cycle:
            raise PlanError("the dependencies form a cycle: " + " -> ".join(cycle))
        if not self.subtasks:
            raise PlanError("the plan has no subtasks")
        return self

    def get(self, subtask_id: str) -> Subtask:
        for s in self.subtasks:
            if s.id == subtask_id:
                return s
        raise KeyError(subtask_id)

    def unblocks(self, subtask_id: str) -> int:
        """How many subtasks wait on this one, directly or not."""
        waiting: set[str] = set()
        frontier = [subtask_id]
        while frontier:
            current = frontier.pop()
            for s in self.subtasks:
                if current in s.depends_on and s.id not in waiting:
                    waiting.add(s.id)
                    frontier.append(s.id)
        return len(waiting)


def _find_cycle(subtasks: Sequence[Subtask]) -> list[str]:
    deps = {s.id: s.depends_on for s in subtasks}
    state: dict[str, int] = {}  # 1: on the path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for dep in deps.get(node, ()):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for s in subtasks:
        if s.id not in state:
            found = visit(s.id)
            if found:
                return found
    return []


# --- the lifecycle --------------------------------------------------------------------------

Status = Literal[
    "pending",
    "assigned",
    "submitted",
    "verified",
    "done",
    "failed",
    "stuck",
    "check_error",
    "escalated",
]
Event = Literal[
    "assign",
    "submit",
    "pass",
    "fail",
    "check_error",
    "integrate",
    "conflict",
    "retry",
    "timeout",
    "escalate",
    "resolve",
    "take_back",
    "reset",
]

# Theory of operation. A subtask is assigned to a worker; the worker's answer submits it (or
# the worker hangs, fails or is braked: stuck). The conductor's own check then verifies it
# (red: failed; could not run at all: check_error), and the integration check makes it done
# (red: a conflict, failed again). Failed and stuck subtasks are retried, or escalated to a
# human, whose answer retries or resolves them; a check error is always escalated (retrying
# cannot make a missing command appear). `take_back` returns work in flight to pending when the
# run stops or resumes; `reset` starts it again after a replan.

#: (status, event) -> the next status. Nothing else is a legal move.
TRANSITIONS: dict[tuple[str, str], Status] = {
    ("pending", "assign"): "assigned",
    ("assigned", "submit"): "submitted",
    ("assigned", "timeout"): "stuck",
    ("submitted", "pass"): "verified",
    ("submitted", "fail"): "failed",
    ("submitted", "check_error"): "check_error",
    ("verified", "integrate"): "done",
    ("verified", "conflict"): "failed",
    ("verified", "check_error"): "check_error",
    ("failed", "retry"): "assigned",
    ("failed", "escalate"): "escalated",
    ("stuck", "retry"): "assigned",
    ("stuck", "escalate"): "escalated",
    ("check_error", "escalate"): "escalated",
    ("escalated", "retry"): "assigned",
    ("escalated", "resolve"): "done",
    **{
        (status, "take_back"): "pending"
        for status in (
            "assigned",
            "submitted",
            "verified",
            "failed",
            "stuck",
            "check_error",
            "escalated",
        )
    },
    **{
        (status, "reset"): "pending"  # a replan starts the work again
        for status in ("done", "failed", "stuck", "check_error", "escalated")
    },
}


def advance(status: str, event: str) -> Status:
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise IllegalTransition(f"a subtask cannot go from {status!r} on {event!r}") from None


def ready(plan: Plan, statuses: Mapping[str, str]) -> list[Subtask]:
    """Pending subtasks whose dependencies are all done, the one that unblocks most first."""
    out = [
        s
        for s in plan.subtasks
        if statuses.get(s.id, "pending") == "pending"
        and all(statuses.get(d) == "done" for d in s.depends_on)
    ]
    return sorted(out, key=lambda s: (-plan.unblocks(s.id), plan.subtasks.index(s)))


def pick(
    plan: Plan, statuses: Mapping[str, str], *, limit: int, busy: Iterable[str] = ()
) -> list[Subtask]:
    """Up to `limit` ready subtasks, minus what is already running."""
    running = sum(1 for v in statuses.values() if v == "assigned")
    room = max(0, limit - running)
    busy_set = set(busy)
    chosen = [s for s in ready(plan, statuses) if s.id not in busy_set]
    return chosen[:room]

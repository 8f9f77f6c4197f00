"""The conductor: plans of checkable subtasks, dispatched to teammates and verified by running
their checks, with integration and acceptance checks, brakes, and every decision on disk."""

from teamrt.conductor.brakes import Budget
from teamrt.conductor.checks import Evidence, Policy, run_check
from teamrt.conductor.conductor import Conductor
from teamrt.conductor.escalation import ANSWERS, Escalations
from teamrt.conductor.plan import (
    TRANSITIONS,
    IllegalTransition,
    Plan,
    PlanError,
    Subtask,
    advance,
    pick,
    ready,
)
from teamrt.conductor.state import ConductorState, Decision

__all__ = [
    "ANSWERS",
    "TRANSITIONS",
    "Budget",
    "Conductor",
    "ConductorState",
    "Decision",
    "Escalations",
    "Evidence",
    "IllegalTransition",
    "Plan",
    "PlanError",
    "Policy",
    "Subtask",
    "advance",
    "pick",
    "ready",
    "run_check",
]

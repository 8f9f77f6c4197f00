"""Teams: named teammates, each a persistent agent in its own task, on shared mailboxes.

- `team.py`: `Team`, the task group, a facade over `roster.py` (members as declared),
  `asking.py` (the lead's asks and pools), `supervision.py` (leases, incarnations, restarts,
  stops) and `waits.py` (the wait-for graph);
- `runner.py`: one incarnation of one teammate (its agent, the task protocol), given a
  `TeamContext` (`context.py`); the protocol's decisions pure in `task_protocol.py`, a
  streamed task's progress in `progress.py`, plan approval in `plans.py`, its agent and
  tools built in `equip.py`;
- `desk.py`: a teammate's inbox sorted into tasks, a shutdown and conversation mail;
- `protocol.py`: the envelope types and bodies; `config.py`: `Teammate`, `RestartPolicy`,
  `TeamBudget`, `MemberStatus`.
"""

from teamrt.team.config import (
    DEFAULT_WAKE_ON,
    MailKind,
    MemberState,
    MemberStatus,
    RestartPolicy,
    TeamBudget,
    Teammate,
)
from teamrt.team.lead import MAIL_BUFFERED, NO_HANDLER, NOTICES_KEPT, Handler
from teamrt.team.protocol import (
    BUSY,
    CRASHED,
    EXPIRED,
    IDLE,
    PLAN_APPROVAL,
    PLAN_DECISION,
    PROGRESS,
    PROTOCOL_TYPES,
    RESULT,
    SHUTDOWN,
    SHUTDOWN_ACK,
    STALE_SHUTDOWN,
    STREAMED_TASK,
    TASK,
    TEAMMATE_CRASHED,
    Approver,
    CrashBody,
    DecisionBody,
    IdleBody,
    PlanBody,
    ProgressBody,
    ShutdownBody,
    TaskResult,
)
from teamrt.team.team import Team

__all__ = [
    "BUSY",
    "CRASHED",
    "DEFAULT_WAKE_ON",
    "EXPIRED",
    "IDLE",
    "MAIL_BUFFERED",
    "NOTICES_KEPT",
    "NO_HANDLER",
    "PLAN_APPROVAL",
    "PLAN_DECISION",
    "PROGRESS",
    "PROTOCOL_TYPES",
    "RESULT",
    "SHUTDOWN",
    "SHUTDOWN_ACK",
    "STALE_SHUTDOWN",
    "STREAMED_TASK",
    "TASK",
    "TEAMMATE_CRASHED",
    "Approver",
    "CrashBody",
    "DecisionBody",
    "Handler",
    "IdleBody",
    "MailKind",
    "MemberState",
    "MemberStatus",
    "PlanBody",
    "ProgressBody",
    "RestartPolicy",
    "ShutdownBody",
    "TaskResult",
    "Team",
    "TeamBudget",
    "Teammate",
]

"""Teams: named teammates, each a persistent agent in its own task, on shared mailboxes.

- `team.py`: `Team`, the task group, supervision, the lead's inbox and pools;
- `runner.py`: one incarnation of one teammate (its agent, the task protocol);
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

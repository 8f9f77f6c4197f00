"""teamrt: an asyncio multi-agent runtime with durable, file-backed mailboxes.

The common path is one import: `from teamrt import Team, Teammate, Agent, tool, Limits,
ScriptedModel, OpenAIModel, ...`; every error is in `teamrt.errors`. The mailbox layer is
imported with the package; agents, models and teams (whose imports cost about a tenth of a
second) are loaded on first use, through the module's `__getattr__`, so `import teamrt` stays fast.
"""

from typing import TYPE_CHECKING, Any

import teamrt._posix  # noqa: F401  (first: off POSIX, fail saying so)
from teamrt.envelopes import (
    Broadcast,
    Envelope,
    ErrorBody,
    Message,
    Request,
    Response,
    new_id,
    payload,
    register_payload,
)
from teamrt.errors import (
    AgentStop,
    BlobTooLarge,
    DeliveryError,
    DiskFull,
    DurabilityError,
    EnvelopeTooLarge,
    InvalidName,
    LeaseLost,
    MailboxClosed,
    ModelError,
    OutcomeUnknown,
    PayloadError,
    ReceiveTimeout,
    RemoteError,
    RequestTimeout,
    StateError,
    StoreAuthFailed,
    StoreError,
    StoreOutage,
    StoreUnavailable,
    TeamKeyMismatch,
    TeamrtError,
    ToolFailure,
    UnknownRecipient,
    UsageError,
)
from teamrt.mail import (
    FileMailboxes,
    FileStore,
    Inbox,
    InboxStatistics,
    Mailboxes,
    MemoryMailboxes,
    MemoryStore,
    Store,
    TeamView,
    open_mailboxes,
    open_store,
    open_view,
)

if TYPE_CHECKING:
    from teamrt.agents import (
        Agent,
        Limits,
        MCPTools,
        Memory,
        RunReport,
        current_call_id,
        tool,
    )
    from teamrt.models import (
        ChatMessage,
        FunctionModel,
        ModelReply,
        OpenAIModel,
        ScriptedModel,
        ToolSpec,
        call,
    )
    from teamrt.team import (
        ProgressBody,
        RestartPolicy,
        TaskResult,
        Team,
        TeamBudget,
        Teammate,
    )

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentStop",
    "BlobTooLarge",
    "Broadcast",
    "ChatMessage",
    "DeliveryError",
    "DiskFull",
    "DurabilityError",
    "Envelope",
    "EnvelopeTooLarge",
    "ErrorBody",
    "FileMailboxes",
    "FileStore",
    "FunctionModel",
    "Inbox",
    "InboxStatistics",
    "InvalidName",
    "LeaseLost",
    "Limits",
    "MCPTools",
    "MailboxClosed",
    "Mailboxes",
    "Memory",
    "MemoryMailboxes",
    "MemoryStore",
    "Message",
    "ModelError",
    "ModelReply",
    "OpenAIModel",
    "OutcomeUnknown",
    "PayloadError",
    "ProgressBody",
    "ReceiveTimeout",
    "RemoteError",
    "Request",
    "RequestTimeout",
    "Response",
    "RestartPolicy",
    "RunReport",
    "ScriptedModel",
    "StateError",
    "Store",
    "StoreAuthFailed",
    "StoreError",
    "StoreOutage",
    "StoreUnavailable",
    "TaskResult",
    "Team",
    "TeamBudget",
    "TeamKeyMismatch",
    "TeamView",
    "Teammate",
    "TeamrtError",
    "ToolFailure",
    "ToolSpec",
    "UnknownRecipient",
    "UsageError",
    "__version__",
    "call",
    "current_call_id",
    "new_id",
    "open_mailboxes",
    "open_store",
    "open_view",
    "payload",
    "register_payload",
    "tool",
]

# name -> the module it is loaded from on first use
_LAZY = {
    "Agent": "teamrt.agents",
    "Limits": "teamrt.agents",
    "MCPTools": "teamrt.agents",
    "Memory": "teamrt.agents",
    "RunReport": "teamrt.agents",
    "current_call_id": "teamrt.agents",
    "tool": "teamrt.agents",
    "ChatMessage": "teamrt.models",
    "FunctionModel": "teamrt.models",
    "ModelReply": "teamrt.models",
    "OpenAIModel": "teamrt.models",
    "ScriptedModel": "teamrt.models",
    "ToolSpec": "teamrt.models",
    "call": "teamrt.models",
    "ProgressBody": "teamrt.team",
    "RestartPolicy": "teamrt.team",
    "TaskResult": "teamrt.team",
    "Team": "teamrt.team",
    "TeamBudget": "teamrt.team",
    "Teammate": "teamrt.team",
}


def __getattr__(name: str) -> Any:
    """Load a common-path name from its subpackage the first time it is asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'teamrt' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

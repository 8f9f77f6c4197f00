"""teamrt: an asyncio multi-agent runtime with durable, file-backed mailboxes."""

import logging

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
    DiskFull,
    DurabilityError,
    EnvelopeTooLarge,
    InvalidName,
    MailboxClosed,
    PayloadError,
    ReceiveTimeout,
    RemoteError,
    RequestTimeout,
    StoreError,
    TeamrtError,
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
)

__version__ = "0.1.0"

# a library logs, it does not decide where logs go: silent unless the application configures
# logging (the `teamrt` command does, with --log-level)
logging.getLogger("teamrt").addHandler(logging.NullHandler())

__all__ = [
    "Broadcast",
    "DiskFull",
    "DurabilityError",
    "Envelope",
    "EnvelopeTooLarge",
    "ErrorBody",
    "FileMailboxes",
    "FileStore",
    "Inbox",
    "InboxStatistics",
    "InvalidName",
    "MailboxClosed",
    "Mailboxes",
    "MemoryMailboxes",
    "MemoryStore",
    "Message",
    "PayloadError",
    "ReceiveTimeout",
    "RemoteError",
    "Request",
    "RequestTimeout",
    "Response",
    "Store",
    "StoreError",
    "TeamrtError",
    "UnknownRecipient",
    "UsageError",
    "__version__",
    "new_id",
    "payload",
    "register_payload",
]

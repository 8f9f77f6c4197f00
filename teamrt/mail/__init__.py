"""Mailboxes: the sans-IO log codec, the file store, the memory twin, and the async API."""

from teamrt.mail.filestore import FileStore
from teamrt.mail.mailboxes import FileMailboxes, Inbox, InboxStatistics, Mailboxes, MemoryMailboxes
from teamrt.mail.memory import MemoryStore
from teamrt.mail.store import InboxReader, Store

__all__ = [
    "FileMailboxes",
    "FileStore",
    "Inbox",
    "InboxReader",
    "InboxStatistics",
    "Mailboxes",
    "MemoryMailboxes",
    "MemoryStore",
    "Store",
]

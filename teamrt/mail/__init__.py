"""Mailboxes: the record format, the store seam, the file and memory stores, the async API."""

from teamrt.mail.filestore import FileMailboxes, FileStore, FileView
from teamrt.mail.filestore.export import InboxCut, export_team
from teamrt.mail.filestore.repair import repair_team
from teamrt.mail.locator import open_mailboxes, open_store, open_view
from teamrt.mail.mailboxes import Inbox, InboxStatistics, Mailboxes
from teamrt.mail.memory import MemoryMailboxes, MemoryStore
from teamrt.mail.store import Capabilities, InboxReader, Lease, Store, TeamView

__all__ = [
    "Capabilities",
    "FileMailboxes",
    "FileStore",
    "FileView",
    "Inbox",
    "InboxCut",
    "InboxReader",
    "InboxStatistics",
    "Lease",
    "Mailboxes",
    "MemoryMailboxes",
    "MemoryStore",
    "Store",
    "TeamView",
    "export_team",
    "open_mailboxes",
    "open_store",
    "open_view",
    "repair_team",
]

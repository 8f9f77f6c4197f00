"""The file store: the only code that touches inbox files and their locks.

Theory of operation. Each inbox is `inboxes/<agent>.jsonl`, appended to under an exclusive flock on
`inboxes/<agent>.lock` (a file that is never deleted). A process keeps the lock and log descriptors
open, up to its descriptor budget (descriptors.py: idle readers park, idle appenders are dropped, so
a process runs more members than it may open files). Under the lock an append fstats the log;
reopens it if it was rotated, deleted or replaced; if the size is not what this process last left,
seals a torn fragment with a newline and reads the next `seq` from the inbox's high-water mark (the
first bytes of the lock file, which every append overwrites: appender.py); rotates the log
into a numbered segment past the size limit (link, then rename a fresh file over the active name, so
the active file always exists); then writes one stamped line, looping over short writes and
truncating back to the old size on any error, and marks it. The common case is six syscalls (flock,
lseek, write, fstat, the mark's pwrite, unlock) run inline on the event loop; a contended lock is
first retried for an adaptive few microseconds (see `Appender.spin`), then waited for in a worker
thread. In `fsync` mode, senders
then share fdatasync calls (group commit) outside the lock.

Readers take no lock: they pread from their cursor, decode complete lines only, quarantine what
cannot be decoded, check the cursor against the log, and commit the cursor by overwriting the older
of its two checksummed slots. This package must never delete a lock file, truncate below a line
another writer completed, create an inbox for an unknown name, or open a file it creates through a
symbolic link.

    paths.py      the team directory's layout: where an inbox's files are, the active segment
    framing.py    lines into records (torn tails held back), the cursor file's two slots
    fileio.py     O_NOFOLLOW creation, atomic replace, directory checks, OSError translation
    descriptors.py the process's descriptor budget: what idle readers and appenders give back
    appender.py   the locked append (an adaptive spin on a contended lock), seq recovery, rotation
    reader.py     the owner's reader, cursor checks and commits, quarantine
    store.py      FileStore: directory, roster, leases, the inotify watches (wake-ups; the
                  change tracking behind the rescan of many inboxes)
    watch.py      the inotify dispatch loop
    view.py       FileView: the read-only view tools use; its scans cross rotations (dense)
    mailboxes.py  FileMailboxes: Mailboxes over a FileStore
    repair.py     `teamrt repair`: bring a damaged inbox back to its last good position
"""

from teamrt.mail.filestore.appender import TAIL_WINDOW as _TAIL_WINDOW
from teamrt.mail.filestore.leases import lease_holder
from teamrt.mail.filestore.mailboxes import FileMailboxes
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.reader import CURSOR_SLOT, FileReader, read_cursor
from teamrt.mail.filestore.store import DEFAULT_SEGMENT_BYTES, FileStore
from teamrt.mail.filestore.view import FileView

__all__ = [
    "CURSOR_SLOT",
    "DEFAULT_SEGMENT_BYTES",
    "_TAIL_WINDOW",
    "FileMailboxes",
    "FileReader",
    "FileStore",
    "FileView",
    "InboxPaths",
    "lease_holder",
    "read_cursor",
]

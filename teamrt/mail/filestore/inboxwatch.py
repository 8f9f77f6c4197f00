"""`InboxWatch`: the inotify watches on the inboxes this process reads, a `FileStore`'s watch
for other writers.

Two inotify instances, each a hint only (a reader that misses one still finds its records on
the next rescan): the per-file watches that wake receivers on the event loop, and the directory
watch `changed_inboxes` reads, which wakes nobody (see `InboxWatch.changed_inboxes`).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

from anyio.abc import TaskStatus

from teamrt.mail import inotify
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.watch import dispatch_forever
from teamrt.mail.store import Store
from teamrt.names import validate_name

# changed_inboxes(): the event inotify queues when it drops events (wd -1, IN_Q_OVERFLOW), and
# the name of an active log in an event (`<agent>.jsonl`, NUL-terminated, after a header)
_CHANGES_LOST = struct.pack("=iI", -1, inotify.IN_Q_OVERFLOW)
_ACTIVE_LOG = re.compile(rb"\x00([A-Za-z0-9][A-Za-z0-9_-]{0,63})\.jsonl\x00")


class InboxWatch:
    """The watches of one store object on its `inboxes/` directory. Where inotify fails (none
    on this system, out of instances or watches) it sets the store's `needs_polling`."""

    def __init__(self, store: Store, inboxes: Path) -> None:
        self.store = store
        self.inboxes = inboxes
        self.watched: dict[str, int] = {}
        self.inotify: inotify.Inotify | None = None
        self._notify: Callable[[str], None] | None = None
        self.changes: inotify.Inotify | None = None  # see changed_inboxes()
        self._changes_broken = False
        self._changes_gone = b""

    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        """See `Store.watch`."""
        if not inotify.available():
            task_status.started()
            return
        self._notify = notify
        try:
            watcher = inotify.Inotify()
        except OSError:  # out of inotify instances: fall back to polling
            self.store.needs_polling = True
            task_status.started()
            return
        self.inotify = watcher
        try:
            try:
                watcher.add_watch(
                    str(self.inboxes),
                    inotify.IN_CREATE | inotify.IN_MOVED_TO,
                    "",
                    self._on_dir_event,
                )
            except OSError:  # out of watches: poll instead
                self.store.needs_polling = True
                task_status.started()
                return
            for name in list(self.watched):
                self._watch_file(name)
            task_status.started()
            await dispatch_forever(watcher, self._on_overflow)
        finally:
            self.inotify = None
            watcher.close()

    def watch_inbox(self, name: str) -> None:
        """See `Store.watch_inbox`."""
        self.watched.setdefault(name, -1)
        if self.inotify is not None:
            self._watch_file(name)

    def _watch_file(self, name: str) -> None:
        """Watch `name`'s active file; the watch of a file rotated away is removed (inotify
        watches inodes, so it would otherwise stay until the process ends)."""
        assert self.inotify is not None
        assert self._notify is not None
        paths = InboxPaths(self.inboxes, validate_name(name))
        try:
            # IN_ATTRIB: a deleted log is a change too (a reader that caught up skips its reads
            # until something signals, and deleting a file writes nothing)
            wd = self.inotify.add_watch(
                str(paths.log), inotify.IN_MODIFY | inotify.IN_ATTRIB, name, self._notify
            )
        except OSError:
            return  # no such file (damage): the reader reports it, the rescan retries
        old = self.watched.get(name, -1)
        if old >= 0 and old != wd:
            self.inotify.rm_watch(old)
        self.watched[name] = wd

    def _on_dir_event(self, filename: str) -> None:
        name, _, rest = filename.partition(".")
        if rest == "jsonl" and name in self.watched and self._notify is not None:
            self._watch_file(name)  # a new active file after rotation
            self._notify(name)

    def _on_overflow(self) -> None:
        if self._notify is not None:
            for name in self.watched:
                self._notify(name)

    def changed_inboxes(self) -> set[str] | None:
        """See `Store.changed_inboxes`. A second inotify instance watches the `inboxes/`
        directory for writes to any file in it. It is never registered with the event loop, so
        it wakes nobody: the rescan reads what it queued (one `read` that finds nothing when
        nothing was written) and keeps the names of the active logs this process reads; after
        an overflow it starts afresh. It is independent of the per-file watches that wake
        receivers (another queue, no watch to move on rotation, no dispatch on the event loop),
        so a notification those lose is still seen here.

        Armed on first use only: a directory watch makes every write in `inboxes/` queue one
        more event, so a process that reads few inboxes, whose rescan checks each of them, never
        arms it."""
        if self.store.needs_polling or self._changes_broken:
            return None
        watcher = self.changes
        if watcher is None:
            self._arm_changes()
            return None  # what was written before it was armed is unknown
        changed: set[str] = set()
        while True:
            try:
                data = os.read(watcher.fd, 1 << 16)  # whole events only, as many as fit
            except BlockingIOError:
                break
            except OSError:
                data = _CHANGES_LOST
            if _CHANGES_LOST in data or self._changes_gone in data:
                # the queue overflowed (or the directory went): start with an empty one; the
                # caller checks every waiting inbox this time
                self._close_changes()
                self._arm_changes()
                return None
            # each event is a 16-byte header whose last byte before the name is 0 (a length
            # under 2**24), then the file name, NUL-padded: pick out the active logs' names
            changed.update(m.decode() for m in _ACTIVE_LOG.findall(data))
        return changed & self.watched.keys()

    def _arm_changes(self) -> None:
        try:
            watcher = inotify.Inotify()
        except OSError:  # out of inotify instances: the rescan checks every waiting inbox
            self._changes_broken = True
            return
        try:
            wd = watcher.add_watch(
                str(self.inboxes),
                inotify.IN_MODIFY | inotify.IN_MOVED_TO | inotify.IN_CREATE,
                "",
                lambda _: None,
            )
        except OSError:
            watcher.close()
            self._changes_broken = True
            return
        self.changes = watcher
        self._changes_gone = struct.pack("=iI", wd, inotify.IN_IGNORED)

    def _close_changes(self) -> None:
        if self.changes is not None:
            self.changes.close()
            self.changes = None

    def close(self) -> None:
        """Close the directory watch of `changed_inboxes` (the store may be opened again)."""
        self._close_changes()
        self._changes_broken = False

    def count(self) -> int:
        """Inotify watches held (one per inbox read, plus the directory)."""
        return 0 if self.inotify is None else self.inotify.count()

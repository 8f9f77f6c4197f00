"""A minimal Linux inotify binding (ctypes), used as a wake-up hint for inbox readers.

One instance per process-side store. It watches each inbox file this process reads (IN_MODIFY),
not the whole directory, so a process is woken only by writes it cares about, plus the directory
for IN_CREATE / IN_MOVED_TO so that a rotated inbox's new file is picked up. Notifications are
hints only: readers always re-read from their cursor, and a slow rescan covers lost events.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Callable

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004  # also when the link count changes: the file was deleted
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_EVENT = struct.Struct("iIII")


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        libc.inotify_init1  # noqa: B018 -- probe that the symbol exists
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


def available() -> bool:
    return _libc is not None


class Inotify:
    """Watches files and directories; `read_events()` maps events to names via callbacks."""

    def __init__(self) -> None:
        if _libc is None:
            raise OSError("inotify is not available on this system")
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd
        self._by_wd: dict[int, tuple[str, Callable[[str], None]]] = {}

    def add_watch(self, path: str, mask: int, label: str, on_event: Callable[[str], None]) -> int:
        """Watch `path`; on an event, call `on_event(label)` (or with the file name for dirs)."""
        assert _libc is not None
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        self._by_wd[wd] = (label, on_event)
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        """Stop watching `wd` (the kernel then sends IN_IGNORED for it, which is dropped)."""
        assert _libc is not None
        self._by_wd.pop(wd, None)
        _libc.inotify_rm_watch(self.fd, wd)  # fails only if the watch is already gone

    def count(self) -> int:
        """Watches held now."""
        return len(self._by_wd)

    def read_events(self, on_overflow: Callable[[], None]) -> None:
        """Drain pending events and dispatch them. Never blocks."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        pos, end, by_wd = 0, len(data), self._by_wd
        while pos < end:
            wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
            pos += 16 + length
            if mask & (IN_Q_OVERFLOW | IN_IGNORED):
                if mask & IN_Q_OVERFLOW:
                    on_overflow()
                else:
                    by_wd.pop(wd, None)
                continue
            target = by_wd.get(wd)
            if target is None:
                continue
            label, on_event = target
            if length:  # an event of a watched directory: the name of the file (NUL-padded)
                name = data[pos - length : pos].rstrip(b"\0")
                on_event(os.fsdecode(name) if name else label)
            else:  # an event of a watched file (the usual wake-up)
                on_event(label)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

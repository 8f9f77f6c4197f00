"""The file store's system calls that are not on the append/read hot paths, and its one
translation of OSError into teamrt's errors.

Everything the store creates or replaces is opened with O_NOFOLLOW (temporary files included), and
a temporary file is created with O_EXCL after unlinking any leftover (unlink removes a symlink
itself, never its target). The team directory and its subdirectories must belong to this user and
not be writable by anyone else, unless the team is explicitly shared by one group.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import stat
from pathlib import Path

from teamrt.errors import DiskFull, StoreError, UnsafeDirectory

DIR_MODE = 0o700
FILE_MODE = 0o600
SHARED_DIR_MODE = 0o2770  # setgid: files inherit the directory's group
SHARED_FILE_MODE = 0o660
O_WRITE = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
O_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def translate(exc: OSError, what: str) -> StoreError:
    """The one place OSErrors become teamrt errors (a teamrt error passes through as is)."""
    if isinstance(exc, StoreError):
        return exc
    if exc.errno in FULL_ERRNOS:
        return DiskFull(f"{what}: {os.strerror(exc.errno)}; nothing was written", errno=exc.errno)
    if exc.errno == errno.ELOOP:
        return StoreError(f"{what}: refused to follow a symbolic link", errno=exc.errno)
    if exc.errno == errno.EMFILE:
        return StoreError(
            f"{what}: {os.strerror(exc.errno)}; {_descriptor_limit()}", errno=exc.errno
        )
    return StoreError(f"{what}: {exc.strerror or exc}", errno=exc.errno or 0)


def _descriptor_limit() -> str:
    """What to do when this process may open no more files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = f"{soft:,} files open (RLIMIT_NOFILE"
    limits += ")" if hard == soft else f"; the hard limit is {hard:,})"
    return (
        f"this process may have {limits}, and each member whose inbox this process runs holds "
        "its lease open while it runs (the logs, cursors and locks of idle inboxes are given "
        "back under the descriptor budget, TEAMRT_FD_BUDGET): raise the limit (ulimit -n), or "
        "run some members in other processes"
    )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes, size: int, what: str) -> None:
    """Append `data` whole, or truncate back to `size` and raise: never leave a partial line."""
    try:
        written = os.write(fd, data)  # all of it, nearly always
        if written == len(data):
            return
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        with contextlib.suppress(OSError):  # if this fails, the next writer seals the tail
            os.ftruncate(fd, size)
        raise translate(exc, what) from None


def create_exclusive(path: Path, mode: int = FILE_MODE, *, append: bool = False) -> int:
    """A new file at `path` for writing (a leftover, or a symlink planted there, is removed
    first; the new file is never reached through a link)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags | os.O_APPEND if append else flags, mode)
    if mode != FILE_MODE:
        os.fchmod(fd, mode)  # a shared team's files must be group-writable whatever the umask
    return fd


def replace_file(path: Path, data: bytes, *, durable: bool, mode: int = FILE_MODE) -> None:
    """Write `data` to `<path>.tmp` (created exclusively, never through a link), then rename it
    over `path`."""
    tmp = path.with_name(path.name + ".tmp")
    fd = create_exclusive(tmp, mode)
    try:
        write_all(fd, data, 0, f"write {tmp}")
        os.fchmod(fd, mode)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def touch(path: Path, mode: int = FILE_MODE) -> None:
    """Create `path` if missing (never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        if mode != FILE_MODE:
            os.fchmod(fd, mode)  # a shared team's files must be group-writable
    finally:
        os.close(fd)


def check_directory(path: Path, *, shared_group: bool, follow: bool = False) -> None:
    """Refuse a directory that someone else could have prepared: it must be a real directory
    (not a symlink, unless `follow`), owned by this user and writable by nobody else; with
    `shared_group`, it may instead belong to one of this user's groups and be group-writable,
    but never writable by others."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return
    hint = (
        "create the team directory yourself (teamrt creates it 0700), or pass "
        "shared_group=True (TEAMRT_SHARED_GROUP=1) for a team shared by one group"
    )
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link; a team's directories must be real ones")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    uid = os.geteuid()
    if st.st_mode & stat.S_IWOTH:
        raise UnsafeDirectory(
            f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"anyone could plant files in it; {hint}"
        )
    if shared_group:
        groups = {os.getegid(), *os.getgroups()}
        if st.st_uid != uid and st.st_gid not in groups:
            raise UnsafeDirectory(
                f"{path} belongs to uid {st.st_uid}, group {st.st_gid}, neither of which is "
                "this user's or one of its groups"
            )
        return
    if st.st_uid != uid:
        raise UnsafeDirectory(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {uid}); {hint}"
        )
    if st.st_mode & stat.S_IWGRP:
        raise UnsafeDirectory(
            f"{path} is writable by its group (mode {stat.S_IMODE(st.st_mode):04o}); {hint}"
        )

"""Files and directories teamrt makes for its user alone, whatever the umask.

Reports, exports, eval outputs, replay pages, demo scratch files and the parents of a team
directory hold bodies and answers: each file is created 0600 and each directory 0700, and the
mode is set on the open descriptor after creating it, because the umask may have taken bits
(umask 0277 gives 0500) or left them (a file that was there already keeps its own mode until it
is changed). Directories that exist already are left as they are: they are the user's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Literal, TextIO, overload

from teamrt.errors import UsageError

DIR_MODE = 0o700
FILE_MODE = 0o600

__all__ = ["DIR_MODE", "FILE_MODE", "make_dirs", "open_private", "write_private"]


def make_dirs(path: str | os.PathLike[str], mode: int = DIR_MODE) -> Path:
    """`path` and each of its missing parents, made with `mode` (0700) whatever the umask;
    the ones that exist are left alone. Returns `path`. OSError as `os.mkdir` raises it."""
    target = _checked(path)
    missing: list[Path] = []
    current = target
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:  # made meanwhile by someone else: theirs, as it is
            continue
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return target


def _checked(path: str | os.PathLike[str]) -> Path:
    if "\x00" in os.fspath(path):
        raise UsageError(f"{os.fspath(path)!r}: a file name cannot hold a NUL character")
    return Path(path)


@overload
def open_private(path: str | os.PathLike[str], mode: Literal["w"] = "w") -> TextIO: ...
@overload
def open_private(path: str | os.PathLike[str], mode: Literal["wb"]) -> BinaryIO: ...
def open_private(path: str | os.PathLike[str], mode: Literal["w", "wb"] = "w") -> TextIO | BinaryIO:
    """`path` opened for writing (truncated), readable and writable by its owner only (0600)
    whatever the umask, and whatever mode a file already there had. Its missing parents are
    made 0700. Text is UTF-8."""
    make_dirs(_checked(path).parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        if mode == "wb":
            return os.fdopen(fd, "wb")
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write `data` to `path` as `open_private` opens it."""
    if isinstance(data, bytes):
        with open_private(path, "wb") as binary:
            binary.write(data)
    else:
        with open_private(path) as text:
            text.write(data)

"""The blobs of claim checks in a team directory: `blobs/<sha256>`, one file per content.

A blob is written whole or not at all: to a temporary file of a name no other writer uses
(`blobs/.<sha256>.<pid>.<random>.tmp`), fsynced in fsync mode, then renamed over its name (the
directory fsynced too). Two writers of one content rename identical bytes, so either wins. A
reader opens it without following links; a file of the wrong content is the reader's to refuse
(claims.py checks the digest). Blobs are never deleted while the team exists.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from teamrt.errors import UsageError
from teamrt.mail.claims import valid_digest
from teamrt.mail.filestore.fileio import FILE_MODE, O_READ, fsync_dir, translate, write_all

BLOBS = "blobs"


def blob_path(team_dir: Path, digest: str) -> Path:
    """Where the blob `digest` lives in the team directory `team_dir`."""
    if not valid_digest(digest):
        raise UsageError(f"not a blob digest (64 lowercase hex digits): {digest!r}")
    return team_dir / BLOBS / digest


def write_blob(
    team_dir: Path, digest: str, data: bytes, *, durable: bool, mode: int = FILE_MODE
) -> None:
    """Write `data` as the blob `digest` atomically (the `blobs/` directory must exist)."""
    path = blob_path(team_dir, digest)
    tmp = path.with_name(f".{digest}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    what = f"write blob {path}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            write_all(fd, data, 0, what)
            os.fchmod(fd, mode)  # whatever the umask
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise translate(exc, what) from None


def read_blob(team_dir: Path, digest: str) -> bytes | None:
    """The bytes of the blob `digest`, unverified; None if there is no such blob."""
    path = blob_path(team_dir, digest)
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, f"read blob {path}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read()
    except OSError as exc:
        raise translate(exc, f"read blob {path}") from None


def blob_digests(team_dir: Path) -> Iterator[str]:
    """The digests of the blobs in the team directory (leftover temporary files excluded)."""
    try:
        names = sorted(os.listdir(team_dir / BLOBS))
    except FileNotFoundError:
        return
    yield from (name for name in names if valid_digest(name))

"""What the file store's tests share: what an inbox holds now, and a log deleted and created
again under its inode number."""

from __future__ import annotations

from pathlib import Path

import anyio

from teamrt import Envelope, FileMailboxes


async def received_now(mail: FileMailboxes, name: str = "worker") -> list[Envelope]:
    """What member `name` can receive now, without waiting (nothing acked)."""
    inbox, out = mail.inbox(name), []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except anyio.WouldBlock:
            return out


class NotReused(Exception):
    """Another process took the freed inode number first."""


def recreate(log: Path, data: bytes) -> None:
    """Delete `log` and create it again holding `data`, with the inode number it had. ext4 gives
    a new file the lowest free number near its directory's: the freed one, unless another
    process freed a lower one meanwhile, so files are created (and kept, to use up the lower
    numbers) until one gets it, or until it is clear that another process took it."""
    ino = log.stat().st_ino
    log.unlink()
    made: list[Path] = []
    try:
        for i in range(500):
            candidate = log.with_name(f".reuse-{i}")
            candidate.write_bytes(data)
            made.append(candidate)
            if candidate.stat().st_ino == ino:
                candidate.rename(log)
                return
    finally:
        for path in made:
            path.unlink(missing_ok=True)
    raise NotReused

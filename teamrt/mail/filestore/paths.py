"""Where one inbox's files are, and which segment is the active one.

The one class that knows the layout of `inboxes/`. Rotation (see appender.py) first hard-links the
full active file as segment N and then renames a fresh file over the active name, so at every
instant `<agent>.jsonl` exists; while a rotation is in progress (or after one was killed half way)
segment N and the active file are the same inode, and that segment is still the active one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from teamrt.errors import StoreError
from teamrt.mail.filestore.framing import LineSplitter
from teamrt.mail.log import DEFAULT_MAX_LINE, Entry

READ_CHUNK = 256 << 10  # small reads keep few decoded envelopes alive (GC cost)
FIRST_READ = 64 << 10  # a reader's first read (below malloc's threshold for mapping a buffer)


def same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a, follow_symlinks=False), os.stat(b, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev)


def _read_error(path: Path, exc: OSError) -> StoreError:
    return StoreError(f"read {path}: {exc.strerror or exc}", errno=exc.errno or 0)


@dataclass(frozen=True)
class InboxPaths:
    """Where one agent's files are."""

    dir: Path
    name: str

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.jsonl"

    @property
    def next_log(self) -> Path:
        """The fresh active file while a rotation creates it (renamed over `log`)."""
        return self.dir / f"{self.name}.jsonl.next"

    @property
    def lock(self) -> Path:
        return self.dir / f"{self.name}.lock"

    @property
    def cursor(self) -> Path:
        return self.dir / f"{self.name}.cursor.json"

    @property
    def quarantine(self) -> Path:
        return self.dir / f"{self.name}.quarantine.jsonl"

    def segment(self, index: int) -> Path:
        return self.dir / f"{self.name}.{index:06d}.jsonl"

    def rotated_count(self) -> int:
        """How many segment files exist (numbered from 0 without gaps: nothing is deleted).

        Probes names in order instead of listing a directory that holds every member's files.
        """
        count = 0
        while self.segment(count).exists():
            count += 1
        return count

    def active_index(self) -> int:
        """The index of the active segment: the number of closed segments, or one less while a
        rotation is unfinished (the last segment file is then the active file itself)."""
        count = self.rotated_count()
        if count and same_file(self.segment(count - 1), self.log):
            return count - 1
        return count

    def rotated_segments(self) -> list[int]:
        """Indexes of the closed segments, oldest first."""
        return list(range(self.active_index()))

    def segments(self) -> list[Path]:
        """Every segment of the log in order, the active file last (for replay and inspect)."""
        return [self.segment(i) for i in self.rotated_segments()] + [self.log]

    def entries(
        self,
        positions: dict[str, tuple[int, int]] | None = None,
        *,
        max_line: int = DEFAULT_MAX_LINE,
        start: tuple[int, int] = (0, 0),
    ) -> Iterator[Entry]:
        """Every complete line of every segment, in file order, streamed (for tools that read
        whole logs). When it ends, the segment and offset after the last complete line are left
        in `positions[name]`."""
        for index, segment in enumerate(self.segments()):
            if index < start[0]:
                continue
            offset = start[1] if index == start[0] else 0
            splitter = LineSplitter(offset, segment=index, max_line=max_line)
            try:
                f = open(segment, "rb")  # noqa: SIM115 -- closed below, around the yields
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _read_error(segment, exc) from None
            with f:
                f.seek(offset)
                while True:
                    try:
                        chunk = f.read(READ_CHUNK)
                    except OSError as exc:
                        raise StoreError(
                            f"read {segment}: {exc.strerror}", errno=exc.errno or 0
                        ) from None
                    if not chunk:
                        break
                    yield from splitter.feed(chunk)
            if positions is not None:
                positions[self.name] = (index, splitter.position)

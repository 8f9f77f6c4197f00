"""`FileView`: a team directory read by tools, without a lock, a lease or a write.

Theory of operation. Tools read a team that may be running: writers append and rotate the
active log (see appender.py) while a scan is under way, so no listing of the segments taken
once stays true. A scan (`live_entries`) therefore walks the log one segment at a time and asks
which file is segment N only when it gets there: the segment's own name, else the active file,
kept only once it is shown to be segment N (not a later one that a rotation has put under the
active name meanwhile). Having read a file to its end, it moves on only if that file is now
sealed: it has its segment name and the active name is another file, so no writer appends to it
any more (it reads what was appended before the rotation, then goes on). Otherwise the file is
still the active one and the scan ends there. So a scan yields a dense prefix of the inbox: every
complete record from where it started to the last complete line of the active file when it got
there, and where it ended is the last record's `end`. What cannot be read as that (a segment
missing while later ones exist, a file shorter than the position a scan resumes from) raises
`StoreCorrupt` naming `teamrt repair`: never a silent hole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from teamrt.errors import StoreCorrupt, StoreError, UnknownRecipient
from teamrt.mail.filestore.blobs import read_blob
from teamrt.mail.filestore.fileio import O_READ
from teamrt.mail.filestore.framing import LineSplitter
from teamrt.mail.filestore.leases import lease_holder
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.reader import read_cursor
from teamrt.mail.filestore.roster import recorded_signing
from teamrt.mail.log import Cursor, Entry, Position
from teamrt.mail.store import TeamView
from teamrt.names import validate_name

_BACK = 64 << 10  # how far back `end` reads at a time to find the last complete line
_CHUNK = 256 << 10  # what a scan reads at a time (small reads keep few records alive)


def live_entries(paths: InboxPaths, start: Position = (0, 0)) -> Iterator[Entry]:
    """Every complete record of the inbox at `paths` from `start` on, streamed: a dense prefix
    of its log even while writers append and rotate it (see the module)."""
    index, offset = start
    while (fd := _open_segment(paths, index)) is not None:
        try:
            size = os.fstat(fd).st_size
            if size < offset:
                raise _damaged(
                    paths,
                    f"segment {index} is {size} bytes, shorter than the position {offset} read "
                    "before (it was truncated or replaced)",
                )
            splitter = LineSplitter(offset, segment=index)
            yield from _read_on(fd, splitter, paths)
            if not _sealed(paths, index, fd):
                return  # the active file: the prefix ends at its last complete line
            yield from _read_on(fd, splitter, paths)  # appended before the rotation
            leftover = splitter.flush()  # rotation seals torn tails: hand-edited files only
            if leftover is not None:
                yield leftover
        finally:
            os.close(fd)
        index, offset = index + 1, 0


def _read_on(fd: int, splitter: LineSplitter, paths: InboxPaths) -> Iterator[Entry]:
    """The complete lines from the splitter's offset to the file's end now."""
    while True:
        try:
            chunk = os.pread(fd, _CHUNK, splitter.offset)
        except OSError as exc:
            raise StoreError(
                f"read {paths.name}'s inbox: {exc.strerror}", errno=exc.errno or 0
            ) from None
        if not chunk:
            return
        yield from splitter.feed(chunk)


def _identity(path: os.PathLike[str] | str) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _sealed(paths: InboxPaths, index: int, fd: int) -> bool:
    """True if the file `fd` is segment `index` rotated away: it has the segment's name and the
    active name is another file (a rotation is finished), so nothing is appended to it now."""
    st = os.fstat(fd)
    mine = (st.st_dev, st.st_ino)
    return _identity(paths.segment(index)) == mine and _identity(paths.log) != mine


def _damaged(paths: InboxPaths, found: str) -> StoreCorrupt:
    return StoreCorrupt(
        f"{paths.name}'s inbox is damaged: {found}; a copy of it would have a hole: run "
        f"`teamrt repair {paths.dir.parent} --inbox {paths.name}`"
    )


def _open_segment(paths: InboxPaths, index: int) -> int | None:
    """A descriptor of segment `index`: its segment file, or the active file once that is shown
    to be segment `index`; None if the log has no segment `index` yet."""
    while True:
        try:
            return os.open(paths.segment(index), O_READ)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(
                f"read {paths.segment(index)}: {exc.strerror}", errno=exc.errno or 0
            ) from None
        try:
            fd = os.open(paths.log, O_READ)
        except FileNotFoundError:
            raise _damaged(paths, f"{paths.log} is missing") from None
        except OSError as exc:
            raise StoreError(f"read {paths.log}: {exc.strerror}", errno=exc.errno or 0) from None
        found = _which(paths, index, fd)
        if found is True:
            return fd
        os.close(fd)
        if found is False:
            return None
        # None: a rotation moved the active name on meanwhile; look again


def _which(paths: InboxPaths, index: int, fd: int) -> bool | None:
    """Whether the active file just opened as `fd` is segment `index` (True), an earlier one
    (False: the log has no segment `index` yet), or a later one (None)."""
    st = os.fstat(fd)
    mine = (st.st_dev, st.st_ino)
    segment = _identity(paths.segment(index))
    if segment is not None:
        return True if segment == mine else None  # rotated since we looked, maybe again
    # no segment `index`: `fd` is segment `index` or an earlier one, and it is `index` if
    # segment `index - 1` exists and is another file
    if index > 0 and _identity(paths.segment(index - 1)) in (None, mine):
        return False
    if _identity(paths.segment(index + 1)) is not None:  # a later segment, but not this one?
        if _identity(paths.segment(index)) is not None:
            return None  # two rotations meanwhile
        raise _damaged(paths, f"{paths.segment(index)} is missing, but later segments exist")
    # still the active file: no rotation finished since it was opened, so what was found of
    # the segments' names holds for it
    return True if _identity(paths.log) == mine else None


class FileView(TeamView):
    """A read-only view of the team directory `path` (see `TeamView`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = self.directory = Path(path)
        self.locator = str(self.path)
        roster = self._roster()
        self.team = str(roster.get("team") or self.path.name)

    def _roster(self) -> dict[str, Any]:
        file = self.path / "team.json"
        try:
            data = json.loads(file.read_bytes())
        except FileNotFoundError:
            if not self.path.exists():
                found = "team.json is missing: the directory does not exist"
            elif not self.path.is_dir():
                found = "it is a file, not a team directory"
            else:
                found = "team.json is missing"
            raise StoreError(f"no team at {self.path} ({found})", errno=2) from None
        except OSError as exc:
            raise StoreError(f"read {file}: {exc.strerror or exc}", errno=exc.errno or 0) from None
        except ValueError as exc:
            raise StoreError(f"unreadable team.json in {self.path}: {exc}", errno=0) from None
        if not isinstance(data, dict) or not isinstance(data.get("members"), list):
            raise StoreError(f"unreadable team.json in {self.path}: no member list", errno=0)
        return data

    def members(self) -> tuple[str, ...]:
        return tuple(str(m) for m in self._roster()["members"])

    def blob(self, digest: str) -> bytes | None:
        return read_blob(self.path, digest)

    def created_at(self) -> float | None:
        value = self._roster().get("created_at")
        return float(value) if isinstance(value, int | float) else None

    def signing(self) -> str | None:
        try:
            return recorded_signing(self._roster())
        except ValueError as exc:
            raise StoreError(f"unreadable team.json in {self.path}: {exc}", errno=0) from None

    def paths(self, name: str) -> InboxPaths:
        validate_name(name)
        return InboxPaths(self.path / "inboxes", name)

    def scan(self, name: str, after: Position | None = None) -> Iterator[Entry]:
        return live_entries(self.paths(name), after or (0, 0))

    def end(self, name: str) -> Position:
        paths = self.paths(name)
        index = paths.active_index()
        while (fd := _open_segment(paths, index)) is not None and _sealed(paths, index, fd):
            os.close(fd)  # rotated since: the active file is a later segment
            index += 1
        if fd is None:  # segment `index` is not there yet, nor is a later one
            return (index, 0)
        try:
            size = os.fstat(fd).st_size
            pos = size
            while pos > 0:  # the last complete line ends just after the last newline
                start = max(0, pos - _BACK)
                chunk = os.pread(fd, pos - start, start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    return (index, start + newline + 1)
                pos = start
            return (index, 0)
        finally:
            os.close(fd)

    def committed(self, name: str) -> Cursor:
        return read_cursor(self.paths(name).cursor)[0]

    def quarantined(self, name: str) -> Iterator[dict[str, Any]]:
        try:
            f = self.paths(name).quarantine.open("rb")
        except FileNotFoundError:
            return
        with f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    segment = record.get("segment", 0)
                    yield {
                        "at": [segment, record.get("offset", 0)],
                        "end": [segment, record.get("end", 0)],
                        "reason": record.get("reason", ""),
                        "raw": record.get("raw", ""),
                        "ts": record.get("ts"),
                    }

    def holder(self, name: str) -> str | None:
        if name not in self.members():
            raise UnknownRecipient(f"no member {name!r} in team {self.team!r}")
        return lease_holder(self.path, name)

    def sizes(self, name: str) -> dict[str, int]:
        segments = self.paths(name).segments()
        return {
            "segments": len(segments),
            "bytes": sum(p.stat().st_size for p in segments if p.exists()),
        }

"""`FileView`: a team directory read by tools, without a lock, a lease or a write."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from teamrt.errors import StoreError, UnknownRecipient
from teamrt.mail.filestore.blobs import read_blob
from teamrt.mail.filestore.fileio import O_READ
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.filestore.reader import read_cursor
from teamrt.mail.filestore.store import lease_holder, recorded_signing
from teamrt.mail.log import Cursor, Entry, Position
from teamrt.mail.store import TeamView
from teamrt.names import validate_name

_BACK = 64 << 10  # how far back `end` reads at a time to find the last complete line


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
            raise StoreError(2, f"no team at {self.path} ({found})") from None
        except OSError as exc:
            raise StoreError(exc.errno or 0, f"read {file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise StoreError(0, f"unreadable team.json in {self.path}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("members"), list):
            raise StoreError(0, f"unreadable team.json in {self.path}: no member list")
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
            raise StoreError(0, f"unreadable team.json in {self.path}: {exc}") from None

    def paths(self, name: str) -> InboxPaths:
        validate_name(name)
        return InboxPaths(self.path / "inboxes", name)

    def scan(self, name: str, after: Position | None = None) -> Iterator[Entry]:
        return self.paths(name).entries(start=after or (0, 0))

    def end(self, name: str) -> Position:
        paths = self.paths(name)
        index = paths.active_index()
        try:
            fd = os.open(paths.log, O_READ)
        except FileNotFoundError:
            return (index, 0)
        except OSError as exc:
            raise StoreError(exc.errno or 0, f"read {paths.log}: {exc.strerror}") from None
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

"""An inbox's quarantine file: the lines its owner could not read, one JSON object a line
(`<agent>.quarantine.jsonl`), appended once each.

A line is set aside at most once: the owner remembers the position of the last one it wrote
(read back from the file's tail when it opens the inbox), and a line at or before it is not
written again after a restart or a seek backwards.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from teamrt.mail.filestore.appender import TAIL_WINDOW
from teamrt.mail.filestore.fileio import O_READ, O_WRITE, translate, write_all
from teamrt.mail.log import Corrupt


def last_quarantined(path: Path) -> tuple[int, int]:
    """The (segment, offset) of the last line in the quarantine file `path`; (-1, -1) if none."""
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return (-1, -1)
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, min(size, TAIL_WINDOW), max(0, size - TAIL_WINDOW))
    finally:
        os.close(fd)
    for line in reversed(tail.split(b"\n")):
        try:
            entry = json.loads(line)
            return (int(entry["segment"]), int(entry["offset"]))
        except (ValueError, KeyError, TypeError):
            continue
    return (-1, -1)


class Quarantine:
    """The quarantine file of the inbox `name` (see the module docstring)."""

    def __init__(self, path: Path, name: str, *, mode: int) -> None:
        self.path = path
        self.name = name
        self.mode = mode
        try:
            self.upto = last_quarantined(path)
        except OSError as exc:
            raise translate(exc, f"read {path}") from None

    def add(self, item: Corrupt) -> None:
        """Set the line `item` aside, unless it already is."""
        segment, offset = item.at
        if item.at <= self.upto:
            return
        entry = {
            "segment": segment,
            "offset": offset,
            "end": item.end[1],
            "reason": item.reason,
            "ts": time.time(),
            "raw": item.raw.decode("utf-8", "backslashreplace"),
        }
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        try:
            fd = os.open(self.path, O_WRITE | os.O_CREAT, self.mode)
            try:
                write_all(fd, line, os.fstat(fd).st_size, "quarantine a line")
            finally:
                os.close(fd)
        except OSError as exc:
            raise translate(exc, f"quarantine a line of {self.name}'s inbox") from None
        self.upto = item.at

"""Task records on files: `tasks/<request id>.json`, settled by `tasks/<request id>.outcome.json`.

Each file is written whole to a temporary name, then hard-linked to its place: `link` fails if
the name exists, so the first writer wins and no reader ever sees half a record. Neither file is
changed after it is made (a record is the ask; the outcome file is its first answer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from teamrt.errors import StoreCorrupt
from teamrt.mail.filestore.fileio import create_exclusive, fsync_dir, translate, write_all
from teamrt.names import validate_name


def _create(path: Path, data: dict[str, Any], *, durable: bool, mode: int) -> bool:
    """Make `path` holding `data` unless it exists; True if this call made it."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{id(data)}.tmp")
    fd = create_exclusive(tmp, mode)
    try:
        write_all(fd, (json.dumps(data, sort_keys=True) + "\n").encode(), 0, f"write {tmp}")
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    if durable:
        fsync_dir(path.parent)
    return True


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise StoreCorrupt(f"{path}: a task record that is not a JSON object; delete it")
    return data


class TaskRecords:
    """The task records of one team directory (see the module docstring)."""

    def __init__(self, directory: Path, *, durable: bool, mode: int, dir_mode: int) -> None:
        self.directory = directory
        self.durable = durable
        self.mode = mode
        self.dir_mode = dir_mode

    def _paths(self, id_: str) -> tuple[Path, Path]:
        name = validate_name(id_)
        return self.directory / f"{name}.json", self.directory / f"{name}.outcome.json"

    def _current(self, record: Path, outcome: Path) -> dict[str, Any] | None:
        current = _read(record)
        if current is not None and (settled := _read(outcome)) is not None:
            current["outcome"] = settled
        return current

    def create(self, id_: str, data: dict[str, Any]) -> dict[str, Any]:
        record, outcome = self._paths(id_)
        try:
            if not self.directory.is_dir():
                self.directory.mkdir(mode=self.dir_mode, exist_ok=True)
                os.chmod(self.directory, self.dir_mode)  # the umask may have taken group bits
            _create(record, data, durable=self.durable, mode=self.mode)
            current = self._current(record, outcome)
        except OSError as exc:
            raise translate(exc, f"write the task record of request {id_}") from None
        assert current is not None  # made above, never removed
        return current

    def settle(self, id_: str, data: dict[str, Any]) -> dict[str, Any] | None:
        record, outcome = self._paths(id_)
        try:
            if not record.exists():
                return None
            _create(outcome, data, durable=self.durable, mode=self.mode)
            return self._current(record, outcome)
        except OSError as exc:
            raise translate(exc, f"settle the task record of request {id_}") from None

"""The team's budget ledger on files: `budget.json`, read-modified-written under `budget.lock`."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from teamrt.errors import StoreCorrupt
from teamrt.mail.filestore.fileio import O_READ, replace_file, translate


def update_ledger(
    team_dir: Path, change: Callable[[dict[str, Any] | None], dict[str, Any] | None], *, mode: int
) -> dict[str, Any] | None:
    """See `Store.ledger_update`: `change` runs under the flock of `budget.lock`."""
    try:
        lock_fd = os.open(
            team_dir / "budget.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode
        )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a model call's worth of work: brief
            current = read_ledger(team_dir)
            ledger = change(current)
            if ledger is None:
                return current
            data = (json.dumps(ledger, sort_keys=True) + "\n").encode()
            replace_file(team_dir / "budget.json", data, durable=False, mode=mode)
            return ledger
        finally:
            os.close(lock_fd)
    except OSError as exc:
        raise translate(exc, "update the team's budget ledger") from None


def read_ledger(team_dir: Path) -> dict[str, Any] | None:
    """The ledger as written last, or None if there is none."""
    path = team_dir / "budget.json"
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, "read the team's budget ledger") from None
    try:
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    try:
        ledger = json.loads(raw)
    except ValueError:
        raise StoreCorrupt(
            f"{path}: the budget ledger is not JSON; delete it to start a new one (the next "
            "team start does)"
        ) from None
    return ledger if isinstance(ledger, dict) else None

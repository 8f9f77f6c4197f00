"""The roster of a team directory, `team.json`, read and checked with no store object.

It fixes the team's segment size, envelope limit and whether it is signed (with its key's
fingerprint), so that every process agrees on them; `FileStore` changes it under an flock on
`team.lock` and replaces it by rename.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teamrt.errors import StoreError, TeamKeyMismatch, UsageError
from teamrt.mail.filestore.fileio import O_READ, translate
from teamrt.names import validate_name

ROSTER_FORMAT = 1
DEFAULT_SEGMENT_BYTES = 64 << 20


@dataclass(frozen=True)
class Roster:
    """What team.json says, checked: its members, the team's limits and signing."""

    members: tuple[str, ...]
    segment_bytes: int
    max_envelope: int
    signing: str | None
    data: dict[str, Any]


def recorded_signing(roster: dict[str, Any]) -> str | None:
    """team.json's `signed` and `key_fingerprint` as `Store.signing` (None: not recorded)."""
    signed, recorded = roster.get("signed"), roster.get("key_fingerprint")
    if signed is None:
        return None
    if signed is False:
        return ""
    if signed is not True or not isinstance(recorded, str) or not recorded:
        raise ValueError(
            "'signed' must be true or false, and a signed team's key_fingerprint a string"
        )
    return recorded


def read_roster(path: Path) -> tuple[int, bytes] | None:
    """team.json's modification time (ns) and bytes; None if there is none."""
    try:
        fd = os.open(path, O_READ)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, f"read {path}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            return os.fstat(f.fileno()).st_mtime_ns, f.read()
    except OSError as exc:
        raise translate(exc, f"read {path}") from None


def parse_roster(path: Path, raw: bytes, *, max_envelope: int) -> Roster:
    """The roster read from `path`; `max_envelope` where it records none."""
    try:
        data = json.loads(raw)
        return Roster(
            members=tuple(validate_name(m) for m in data["members"]),
            segment_bytes=int(data.get("segment_bytes", DEFAULT_SEGMENT_BYTES)),
            max_envelope=int(data.get("max_envelope", max_envelope)),
            signing=recorded_signing(data),
            data=dict(data),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"unreadable roster {path}: {exc}", errno=0) from None


def new_roster(
    team: str, *, segment_bytes: int, max_envelope: int, signing: str | None
) -> dict[str, object]:
    """The roster of a team created now, with no members yet."""
    data: dict[str, object] = {
        "format": ROSTER_FORMAT,
        "team": team,
        "created_at": time.time(),
        "segment_bytes": segment_bytes,
        "max_envelope": max_envelope,
    }
    if signing is not None:
        data["signed"] = bool(signing)
        if signing:
            data["key_fingerprint"] = signing
    data["members"] = []
    return data


def check_not_renamed(path: Path, roster: Roster, signing: str) -> None:
    """A team directory `path` renamed under its team (`mv t u`): every envelope in it names the
    team it was created as, so its owners would quarantine all of them as `wrong team`, and
    a signed team's fingerprint and signatures cover that name, so no key opens it under
    this one. Say so, rather than that the key is another or nothing at all."""
    created_as, team = roster.data.get("team"), path.name
    if not isinstance(created_as, str) or created_as == team:
        return
    moved = (
        f"team directory {path} holds team {created_as!r} (team.json), renamed to "
        f"{team!r}: a team directory's name is its team"
    )
    back = f"Move it back to {path.parent / created_as}"
    if roster.signing and roster.signing != signing:
        raise TeamKeyMismatch(
            f"{moved}, and a signed team's key fingerprint and signatures cover that name, so "
            f"no key opens it under this one. {back}"
        )
    raise UsageError(
        f"{moved}, and every envelope in it names {created_as!r}, so its owners would "
        f"quarantine them all as 'wrong team'. {back}, or copy it under the new name with "
        f"`teamrt export {path.parent / created_as} NEW_DIR`"
    )

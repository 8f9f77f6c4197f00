"""Agent and team names: the only strings teamrt turns into file names.

A name is 1-64 characters of ASCII letters, digits, `_` and `-`, starting with a letter or digit.
That rules out path separators, `.` and `..`, hidden files, NUL bytes, look-alike Unicode and
names that collide with the store's own suffixes (`.lock`, `.cursor.json`, segment numbers).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

from teamrt.errors import InvalidName

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)

#: A validated agent or team name, for use in pydantic models.
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]

_name_match = re.compile(NAME_PATTERN.removeprefix("^").removesuffix("$")).fullmatch
#: Names seen valid, up to a bound: names repeat (a team has a few members), so a hot path
#: tests `name in valid_names or is_name(name)` (a set lookup, the pattern only the first time).
valid_names: set[str] = set()
_VALID_NAMES_KEPT = 4096


def is_name(name: str) -> bool:
    """True if the string `name` is a valid name (as `Name` and `validate_name` say); a valid
    one is remembered in `valid_names`."""
    if _name_match(name) is None:
        return False
    if len(valid_names) >= _VALID_NAMES_KEPT:
        valid_names.clear()
    valid_names.add(name)
    return True


def validate_name(name: object, *, what: str = "agent name") -> str:
    """Return `name` unchanged if it is a safe name, else raise `InvalidName` saying why."""
    if not isinstance(name, str):
        raise InvalidName(f"{what} must be a string, got {type(name).__name__}")
    if _NAME_RE.fullmatch(name) is None:
        raise InvalidName(
            f"invalid {what} {name!r}: use 1-64 ASCII letters, digits, '_' or '-', "
            "starting with a letter or digit (no '/', '.', spaces or other characters)"
        )
    return name

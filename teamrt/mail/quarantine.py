"""The records an inbox will not deliver, on their way to its store's quarantine.

A record that does not decode, names another team or recipient, is not signed with the team
key (in a signed team), or is a claim check whose blob is missing or damaged is skipped by the
cursor and recorded with the store (`InboxReader.quarantine`) before the commit of the cursor
that passes it.

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

from teamrt.codec import EnvelopeFields
from teamrt.mail.log import Corrupt
from teamrt.mail.store import InboxReader

log = logging.getLogger("teamrt.mail")


class Quarantine:
    """What member `name`'s inbox (of team `team`) skipped and has not recorded yet."""

    __slots__ = ("_name", "_team", "_waiting", "count")

    def __init__(self, name: str, team: str) -> None:
        self._name = name
        self._team = team
        self._waiting: list[Corrupt] = []  # recorded before the next cursor commit
        self.count = 0  # quarantined since the inbox opened

    def add(self, item: Corrupt) -> None:
        """Skip `item`: logged now, recorded at the next `record`."""
        log.warning("%s's inbox: the record at %s quarantined: %s", self._name, item.at,
                    item.reason)  # fmt: skip
        self._waiting.append(item)
        self.count += 1

    def clear(self) -> None:
        """Forget what is not recorded yet (the inbox reads again from its committed cursor)."""
        self._waiting.clear()

    async def record(
        self,
        reader: InboxReader,
        riding_out: Callable[[Callable[[], Awaitable[None]], str], Awaitable[None]],
    ) -> None:
        """Record, in order, what was skipped with `reader`'s store (each call made through
        `riding_out`); one recorded is not recorded again if a later one fails."""
        waiting = self._waiting
        while waiting:
            await riding_out(
                partial(reader.quarantine, waiting[0]),
                f"quarantine a record of {self._name}'s inbox",
            )
            del waiting[0]

    def misfiled(self, envelope: EnvelopeFields) -> str:
        """Why `envelope`, which decoded, is not this inbox's to deliver."""
        if envelope.team != self._team:
            return f"wrong team: {envelope.team!r} in the inbox of {self._name} of {self._team!r}"
        if envelope.recipient != self._name and envelope.recipient != "*":
            return f"wrong recipient: {envelope.recipient!r} in the inbox of {self._name}"
        return "bad signature"

"""Watching the workers for chatter: rounds of mail among them with no new check result.

A teammate that is not on a task reads the mail that wakes it in a round (`MemberStatus.rounds`),
and tells the lead what came of it in its idle notice. Two workers passing a subtask back and
forth by message show as rounds that grow while no check result changes. `MailWatch` counts them
from the last sign of progress and, past the cap, says who talked and what they said; the
conductor decides what to do about it. It only reads the team's public status and notices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from teamrt.team import IDLE, IdleBody, Team

SAID_LINES = 6  # what the talkers said, newest last


@dataclass(frozen=True)
class Chatter:
    """Workers that traded too much mail: why that is a brake, who, and what they said."""

    why: str
    talkers: frozenset[str]
    said: tuple[str, ...]


class MailWatch:
    def __init__(self, team: Team, workers: Sequence[str], cap: int) -> None:
        self.team, self.workers, self.cap = team, list(workers), cap
        self._rounds_at: dict[str, int] = {}
        self.progress()

    def progress(self) -> None:
        """A new check result (or a human's word): count rounds of mail afresh from here."""
        self._rounds_at = {w: s.rounds for w, s in self.team.status.items()}

    def seen(self) -> Chatter | None:
        """Chatter past the cap since the last progress (then the count starts again), or None."""
        grown = {
            w: self.team.status[w].rounds - self._rounds_at.get(w, 0)
            for w in self.workers
            if w in self.team.status
        }
        rounds = sum(grown.values())
        if rounds < self.cap:
            return None
        self.progress()
        talkers = frozenset(w for w, n in grown.items() if n > 0)
        why = f"workers traded {rounds} rounds of mail ({', '.join(sorted(talkers))})"
        return Chatter(why, talkers, self._said(talkers))

    def _said(self, talkers: frozenset[str]) -> tuple[str, ...]:
        out = []
        for envelope in list(self.team.notices)[-50:]:
            if envelope.type != IDLE or envelope.sender not in talkers:
                continue
            last = envelope.payload(IdleBody).last
            if last is not None and last.answer:
                out.append(f"{envelope.sender} said: {last.answer}")
        return tuple(out[-SAID_LINES:])
